package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// exactLayersScript is the Composite's script with the exact path forced.
var exactLayersScript = redis.NewScript(layersSource("fast = function() return nil end"))

// firstField is the part of a key before its first space: a customer in
// "customer route".
func firstField(k string) string { return strings.SplitN(k, " ", 2)[0] }

// TestCompositeSameDecisionsAsInProcess runs one trace against the Redis
// Composite and the in-process ratelimit.Composite of the same layers (of
// every algorithm, enforced or shadow, keyed globally, per customer or per
// whole key), on one ManualClock, and requires the same Decisions, field
// for field, and the same shadow reports; and again on a third Composite
// whose layers all decide on the exact path. Peeks, refunds, settlements
// (into debt, past its bound, or refunding) and resets among the checks
// must give the same Decisions and amounts too.
func TestCompositeSameDecisionsAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	keyFns := []func(string) string{func(string) string { return "all" }, firstField, nil}
	var allowed, denied, failed atomic.Int64
	defer func() {
		t.Logf("%d admitted, %d refused, %d errors, compared", allowed.Load(), denied.Load(), failed.Load())
	}()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3).Draw(t, "layers")
		var gotReports, wantReports []ratelimit.ShadowReport
		local := make([]ratelimit.Layer, n)
		remote := make([]Layer, n)
		for i := range n {
			rule := drawRule(t)
			keyFn := keyFns[rapid.IntRange(0, 2).Draw(t, "key")]
			shadow := rapid.IntRange(0, 3).Draw(t, "shadow") == 0
			local[i] = ratelimit.Layer{Rule: rule, Key: keyFn, Shadow: shadow,
				OnShadow: func(r ratelimit.ShadowReport) { wantReports = append(wantReports, r) }}
			remote[i] = Layer{Layer: ratelimit.Layer{Rule: rule, Key: keyFn, Shadow: shadow,
				OnShadow: func(r ratelimit.ShadowReport) { gotReports = append(gotReports, r) }}}
		}
		start := rapid.SampledFrom([]time.Duration{0, 1, unixNow, ratelimit.MaxTime - year}).Draw(t, "start")
		clk := ratelimit.NewManualClock(start)
		want, err := ratelimit.Compose(local, ratelimit.WithClock(clk))
		require.NoError(t, err)
		got, err := NewComposite(rdb, remote, WithClock(clk), WithPrefix(testPrefix()), WithHashTag(firstField),
			WithExpiryMargin(time.Hour), WithTimeout(5*time.Second))
		require.NoError(t, err)
		exact, err := NewComposite(rdb, remote, WithClock(clk), WithPrefix(testPrefix()), WithHashTag(firstField),
			WithExpiryMargin(time.Hour), WithTimeout(5*time.Second))
		require.NoError(t, err)
		exact.script = exactLayersScript
		capacity := ratelimit.Units(1 << 62)
		for _, l := range local {
			m, _ := ratelimit.NewMachine(l.Rule)
			capacity = min(capacity, m.Params().Capacity)
		}
		var ats []time.Duration
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			clk.Advance(rapid.SampledFrom([]time.Duration{0, 0, 1, time.Millisecond, time.Second, time.Hour, year}).Draw(t, "advance"))
			key := rapid.SampledFrom([]string{"x 1", "x 2", "y 1"}).Draw(t, "key")
			cost := drawCost(t, capacity)
			if rapid.IntRange(0, 9).Draw(t, "over") == 0 {
				cost = capacity + 1 // above some layer's capacity
			}
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				w, werr := want.Peek(key, cost)
				g, gerr := got.Peek(key, cost)
				if werr != nil || gerr != nil {
					require.Error(t, werr)
					require.EqualError(t, gerr, werr.Error())
				}
				if w != g {
					t.Fatalf("peek %d at %d, key %q, cost %d:\n in-process %+v\n redis      %+v", step, clk.Now(), key, cost, w, g)
				}
				continue
			case 1:
				at := clk.Now()
				if len(ats) > 0 {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				}
				w, werr := want.Refund(key, cost, at)
				g, gerr := got.Refund(key, cost, at)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				if w != g {
					t.Fatalf("refund %d at %d, key %q, cost %d admitted at %d: in-process %d, redis %d", step, clk.Now(), key, cost, at, w, g)
				}
				// The exact path's keys are another composite's: refund
				// there too, to keep them alike.
				e, eerr := exact.Refund(key, cost, at)
				require.NoError(t, eerr)
				require.Equal(t, w, e)
				continue
			case 2:
				want.Reset(key)
				require.NoError(t, got.Reset(key))
				require.NoError(t, exact.Reset(key))
				continue
			case 3:
				at := clk.Now()
				if len(ats) > 0 {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				}
				actual := drawActual(t, cost, capacity)
				w, wx, werr := want.Settle(key, cost, actual, at)
				g, gx, gerr := got.Settle(key, cost, actual, at)
				e, ex, eerr := exact.Settle(key, cost, actual, at)
				if werr != nil || gerr != nil || eerr != nil {
					require.Error(t, werr)
					require.EqualError(t, gerr, werr.Error())
					require.EqualError(t, eerr, werr.Error())
				}
				if w != g || wx != gx {
					t.Fatalf("settle %d at %d, key %q, %d as %d admitted at %d:\n in-process %+v settled %d\n redis      %+v settled %d", step, clk.Now(), key, cost, actual, at, w, wx, g, gx)
				}
				require.Equal(t, w, e)
				require.Equal(t, wx, ex)
				continue
			}
			wantReports, gotReports = wantReports[:0], gotReports[:0]
			w, werr := want.Check(key, cost)
			g, gerr, cached := checkCounted(got, key, cost)
			if werr != nil || gerr != nil {
				require.Error(t, werr)
				require.EqualError(t, gerr, werr.Error())
			}
			switch {
			case werr != nil:
				failed.Add(1)
			case w.Allowed:
				allowed.Add(1)
			default:
				denied.Add(1)
			}
			sameOrCached(t, w, g, cached, "check %d at %d, key %q, cost %d: redis", step, clk.Now(), key, cost)
			if w.Allowed {
				ats = append(ats, w.At)
			}
			gotReports = gotReports[:0]
			e, eerr, cached := checkCounted(exact, key, cost)
			if werr != nil || eerr != nil {
				require.EqualError(t, eerr, werr.Error())
			}
			sameOrCached(t, w, e, cached, "check %d at %d, key %q, cost %d: exact path", step, clk.Now(), key, cost)
			require.Equal(t, len(wantReports), len(gotReports))
			for i := range wantReports {
				require.Equal(t, wantReports[i].Key, gotReports[i].Key)
				require.Equal(t, wantReports[i].Decision, gotReports[i].Decision)
				require.Equal(t, wantReports[i].Err == nil, gotReports[i].Err == nil)
			}
		}
	})
}

// checkCounted checks cost for key on c and says whether its deny cache
// answered.
func checkCounted(c *Composite, key string, cost ratelimit.Units) (ratelimit.Decision, error, bool) {
	before := c.Stats().LocalDenials
	d, err := c.Check(key, cost)
	return d, err, c.Stats().LocalDenials > before
}

// sameOrCached requires got to be want, or, if the deny cache answered,
// a refusal that want allows (see requireCachedCompositeRefusal).
func sameOrCached(t *rapid.T, want, got ratelimit.Decision, cached bool, msgAndArgs ...any) {
	t.Helper()
	if cached {
		requireCachedCompositeRefusal(t, want, got, msgAndArgs...)
		return
	}
	if want != got {
		t.Fatalf("%s:\n in-process %+v\n redis      %+v", fmt.Sprintf(msgAndArgs[0].(string), msgAndArgs[1:]...), want, got)
	}
}

// TestCompositeConcurrentNoPartialSpend sends 1,000 requests over 50 keys
// from 16 goroutines on 4 clients, on the server's clock, to a global
// limit of 100 and a per-key limit of 3: exactly 100 are admitted, no key
// more than 3, and the global layer has spent exactly what was admitted,
// so no refusal by a per-key layer spent from it.
func TestCompositeConcurrentNoPartialSpend(t *testing.T) {
	needRedis(t)
	clients := make([]*redis.Client, 4)
	for i := range clients {
		clients[i] = shared.Client(nil)
		defer clients[i].Close()
	}
	slow := ratelimit.Every(year)
	for _, rule := range hundredRules() {
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		t.Run(m.Params().Algorithm, func(t *testing.T) {
			layers := []Layer{
				{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: slow, Burst: 3, Name: "per-key"}}},
				{Layer: ratelimit.Layer{Rule: rule, Key: func(string) string { return "all" }}, Global: true},
			}
			prefix := testPrefix()
			comps := make([]*Composite, len(clients))
			for i, c := range clients {
				comps[i], err = NewComposite(c, layers, WithPrefix(prefix), WithTimeout(10*time.Second))
				require.NoError(t, err)
			}
			var admitted atomic.Int64
			perKey := make([]atomic.Int64, 50)
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := comps[g%len(comps)]
					for r := g; r < 1000; r += 16 {
						k := r % 50
						d, err := c.CheckContext(context.Background(), "k"+string(rune('A'+k)), ratelimit.Unit)
						if !assert.NoError(t, err) {
							return
						}
						if d.Allowed {
							admitted.Add(1)
							perKey[k].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.Equal(t, int64(100), admitted.Load())
			for k := range perKey {
				require.LessOrEqual(t, perKey[k].Load(), int64(3), "key %d", k)
			}
			// The global layer is spent by exactly the 100 admissions: a
			// fresh limiter of its rule spent 100 times refuses the next
			// unit as the Redis global layer does, with the same Decision.
			d, err := comps[0].Check("fresh", ratelimit.Unit)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, m.Params().Policy, d.Policy)
		})
	}
}

// TestCompositeRefusedSpendsNothing: a request the per-key layer refuses
// leaves the global layer's state as it was.
func TestCompositeRefusedSpendsNothing(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	c, err := NewComposite(rdb, []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour, Name: "global"}, Key: func(string) string { return "all" }}, Global: true},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "per-key"}}},
	}, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	d, err := c.Check("a", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	before, err := rdb.Get(context.Background(), c.Key(0, "a")).Result()
	require.NoError(t, err)
	clk.Advance(time.Second)
	d, err = c.Check("a", ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, "per-key", d.Policy)
	require.Equal(t, int64(0), d.Remaining)
	after, err := rdb.Get(context.Background(), c.Key(0, "a")).Result()
	require.NoError(t, err)
	require.Equal(t, before, after)
	// A corrupted layer refuses, writing nothing.
	require.NoError(t, rdb.Set(context.Background(), c.Key(1, "b"), "junk", 0).Err())
	d, err = c.Check("b", ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	require.ErrorIs(t, err, ratelimit.ErrDegraded, "a corrupted state's refusal is the Decision to act on")
	require.False(t, d.Allowed)
	after, err = rdb.Get(context.Background(), c.Key(0, "b")).Result()
	require.NoError(t, err)
	require.Equal(t, before, after)
	// So does a state whose latest instant is beyond MaxTime, which would
	// otherwise become every layer's instant.
	for _, junk := range []string{"9223372036854775807 0 0", "99999999999999999999 0 0", "0123 0 0"} {
		require.NoError(t, rdb.Set(context.Background(), c.Key(1, "c"), junk, 0).Err())
		d, err = c.Check("c", ratelimit.Unit)
		require.ErrorIs(t, err, ratelimit.ErrInvalidState, junk)
		require.False(t, d.Allowed)
		after, err = rdb.Get(context.Background(), c.Key(0, "c")).Result()
		require.NoError(t, err)
		require.Equal(t, before, after)
	}
}

// TestCompositeClusterLayout: on a Cluster client a Global layer beside
// another is refused, naming both and the fix; layers sharing the
// request's tag are built, as is any layout on a single-node client.
func TestCompositeClusterLayout(t *testing.T) {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	global := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100, Name: "global"}, Key: func(string) string { return "all" }}, Global: true}
	customer := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10, Name: "customer"}, Key: firstField}}
	route := Layer{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 5, Window: time.Second, Name: "route"}}}

	_, err := NewComposite(cluster, []Layer{global, customer})
	require.ErrorIs(t, err, ErrCrossSlot)
	require.ErrorContains(t, err, "layer 0 (global) is Global")
	require.ErrorContains(t, err, "layer 1's (customer)")
	require.ErrorContains(t, err, "WithHashTag")

	_, err = NewComposite(cluster, []Layer{global})
	require.NoError(t, err)
	c, err := NewComposite(cluster, []Layer{customer, route}, WithHashTag(firstField))
	require.NoError(t, err)
	require.Equal(t, c.Key(0, "acme /a")[strings.IndexByte(c.Key(0, "acme /a"), '{'):], c.Key(1, "acme /a")[strings.IndexByte(c.Key(1, "acme /a"), '{'):])
	// Without the tag the layers' keys are in different slots: refused
	// per request, before any call.
	c, err = NewComposite(cluster, []Layer{customer, route})
	require.NoError(t, err)
	_, err = c.Check("acme /a", ratelimit.Unit)
	require.ErrorIs(t, err, ErrCrossSlot)

	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	_, err = NewComposite(single, []Layer{global, customer, route})
	require.NoError(t, err)
}

// recorder keeps every outcome an Observer is told of.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) Decided(d ratelimit.Decision, cost ratelimit.Units, o ratelimit.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%v %d %+v", o, cost, d))
}
func (r *recorder) Waited(string, ratelimit.WaitEvent, time.Duration) {}
func (r *recorder) Evicted(string, uint64, bool)                      {}
func (r *recorder) Failed(p string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, "failed "+p)
}

// TestCompositeObserver: the observer is told what the in-process
// Composite's is, shadow refusals included, and of failures.
func TestCompositeObserver(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	layers := []ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Hour, Name: "enforced"}},
		{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 1, Name: "shadow"}, Shadow: true},
	}
	var want, got recorder
	in, err := ratelimit.Compose(layers, ratelimit.WithClock(clk), ratelimit.WithObserver(&want))
	require.NoError(t, err)
	remote := []Layer{{Layer: layers[0]}, {Layer: layers[1]}}
	c, err := NewComposite(rdb, remote, WithClock(clk), WithPrefix(testPrefix()), WithObserver(&got))
	require.NoError(t, err)
	for range 5 {
		_, _ = in.Check("k", ratelimit.Unit)
		_, err := c.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		clk.Advance(time.Second)
	}
	require.Equal(t, want.got, got.got)
	require.Contains(t, strings.Join(got.got, "\n"), "shadow")

	gone := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer gone.Close()
	var failed recorder
	c, err = NewComposite(gone, remote, WithObserver(&failed))
	require.NoError(t, err)
	_, err = c.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, ratelimit.ErrDegraded)
	require.Equal(t, []string{"failed enforced"}, failed.got)
}

// TestCompositeRaisesNowToTheLatestLayer: a process whose clock runs behind
// a state another process wrote decides every layer at that state's
// latest instant, as the in-process Composite would (each layer clamps to
// the one instant of them all): one layer's key is shared by every
// request (a global limit) and was last written 10 s ahead, the other's is
// fresh.
func TestCompositeRaisesNowToTheLatestLayer(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}, Key: func(string) string { return "all" }}},
		{Layer: ratelimit.Layer{Rule: ratelimit.SlidingCounter{Limit: 3, Window: time.Second}}},
	}
	prefix := testPrefix()
	ahead := ratelimit.NewManualClock(unixNow + 10*time.Second)
	behind := ratelimit.NewManualClock(unixNow)
	a, err := NewComposite(rdb, layers, WithClock(ahead), WithPrefix(prefix))
	require.NoError(t, err)
	b, err := NewComposite(rdb, layers, WithClock(behind), WithPrefix(prefix))
	require.NoError(t, err)
	d, err := a.Check("x", ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, unixNow+10*time.Second, d.At)

	lm, err := ratelimit.NewLayeredMachine([]ratelimit.Layer{layers[0].Layer, layers[1].Layer})
	require.NoError(t, err)
	for i := range 4 {
		states := make([][]byte, 2)
		for l := range states {
			v, err := rdb.Get(ctx, b.Key(l, "y")).Result()
			if err == nil {
				states[l] = []byte(v)
			}
		}
		want, _, _, err := lm.Step(states, behind.Now(), ratelimit.Unit, true)
		require.NoError(t, err)
		got, err := b.Check("y", ratelimit.Unit)
		require.NoError(t, err, "check %d", i)
		assert.Equal(t, want, got, "check %d", i)
		assert.Equal(t, unixNow+10*time.Second, got.At, "check %d: not raised to the shared layer's instant", i)
		st, err := rdb.Get(ctx, b.Key(1, "y")).Result()
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(st, strconv.FormatInt(int64(unixNow+10*time.Second), 10)+" "), "check %d: layer 1 written at %q", i, st)
	}
}
