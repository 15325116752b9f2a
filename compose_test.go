package ratelimit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// Composites are checked against independent reference models, one per
// layer and layer key, composed by the rules the Composite documents: a
// request is admitted iff every enforced layer's model admits it, and only
// then does any model spend.

var _ ratelimit.KeyedLimiter = (*ratelimit.Composite)(nil)

// Request keys are "apikey route"; layers derive their keys from them.
var (
	apiKeys = []string{"k1", "k2", "k3"}
	routes  = []string{"/quote", "/labels", "/login"}
)

// layerKeyFns are the ways a layer derives its key: one global key, the API
// key, or the whole "apikey route" key (a nil Key).
var layerKeyFns = []struct {
	name string
	fn   func(string) string
}{
	{"global", func(string) string { return "global" }},
	{"per-key", func(k string) string { key, _, _ := strings.Cut(k, " "); return key }},
	{"per-key-route", nil},
}

// layerCase is a drawn layer.
type layerCase struct {
	limitCase
	keyName string
	keyFn   func(string) string
	shadow  bool
}

func (l layerCase) keyOf(reqKey string) string {
	if l.keyFn == nil {
		return reqKey
	}
	return l.keyFn(reqKey)
}

// drawLayers draws one to four layers, the first of the given kind (any
// kind if ""), each with a key function, some in shadow mode if shadows.
func drawLayers(t *rapid.T, first string, shadows bool) []layerCase {
	n := rapid.IntRange(1, 4).Draw(t, "layers")
	layers := make([]layerCase, n)
	for i := range layers {
		kind := first
		if i > 0 || kind == "" {
			kind = rapid.SampledFrom(testedAlgorithms).Draw(t, "kind").name
		}
		kf := rapid.IntRange(0, len(layerKeyFns)-1).Draw(t, "keyFn")
		layers[i] = layerCase{
			limitCase: drawLimitCase(t, testedAlgorithmNamed(kind)),
			keyName:   layerKeyFns[kf].name,
			keyFn:     layerKeyFns[kf].fn,
			shadow:    shadows && rapid.IntRange(0, 3).Draw(t, "shadow") == 0,
		}
	}
	return layers
}

// shadowLog collects the reports of every shadow layer, with the layer.
type shadowLog struct {
	mu  sync.Mutex
	got []layerReport
}

type layerReport struct {
	layer int
	rep   ratelimit.ShadowReport
}

func (s *shadowLog) take() []layerReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.got
	s.got = nil
	return got
}

// compose builds the composite for layers on clk, reporting shadow layers
// to log if it is not nil.
func compose(t require.TestingT, layers []layerCase, clk ratelimit.Clock, log *shadowLog) *ratelimit.Composite {
	ls := make([]ratelimit.Layer, len(layers))
	for i, l := range layers {
		ls[i] = ratelimit.Layer{Rule: l.rule, Key: l.keyFn, Shadow: l.shadow}
		if log != nil {
			ls[i].OnShadow = func(r ratelimit.ShadowReport) {
				log.mu.Lock()
				log.got = append(log.got, layerReport{i, r})
				log.mu.Unlock()
			}
		}
	}
	c, err := ratelimit.Compose(ls, ratelimit.WithClock(clk), ratelimit.WithMaxKeys(1000))
	require.NoError(t, err)
	return c
}

// book holds, for every layer and layer key, the admissions its model has
// seen, so that it can look at a decision without making it.
type book struct {
	layers []layerCase
	hist   []map[string][]admission
}

func newBook(layers []layerCase) *book {
	b := &book{layers: layers, hist: make([]map[string][]admission, len(layers))}
	for i := range b.hist {
		b.hist[i] = map[string][]admission{}
	}
	return b
}

func (b *book) peek(i int, key string, now, cost int64) ratelimit.Decision {
	l := b.layers[i]
	return l.want(replayModel(l.newModel, b.hist[i][key]).Step(now, cost))
}

// expected is what a composite must answer, and what it must spend.
type expected struct {
	d       ratelimit.Decision
	err     error
	spend   []bool // per layer
	reports []layerReport
}

// expect composes the layers' models as the Composite documents.
func (b *book) expect(reqKey string, now, cost int64) expected {
	var e expected
	enforced := 0
	for _, l := range b.layers {
		if !l.shadow {
			enforced++
			if cost > l.capMilli {
				e.err = &ratelimit.CostError{Cost: ratelimit.Units(cost), Capacity: ratelimit.Units(l.capMilli), Policy: l.name}
				e.d = ratelimit.Decision{Limit: l.capMilli / 1000, Policy: l.name, Window: l.window}
				return e
			}
		}
	}
	ds := make([]ratelimit.Decision, len(b.layers))
	errs := make([]error, len(b.layers))
	admitted := true
	for i, l := range b.layers {
		if cost > l.capMilli {
			errs[i] = &ratelimit.CostError{Cost: ratelimit.Units(cost), Capacity: ratelimit.Units(l.capMilli), Policy: l.name}
			ds[i] = ratelimit.Decision{Limit: l.capMilli / 1000, Policy: l.name, Window: l.window}
			continue
		}
		ds[i] = b.peek(i, l.keyOf(reqKey), now, cost)
		if !l.shadow && !ds[i].Allowed {
			admitted = false
		}
	}
	view := enforced > 0
	pick, denied := -1, false
	var delay time.Duration
	for i, l := range b.layers {
		if errs[i] != nil || l.shadow == view {
			continue
		}
		delay = max(delay, ds[i].Delay)
		switch {
		case !ds[i].Allowed && (!denied || ds[i].RetryAfter > ds[pick].RetryAfter):
			pick, denied = i, true
		case ds[i].Allowed && !denied && (pick < 0 || ds[i].Remaining < ds[pick].Remaining):
			pick = i
		}
	}
	if pick < 0 {
		e.d = ds[0]
	} else {
		e.d = ds[pick]
		if !denied {
			e.d.Delay = delay
		}
	}
	if view && denied {
		// Remaining is the largest cost the composite as a whole would
		// admit now: the least of the enforced layers' Remaining before
		// this request (a look at a layer's whole capacity is admitted
		// only by a fresh key, else denied with that Remaining).
		rem := int64(-1)
		for i, l := range b.layers {
			if errs[i] != nil || l.shadow {
				continue
			}
			full := b.peek(i, l.keyOf(reqKey), now, l.capMilli)
			r := full.Remaining
			if full.Allowed {
				r = full.Limit
			}
			if rem < 0 || r < rem {
				rem = r
			}
		}
		e.d.Remaining = rem
	}
	e.spend = make([]bool, len(b.layers))
	shadowDenies := false
	for i, l := range b.layers {
		e.spend[i] = admitted && errs[i] == nil && (!l.shadow || ds[i].Allowed)
		if l.shadow {
			shadowDenies = shadowDenies || errs[i] != nil || !ds[i].Allowed
			e.reports = append(e.reports, layerReport{i, ratelimit.ShadowReport{Key: l.keyOf(reqKey), Decision: ds[i], Err: errs[i]}})
		}
	}
	if !view {
		e.d = asShadow(e.d)
		e.d.Shadowed = e.d.Shadowed || shadowDenies
	} else if e.d.Allowed && shadowDenies {
		e.d.Shadowed = true
	}
	return e
}

func (b *book) spend(e expected, reqKey string, now, cost int64) {
	for i, l := range b.layers {
		if e.spend[i] {
			k := l.keyOf(reqKey)
			b.hist[i][k] = append(b.hist[i][k], admission{now, cost})
		}
	}
}

// drawRequest draws a request key and a cost up to the largest capacity
// plus two units.
func drawRequest(t *rapid.T, layers []layerCase) (string, ratelimit.Units) {
	// Half the traffic goes to one hot key, which every layer then sees, so
	// that layers deny together often.
	key := "k1 /quote"
	if rapid.Bool().Draw(t, "cold") {
		key = rapid.SampledFrom(apiKeys).Draw(t, "apiKey") + " " + rapid.SampledFrom(routes).Draw(t, "route")
	}
	capMilli := int64(0)
	for _, l := range layers {
		capMilli = max(capMilli, l.capMilli)
	}
	return key, drawCostWithin(t, capMilli+2000, "cost")
}

// drawGap draws a clock advance on the scale of one of the layers.
func drawGap(t *rapid.T, layers []layerCase) time.Duration {
	scale := rapid.SampledFrom(layers).Draw(t, "scaleOf").scale
	return time.Duration(rapid.OneOf(
		rapid.Just(int64(0)),
		rapid.Int64Range(0, 3),
		rapid.Int64Range(0, int64(scale)/4),
		rapid.Int64Range(0, 2*int64(scale)),
	).Draw(t, "gap"))
}

// TestCompositeMatchesModels checks every Decision, every error and every
// shadow report of a composite against the composed models, one request at
// a time.
func TestCompositeMatchesModels(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		layers := drawLayers(t, "", true)
		clk := ratelimit.NewManualClock(0)
		var log shadowLog
		c := compose(t, layers, clk, &log)
		b := newBook(layers)
		for i, n := 0, rapid.IntRange(1, 50).Draw(t, "requests"); i < n; i++ {
			clk.Advance(drawGap(t, layers))
			key, cost := drawRequest(t, layers)
			now := int64(clk.Now())
			want := b.expect(key, now, int64(cost))
			got, err := c.Check(key, cost)
			require.Equal(t, want.err, err, "request %d: %q cost %d", i, key, cost)
			require.Equal(t, want.d, got, "request %d: %q cost %d at %d", i, key, cost, now)
			if err != nil {
				require.Empty(t, log.take())
				continue
			}
			require.Equal(t, want.reports, log.take())
			b.spend(want, key, now, int64(cost))
		}
	})
}

// TestCompositeConcurrentNoPartialSpend sends random traffic from many
// goroutines at once through layered limits. Afterwards, for every layer
// and every key, the admissions it saw, replayed on its model, must all be
// admitted (no admitted request broke any layer's model), and the layer's
// state must be exactly the model's after them (it spent exactly the cost
// of the requests the composite admitted, and nothing for those it
// denied).
func TestCompositeConcurrentNoPartialSpend(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { concurrentTraffic(t, a.name) })
		})
	}
}

type sent struct {
	key  string
	cost ratelimit.Units
	at   int64
	d    ratelimit.Decision
	err  error
}

func concurrentTraffic(t *rapid.T, kind string) {
	layers := drawLayers(t, kind, false)
	clk := ratelimit.NewManualClock(0)
	c := compose(t, layers, clk, nil)
	var all []*sent
	for p, phases := 0, rapid.IntRange(1, 4).Draw(t, "phases"); p < phases; p++ {
		clk.Advance(drawGap(t, layers))
		now := int64(clk.Now())
		workers := make([][]*sent, rapid.IntRange(2, 8).Draw(t, "goroutines"))
		for w := range workers {
			for r, n := 0, rapid.IntRange(1, 8).Draw(t, "requests"); r < n; r++ {
				key, cost := drawRequest(t, layers)
				s := &sent{key: key, cost: cost, at: now}
				workers[w] = append(workers[w], s)
				all = append(all, s)
			}
		}
		var start, done sync.WaitGroup
		start.Add(1)
		for _, reqs := range workers {
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				for _, s := range reqs {
					s.d, s.err = c.Check(s.key, s.cost)
				}
			}()
		}
		start.Done()
		waitGroup(t, &done, "the concurrent checks to finish")
	}

	b := newBook(layers)
	for _, s := range all {
		if s.err != nil {
			require.ErrorIs(t, s.err, ratelimit.ErrCostExceedsCapacity)
			continue
		}
		if !s.d.Allowed {
			require.Positive(t, s.d.RetryAfter, "a denial says when to come back")
			continue
		}
		for i, l := range layers {
			k := l.keyOf(s.key)
			b.hist[i][k] = append(b.hist[i][k], admission{s.at, int64(s.cost)})
		}
	}
	for i, l := range layers {
		for k, hist := range b.hist[i] {
			m := l.newModel()
			for j, a := range hist {
				d := m.Step(a.at, a.cost)
				require.True(t, d.Allowed, "layer %d (%s, %s) key %q: admission %d of cost %d at %d breaks its model",
					i, l.kind, l.keyName, k, j, a.cost, a.at)
			}
		}
	}
	// Every layer's state is its model's: probe each key once.
	clk.Advance(drawGap(t, layers))
	now := int64(clk.Now())
	for i, l := range layers {
		probed := map[string]bool{}
		for _, apiKey := range apiKeys {
			for _, route := range routes {
				k := l.keyOf(apiKey + " " + route)
				if probed[k] {
					continue
				}
				probed[k] = true
				cost := drawCostWithin(t, l.capMilli, "probe")
				got, err := ratelimit.LayerCheck(c, i, k, cost)
				require.NoError(t, err)
				require.Equal(t, b.peek(i, k, now, int64(cost)), got, "layer %d (%s) key %q", i, l.kind, k)
			}
		}
	}
}

// keyedSystem is a keyed limiter under test with a way to look at one of
// its layers directly: a Composite, or a Store as a composite of one layer.
type keyedSystem struct {
	check func(key string, cost ratelimit.Units) (ratelimit.Decision, error)
	wait  func(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error)
	probe func(layer int, key string, cost ratelimit.Units) (ratelimit.Decision, error)
}

func drawKeyedSystem(t *rapid.T, store bool, clk *ratelimit.ManualClock) ([]layerCase, keyedSystem) {
	if store {
		lc := drawLimitCase(t, rapid.SampledFrom(testedAlgorithms).Draw(t, "kind"))
		s, err := ratelimit.NewStore(lc.rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return []layerCase{{limitCase: lc, keyName: "per-key-route"}}, keyedSystem{
			check: s.Check,
			wait:  s.Wait,
			probe: func(_ int, key string, cost ratelimit.Units) (ratelimit.Decision, error) { return s.Check(key, cost) },
		}
	}
	layers := drawLayers(t, "", true)
	c := compose(t, layers, clk, nil)
	return layers, keyedSystem{
		check: c.Check,
		wait:  c.Wait,
		probe: func(i int, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
			return ratelimit.LayerCheck(c, i, key, cost)
		},
	}
}

// probeAll checks that every layer's state for the layer keys of reqKey is
// the book's, probing each once.
func probeAll(t *rapid.T, sys keyedSystem, b *book, reqKey string, now int64) {
	for i, l := range b.layers {
		k := l.keyOf(reqKey)
		cost := drawCostWithin(t, l.capMilli, "probe")
		got, err := sys.probe(i, k, cost)
		require.NoError(t, err)
		require.Equal(t, b.peek(i, k, now, int64(cost)), got, "layer %d (%s) key %q", i, l.kind, k)
	}
}

// keyedHistory sends random checks through sys and the book.
func keyedHistory(t *rapid.T, sys keyedSystem, b *book, clk *ratelimit.ManualClock) {
	for i, n := 0, rapid.IntRange(0, 12).Draw(t, "history"); i < n; i++ {
		clk.Advance(drawGap(t, b.layers))
		key, cost := drawRequest(t, b.layers)
		now := int64(clk.Now())
		want := b.expect(key, now, int64(cost))
		got, err := sys.check(key, cost)
		require.Equal(t, want.err, err)
		require.Equal(t, want.d, got)
		if err == nil {
			b.spend(want, key, now, int64(cost))
		}
	}
}

// TestKeyedWaitAdmitsAtTheEarliestInstant checks Wait on stores and
// composites: the waiter wakes when the longest RetryAfter of the layers
// has passed, then (for leaky buckets) when its Delay has, and returns the
// composed Decision of that instant, having spent exactly that.
func TestKeyedWaitAdmitsAtTheEarliestInstant(t *testing.T) {
	for name, store := range map[string]bool{"Store": true, "Composite": false} {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				clk := ratelimit.NewManualClock(0)
				layers, sys := drawKeyedSystem(t, store, clk)
				b := newBook(layers)
				keyedHistory(t, sys, b, clk)
				key, cost := drawRequest(t, layers)
				t0 := int64(clk.Now())
				first := b.expect(key, t0, int64(cost))
				if first.err != nil {
					_, err := sys.wait(context.Background(), key, cost)
					require.ErrorIs(t, err, first.err)
					return
				}
				admitAt := t0
				if !first.d.Allowed {
					admitAt += int64(first.d.RetryAfter)
				}
				want := b.expect(key, admitAt, int64(cost))
				require.True(t, want.d.Allowed, "the models do not admit it after the longest RetryAfter")
				goOn := admitAt + int64(want.d.Delay)

				res := make(chan waitResult, 1)
				go func() {
					d, err := sys.wait(context.Background(), key, cost)
					res <- waitResult{d, err, clk.Now()}
				}()
				var wakes []time.Duration
				var r *waitResult
				for r == nil {
					var at time.Duration
					at, r = nextWake(t, clk, res)
					if r == nil {
						wakes = append(wakes, at)
						require.LessOrEqual(t, len(wakes), 2, "woke more than twice: %v", wakes)
						clk.Set(at)
					}
				}
				require.NoError(t, r.err)
				require.Equal(t, want.d, r.d)
				require.Equal(t, time.Duration(goOn), r.at)
				switch {
				case goOn == t0:
					require.Empty(t, wakes)
				case admitAt == t0 || admitAt == goOn:
					require.Equal(t, []time.Duration{time.Duration(goOn)}, wakes)
				default: // a leaky bucket layer: retry, then the queue's Delay
					require.Equal(t, []time.Duration{time.Duration(admitAt), time.Duration(goOn)}, wakes)
				}
				b.spend(want, key, admitAt, int64(cost))
				probeAll(t, sys, b, key, int64(clk.Now()))
			})
		})
	}
}

// TestKeyedWaitCancelledSpendsNothing cancels a waiter while it sleeps
// after a denial: no layer may have spent anything.
func TestKeyedWaitCancelledSpendsNothing(t *testing.T) {
	for name, store := range map[string]bool{"Store": true, "Composite": false} {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				clk := ratelimit.NewManualClock(0)
				layers, sys := drawKeyedSystem(t, store, clk)
				b := newBook(layers)
				keyedHistory(t, sys, b, clk)
				key, _ := drawRequest(t, layers)
				// The whole capacity of the smallest enforced layer, sent
				// until it is denied: once or twice.
				cost := ratelimit.Units(0)
				for _, l := range layers {
					if !l.shadow && (cost == 0 || l.capMilli < int64(cost)) {
						cost = ratelimit.Units(l.capMilli)
					}
				}
				if cost == 0 {
					t.Skip("only shadow layers: nothing is ever denied")
				}
				now := int64(clk.Now())
				first := b.expect(key, now, int64(cost))
				for tries := 0; first.err == nil && first.d.Allowed && tries < 3; tries++ {
					got, err := sys.check(key, cost)
					require.NoError(t, err)
					require.Equal(t, first.d, got)
					b.spend(first, key, now, int64(cost))
					first = b.expect(key, now, int64(cost))
				}
				if first.err != nil || first.d.Allowed {
					t.Skip("never denied: a cost error, or only shadow layers")
				}
				ctx, cancel := context.WithCancel(context.Background())
				res := make(chan waitResult, 1)
				go func() {
					d, err := sys.wait(ctx, key, cost)
					res <- waitResult{d, err, clk.Now()}
				}()
				at, done := nextWake(t, clk, res)
				require.Nil(t, done)
				clk.Set(time.Duration(rapid.Int64Range(int64(clk.Now()), int64(at)-1).Draw(t, "cancelAt")))
				cancel()
				r := receive(t, res, "the waiter to return")
				require.ErrorIs(t, r.err, context.Canceled)
				require.False(t, r.d.Allowed)
				probeAll(t, sys, b, key, int64(clk.Now()))
			})
		})
	}
}

func TestComposeErrors(t *testing.T) {
	good := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}
	for name, tc := range map[string]struct {
		layers []ratelimit.Layer
		opts   []ratelimit.Option
		is     error
		msg    string
	}{
		"no layers":    {nil, nil, ratelimit.ErrInvalidRule, "layers is empty"},
		"nil rule":     {[]ratelimit.Layer{{Rule: good}, {}}, nil, ratelimit.ErrInvalidRule, "layers[1].Rule is nil"},
		"bad rule":     {[]ratelimit.Layer{{Rule: good}, {Rule: ratelimit.SlidingLog{Limit: 5}}}, nil, ratelimit.ErrInvalidRule, "layer 1: ratelimit: invalid SlidingLog: Window"},
		"bad option":   {[]ratelimit.Layer{{Rule: good}}, []ratelimit.Option{ratelimit.WithMaxKeys(0)}, ratelimit.ErrInvalidOption, "layer 0"},
		"layer option": {[]ratelimit.Layer{{Rule: good}, {Rule: good, Options: []ratelimit.Option{ratelimit.WithShards(-1)}}}, nil, ratelimit.ErrInvalidOption, "layer 1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ratelimit.Compose(tc.layers, tc.opts...)
			require.ErrorIs(t, err, tc.is)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// apiLayers is a global cap, a per-key plan and a per-key-and-route limit.
func apiLayers() []ratelimit.Layer {
	return []ratelimit.Layer{
		{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 100, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(60), Burst: 10, Name: "plan"}, Key: func(k string) string { key, _, _ := strings.Cut(k, " "); return key }},
		{Rule: ratelimit.SlidingLog{Limit: 3, Window: time.Minute, Name: "expensive-route"}},
	}
}

func TestCompositeExample(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose(apiLayers(), ratelimit.WithClock(clk))
	require.NoError(t, err)
	// The route allows 3 a minute: the 4th is refused by it, and spends
	// nothing from the plan or the global cap.
	for i := range 4 {
		d, err := c.Check("k1 /labels", ratelimit.Unit)
		require.NoError(t, err)
		if i < 3 {
			assert.True(t, d.Allowed)
			continue
		}
		assert.False(t, d.Allowed)
		assert.Equal(t, "expensive-route", d.Policy)
		assert.Equal(t, time.Minute, d.RetryAfter)
		assert.Equal(t, int64(0), d.Remaining)
	}
	// The plan has 10 - 3 = 7 left: the same key on other routes gets
	// exactly 7 more, and the plan is what limits when it runs out.
	for i := range 8 {
		d, err := c.Check(fmt.Sprintf("k1 /r%d", i), ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, i < 7, d.Allowed, "request %d", i)
		if i == 6 {
			assert.Equal(t, "plan", d.Policy, "the least Remaining describes an admission")
			assert.Equal(t, int64(0), d.Remaining)
		}
		if i == 7 {
			assert.Equal(t, "plan", d.Policy)
			assert.Equal(t, time.Second, d.RetryAfter)
		}
	}
	// The global cap has spent 10 of 100, nothing for the two denials.
	stats := c.Stats()
	require.Len(t, stats, 3)
	assert.Equal(t, 1, stats[0].Keys)
	d, err := ratelimit.LayerCheck(c, 0, "", 90*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(0), d.Remaining)
	// A cost above an enforced layer's capacity is an error naming it.
	d, err = c.Check("k2 /quote", 11*ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	assert.Equal(t, "plan", d.Policy)
	_, err = c.Check("k2 /quote", 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
}

func TestCompositeShadowLayer(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	var got []ratelimit.ShadowReport
	layers := []ratelimit.Layer{
		{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "free"}},
		{Rule: ratelimit.SlidingLog{Limit: 2, Window: time.Minute, Name: "new-login-limit"}, Shadow: true,
			Key:      func(k string) string { return "ip:" + k },
			OnShadow: func(r ratelimit.ShadowReport) { got = append(got, r) }},
	}
	c, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for i := range 3 {
		d, err := c.Check("10.0.0.1", ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, "free", d.Policy, "the enforced layer describes the request")
		assert.Equal(t, i == 2, d.Shadowed, "request %d", i)
	}
	require.Len(t, got, 3)
	assert.Equal(t, "ip:10.0.0.1", got[2].Key)
	assert.False(t, got[2].Decision.Allowed)
	assert.Equal(t, "new-login-limit", got[2].Decision.Policy)
	assert.Equal(t, time.Minute, got[2].Decision.RetryAfter)
	// A cost the shadow layer could never admit is reported, not refused.
	d, err := c.Check("10.0.0.2", 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.Shadowed)
	require.ErrorIs(t, got[3].Err, ratelimit.ErrCostExceedsCapacity)
}

func TestCompositeAllShadow(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 2, Name: "q"}, Shadow: true},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for i := range 3 {
		d, err := c.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, ratelimit.Decision{Allowed: true, Shadowed: i == 2, Limit: 2, Remaining: int64(1 - min(i, 1)), ResetAfter: time.Duration(min(i+1, 2)) * time.Second, Policy: "q", Window: 2 * time.Second}, d, "request %d", i)
	}
	// Wait never waits on a shadow layer, even with a deadline (one that
	// a loaded machine cannot reach first: a Wait that waited on the
	// manual clock would hang, and bounded fail).
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	d, err := bounded(t, "a Wait on a composite whose only limit is a shadow", func() (ratelimit.Decision, error) {
		return c.Wait(ctx, "k", ratelimit.Unit)
	})
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.Shadowed)
}

func TestCompositeChecksDoNotAllocate(t *testing.T) {
	c, err := ratelimit.Compose(apiLayers(), ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	_, _ = c.Check("k1 /quote", ratelimit.Unit)
	allocs := testing.AllocsPerRun(200, func() { _, _ = c.Check("k1 /quote", ratelimit.Unit) })
	assert.Zero(t, allocs)
}

// TestCompositeSharedKeysUnderContention runs many goroutines through
// layers that share keys in every combination, with the race detector:
// no deadlock, and the global layer's count is exact.
func TestCompositeSharedKeysUnderContention(t *testing.T) {
	layers := []ratelimit.Layer{
		{Rule: ratelimit.SlidingCounter{Limit: 300, Window: time.Hour, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.FixedWindow{Limit: 50, Window: time.Hour, Name: "plan"}, Key: func(k string) string { key, _, _ := strings.Cut(k, " "); return key }},
		{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 20, Name: "route"}},
	}
	c, err := ratelimit.Compose(layers, ratelimit.WithClock(ratelimit.NewManualClock(0)), ratelimit.WithShards(2))
	require.NoError(t, err)
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				key := fmt.Sprintf("k%d /r%d", (g+i)%8, i%4)
				d, err := c.Check(key, ratelimit.Unit)
				assert.NoError(t, err)
				if d.Allowed {
					mu.Lock()
					admitted[key]++
					mu.Unlock()
				}
			}
		}()
	}
	waitGroup(t, &wg, "the concurrent checks to finish")
	total, perKey := 0, map[string]int{}
	for k, n := range admitted {
		assert.LessOrEqual(t, n, 20, "route %q", k)
		key, _, _ := strings.Cut(k, " ")
		perKey[key] += n
		total += n
	}
	for k, n := range perKey {
		assert.LessOrEqual(t, n, 50, "plan %q", k)
	}
	assert.LessOrEqual(t, total, 300)
	// Every key has 4 routes of 20 and a plan of 50: 8 x 50 = 400 > 300,
	// so the global cap binds, exactly.
	assert.Equal(t, 300, total)
}

// TestCompositeWaitDeadline checks that a composite Wait gives up at once
// when the longest RetryAfter plus the Delay a leaky bucket layer would
// then give the request does not fit before the deadline.
func TestCompositeWaitDeadline(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour, Name: "hourly"}},
		{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerMinute(1), Capacity: 2, Name: "queue"}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for range 2 {
		d, err := c.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	// The queue is full: admitted in 1 min, then queued behind the second
	// request for another minute. 90 s are not enough; 3 min are.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d, err := bounded(t, "a Wait that cannot meet its deadline", func() (ratelimit.Decision, error) {
		return c.Wait(ctx, "k", ratelimit.Unit)
	})
	require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
	assert.Equal(t, "queue", d.Policy)
	assert.Equal(t, time.Minute, d.RetryAfter)
	assert.Zero(t, clk.Sleepers())

	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res := make(chan waitResult, 1)
	go func() {
		d, err := c.Wait(ctx, "k", ratelimit.Unit)
		res <- waitResult{d, err, clk.Now()}
	}()
	for _, want := range []time.Duration{time.Minute, 2 * time.Minute} {
		at, done := nextWake(t, clk, res)
		require.Nil(t, done)
		require.Equal(t, want, at)
		clk.Set(at)
	}
	r := receive(t, res, "the waiter to return")
	require.NoError(t, r.err)
	assert.Equal(t, time.Minute, r.d.Delay)
}

// TestCompositeOneInstant moves the clock backwards between two checks:
// every layer of the second one must decide at the latest instant any of
// its shards has seen, not at the earlier clock reading, even in a shard
// that has not seen that instant itself.
func TestCompositeOneInstant(t *testing.T) {
	clk := ratelimit.NewManualClock(100 * time.Second)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 1000, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Minute, Name: "per-key"}, Options: []ratelimit.Option{ratelimit.WithShards(64)}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	_, err = c.Check("x", ratelimit.Unit) // the global key's shard is at 100 s
	require.NoError(t, err)
	clk.Set(50 * time.Second)
	for i := range 20 {
		// Most of these keys are in shards of the per-key layer that have
		// seen no time at all; all must decide at 100 s, in the window
		// [60 s, 120 s), which ends 20 s later.
		d, err := c.Check(fmt.Sprintf("y%d", i), ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		assert.Equal(t, "per-key", d.Policy)
		assert.Equal(t, 20*time.Second, d.ResetAfter, "key y%d", i)
	}
}

// BenchmarkComposite measures a Check through the three layers of
// apiLayers (a global key, 1,000 API keys, 4,000 key-route pairs), against
// one store with the per-key-route layer's rule on the same keys, on the
// system clock, serial and from every core.
func BenchmarkComposite(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d /r%d", i%1000, i%4)
	}
	// Limits high enough that the traffic is mostly admitted.
	layers := []ratelimit.Layer{
		{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1e12), Burst: 1e12, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1e9), Burst: 1e6, Name: "plan"}, Key: func(k string) string { key, _, _ := strings.Cut(k, " "); return key }},
		{Rule: ratelimit.SlidingCounter{Limit: 1e12, Window: time.Minute, Name: "route"}},
	}
	c, err := ratelimit.Compose(layers)
	require.NoError(b, err)
	store, err := ratelimit.NewStore(layers[2].Rule)
	require.NoError(b, err)
	for name, check := range map[string]func(string, ratelimit.Units) (ratelimit.Decision, error){
		"layers=3":     c.Check,
		"layers=1":     store.Check,
		"layers=1/key": func(k string, cost ratelimit.Units) (ratelimit.Decision, error) { return store.Check(k, cost) },
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, _ = check(keys[i&4095], ratelimit.Unit)
				i++
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					_, _ = check(keys[i&4095], ratelimit.Unit)
					i += 7
				}
			})
		})
	}
}

// TestCompositeInsertionMarkCleared: a composite's checks, adding keys
// to every layer from several goroutines with evictions, leave no layer's
// shard marked as held by an insertion past a hold that adds no key (a
// mark left set would make every later wait for that shard spin).
func TestCompositeInsertionMarkCleared(t *testing.T) {
	c, err := ratelimit.Compose(apiLayers(), ratelimit.WithMaxKeys(600), ratelimit.WithShards(2))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				if _, err := c.Check("k"+strconv.Itoa((i*4+g)%2000)+" /r"+strconv.Itoa(i%7), ratelimit.Unit); err != nil {
					panic(err)
				}
			}
		}()
	}
	wg.Wait()
	for i := range 3 {
		clearMarks(t, func(k string) error { _, err := ratelimit.LayerCheck(c, i, k, ratelimit.Unit); return err })
		require.False(t, ratelimit.LayerSpinning(c, i), "layer %d", i)
	}
}
