package ratelimit_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// outcomeKey labels a count of decisions, as a metric would.
type outcomeKey struct {
	policy  string
	outcome ratelimit.Outcome
}

// waitRecord is one Waited call.
type waitRecord struct {
	policy string
	event  ratelimit.WaitEvent
	waited time.Duration
}

// recorder is an Observer that keeps everything it is told.
type recorder struct {
	mu        sync.Mutex
	decisions map[outcomeKey]int
	costs     map[outcomeKey]ratelimit.Units
	last      ratelimit.Decision // the latest Decided's Decision
	waits     []waitRecord
	evicted   map[string]uint64 // by policy
	lossy     map[string]uint64
	failures  []error
}

func newRecorder() *recorder {
	return &recorder{
		decisions: map[outcomeKey]int{}, costs: map[outcomeKey]ratelimit.Units{},
		evicted: map[string]uint64{}, lossy: map[string]uint64{},
	}
}

func (r *recorder) Decided(d ratelimit.Decision, cost ratelimit.Units, o ratelimit.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := outcomeKey{d.Policy, o}
	r.decisions[k]++
	r.costs[k] += cost
	r.last = d
}

func (r *recorder) Waited(policy string, e ratelimit.WaitEvent, waited time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits = append(r.waits, waitRecord{policy, e, waited})
}

func (r *recorder) Evicted(policy string, n uint64, lossy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lossy {
		r.lossy[policy] += n
	}
	r.evicted[policy] += n
}

func (r *recorder) Failed(policy string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, err)
}

func (r *recorder) counts() map[outcomeKey]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[outcomeKey]int{}
	for k, v := range r.decisions {
		m[k] = v
	}
	return m
}

// outcomeOf is the outcome a caller sees in a Decision from an enforcing
// limiter (a shadow-refused one is labelled by the shadow limit, which the
// caller's Decision does not name: tests of shadows count those apart).
func outcomeOf(d ratelimit.Decision) ratelimit.Outcome {
	switch {
	case !d.Allowed:
		return ratelimit.OutcomeRefused
	case d.Shadowed:
		return ratelimit.OutcomeShadowRefused
	}
	return ratelimit.OutcomeAllowed
}

// TestObserverCountsTheSpecVector: the token bucket vector, 10/s burst 20,
// seen by an observer: 25 at 0 (20 allowed, 5 refused), 8 at 0.5 s (5 and
// 3), 1 at 2.5 s (allowed); a cost error is no decision.
func TestObserverCountsTheSpecVector(t *testing.T) {
	rule := ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}
	build := map[string]func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error){
		"New": func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error) {
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return lim.Check
		},
		"New/locked": func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error) {
			// A rule on the mutex path.
			lim, err := ratelimit.New(ratelimit.SlidingLog{Limit: 20, Window: time.Hour, Name: "api"}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return lim.Check
		},
		"Store": func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error) {
			s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return func(c ratelimit.Units) (ratelimit.Decision, error) { return s.Check("k", c) }
		},
		"Composite": func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error) {
			c, err := ratelimit.Compose([]ratelimit.Layer{
				{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000, Name: "global"}, Key: func(string) string { return "" }},
				{Rule: rule},
			}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return func(u ratelimit.Units) (ratelimit.Decision, error) { return c.Check("k", u) }
		},
		"Plans": func(clk ratelimit.Clock, obs ratelimit.Observer) func(ratelimit.Units) (ratelimit.Decision, error) {
			r := rule
			r.Name = "" // the plan's name labels it
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"api": {Rule: r}}, Default: "api"},
				nil, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return func(u ratelimit.Units) (ratelimit.Decision, error) { return p.Check("k", u) }
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			obs := newRecorder()
			check := b(clk, obs)
			for range 25 {
				_, err := check(ratelimit.Unit)
				require.NoError(t, err)
			}
			_, err := check(0)
			require.Error(t, err)
			_, err = check(21 * ratelimit.Unit)
			require.Error(t, err)
			if name == "New/locked" {
				// The sliding log refills nothing within the hour.
				assert.Equal(t, map[outcomeKey]int{{"api", ratelimit.OutcomeAllowed}: 20, {"api", ratelimit.OutcomeRefused}: 5}, obs.counts())
				return
			}
			clk.Set(500 * time.Millisecond)
			for range 8 {
				_, err := check(ratelimit.Unit)
				require.NoError(t, err)
			}
			clk.Set(2500 * time.Millisecond)
			_, err = check(ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, map[outcomeKey]int{
				{"api", ratelimit.OutcomeAllowed}: 26,
				{"api", ratelimit.OutcomeRefused}: 8,
			}, obs.counts())
			assert.Equal(t, int64(19), obs.last.Remaining, "the Decision is the caller's")
			assert.Empty(t, obs.failures)
		})
	}
}

// TestObserverMatchesEveryDecision: a random trace of checks of random
// costs, on random keys, with random steps of time, through every kind of
// limiter: the observer's counts by policy and outcome are those of the
// Decisions the caller got, and so are the costs.
func TestObserverMatchesEveryDecision(t *testing.T) {
	type subject struct {
		name  string
		build func(clk ratelimit.Clock, obs ratelimit.Observer) func(key string, c ratelimit.Units) (ratelimit.Decision, error)
	}
	keyed := func(lim ratelimit.KeyedLimiter) func(string, ratelimit.Units) (ratelimit.Decision, error) {
		return lim.Check
	}
	subjects := []subject{
		{"Store/leaky", func(clk ratelimit.Clock, obs ratelimit.Observer) func(string, ratelimit.Units) (ratelimit.Decision, error) {
			s, err := ratelimit.NewStore(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 4, Name: "leaky"},
				ratelimit.WithClock(clk), ratelimit.WithObserver(obs), ratelimit.WithMaxKeys(3), ratelimit.WithShards(1))
			require.NoError(t, err)
			return keyed(s)
		}},
		{"Store/CheckWithin", func(clk ratelimit.Clock, obs ratelimit.Observer) func(string, ratelimit.Units) (ratelimit.Decision, error) {
			s, err := ratelimit.NewStore(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 4, Name: "leaky"},
				ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return func(k string, c ratelimit.Units) (ratelimit.Decision, error) {
				return s.CheckWithin(k, c, 300*time.Millisecond)
			}
		}},
		{"Composite", func(clk ratelimit.Clock, obs ratelimit.Observer) func(string, ratelimit.Units) (ratelimit.Decision, error) {
			c, err := ratelimit.Compose([]ratelimit.Layer{
				{Rule: ratelimit.FixedWindow{Limit: 8, Window: time.Second, Name: "global"}, Key: func(string) string { return "" }},
				{Rule: ratelimit.SlidingCounter{Limit: 3, Window: time.Second, Name: "per-key"}},
			}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return keyed(c)
		}},
		{"Composite/CheckContext", func(clk ratelimit.Clock, obs ratelimit.Observer) func(string, ratelimit.Units) (ratelimit.Decision, error) {
			c, err := ratelimit.Compose([]ratelimit.Layer{
				{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 4, Name: "per-key"}},
			}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return func(k string, u ratelimit.Units) (ratelimit.Decision, error) {
				return c.CheckContext(context.Background(), k, u)
			}
		}},
		{"Plans", func(clk ratelimit.Clock, obs ratelimit.Observer) func(string, ratelimit.Units) (ratelimit.Decision, error) {
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
				"free": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(2), Burst: 2}},
				"pro":  {Rule: ratelimit.SlidingLog{Limit: 5, Window: time.Second, Name: "pro-log"}},
			}, Default: "free"}, func(k string) string {
				if k == "a" {
					return "pro"
				}
				return "free"
			}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return keyed(p)
		}},
	}
	for _, s := range subjects {
		t.Run(s.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(s.name))))
			clk := ratelimit.NewManualClock(0)
			obs := newRecorder()
			check := s.build(clk, obs)
			want := map[outcomeKey]int{}
			wantCost := map[outcomeKey]ratelimit.Units{}
			for range 2000 {
				if rng.IntN(4) == 0 {
					clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
				}
				key := string(rune('a' + rng.IntN(5)))
				cost := ratelimit.Unit/2 + ratelimit.Units(rng.IntN(2))*ratelimit.Unit
				d, err := check(key, cost)
				require.NoError(t, err)
				k := outcomeKey{d.Policy, outcomeOf(d)}
				want[k]++
				wantCost[k] += cost
			}
			assert.Equal(t, want, obs.counts())
			assert.Equal(t, wantCost, obs.costs)
			assert.Len(t, want, len(obs.decisions))
			assert.Empty(t, obs.failures)
		})
	}
}

// TestObserverShadowRefused: a request that only a shadow limit would
// refuse is shadow_refused, labelled with the shadow limit's policy, from
// Shadow, ShadowKeyed, a shadow layer and a composite of shadow layers
// alone; the limit watched spends as if it enforced.
func TestObserverShadowRefused(t *testing.T) {
	strict := ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 2, Name: "strict"}
	loose := ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 100, Name: "loose"}
	allowed := func(p string) outcomeKey { return outcomeKey{p, ratelimit.OutcomeAllowed} }
	shadowRefused := func(p string) outcomeKey { return outcomeKey{p, ratelimit.OutcomeShadowRefused} }

	t.Run("Shadow", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(strict, ratelimit.WithClock(clk))
		require.NoError(t, err)
		obs := newRecorder()
		sh := ratelimit.Shadow(lim, nil, ratelimit.WithObserver(obs))
		for range 5 {
			d, err := sh.Check(ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
		}
		d, err := sh.Check(3 * ratelimit.Unit) // above the capacity: admitted, shadow-refused
		require.NoError(t, err)
		assert.True(t, d.Shadowed)
		assert.Equal(t, map[outcomeKey]int{allowed("strict"): 2, shadowRefused("strict"): 4}, obs.counts())
		assert.False(t, obs.last.Allowed, "the shadow's own answer")
	})
	t.Run("ShadowKeyed", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		s, err := ratelimit.NewStore(strict, ratelimit.WithClock(clk))
		require.NoError(t, err)
		obs := newRecorder()
		sh := ratelimit.ShadowKeyed(s, nil, ratelimit.WithObserver(obs))
		for _, k := range []string{"a", "a", "a", "b", "a"} {
			_, err := sh.Check(k, ratelimit.Unit)
			require.NoError(t, err)
		}
		cc := sh.(ratelimit.ContextChecker)
		_, err = cc.CheckContext(context.Background(), "b", ratelimit.Unit)
		require.NoError(t, err)
		_, err = cc.CheckContext(context.Background(), "b", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, map[outcomeKey]int{allowed("strict"): 4, shadowRefused("strict"): 3}, obs.counts())
	})
	t.Run("shadow layer", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		obs := newRecorder()
		c, err := ratelimit.Compose([]ratelimit.Layer{
			{Rule: loose, Key: func(string) string { return "" }},
			{Rule: strict, Shadow: true},
		}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
		require.NoError(t, err)
		for _, k := range []string{"a", "a", "a", "b", "a", "b", "b"} {
			d, err := c.Check(k, ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
		}
		d, err := c.Check("c", 3*ratelimit.Unit) // above the shadow layer's capacity
		require.NoError(t, err)
		assert.True(t, d.Shadowed)
		assert.Equal(t, map[outcomeKey]int{allowed("loose"): 4, shadowRefused("strict"): 4}, obs.counts())
	})
	t.Run("only shadow layers", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		obs := newRecorder()
		c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: strict, Shadow: true}}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
		require.NoError(t, err)
		for range 3 {
			_, err := c.Check("a", ratelimit.Unit)
			require.NoError(t, err)
		}
		assert.Equal(t, map[outcomeKey]int{allowed("strict"): 2, shadowRefused("strict"): 1}, obs.counts())
	})
	t.Run("Plans shadow layer", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		obs := newRecorder()
		unnamed := strict
		unnamed.Name = ""
		p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
			"trial": {Layers: []ratelimit.Layer{{Rule: loose}, {Rule: unnamed, Shadow: true}}},
		}, Default: "trial"}, nil, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
		require.NoError(t, err)
		for range 3 {
			_, err := p.Check("a", ratelimit.Unit)
			require.NoError(t, err)
		}
		assert.Equal(t, map[outcomeKey]int{allowed("loose"): 2, shadowRefused("trial"): 1}, obs.counts())
	})
}

// TestObserverWaits: a Wait is started, then admitted or abandoned, with
// the time it waited on the limiter's clock, and one decision; a Wait
// admitted at once waited 0.
func TestObserverWaits(t *testing.T) {
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1, Name: "slow"}
	type waiter interface {
		Wait(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error)
	}
	keyedWait := func(w interface {
		Wait(context.Context, string, ratelimit.Units) (ratelimit.Decision, error)
	}) waiter {
		return waitFunc(func(ctx context.Context, c ratelimit.Units) (ratelimit.Decision, error) { return w.Wait(ctx, "k", c) })
	}
	build := map[string]func(clk ratelimit.Clock, obs ratelimit.Observer) waiter{
		"New": func(clk ratelimit.Clock, obs ratelimit.Observer) waiter {
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return lim
		},
		"New/locked": func(clk ratelimit.Clock, obs ratelimit.Observer) waiter {
			lim, err := ratelimit.New(ratelimit.FixedWindow{Limit: 1, Window: time.Second, Name: "slow"}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return lim
		},
		"Store": func(clk ratelimit.Clock, obs ratelimit.Observer) waiter {
			s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return keyedWait(s)
		},
		"Composite": func(clk ratelimit.Clock, obs ratelimit.Observer) waiter {
			c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return keyedWait(c)
		},
		"Plans": func(clk ratelimit.Clock, obs ratelimit.Observer) waiter {
			r := rule
			r.Name = ""
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"slow": {Rule: r}}, Default: "slow"},
				nil, ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			return keyedWait(p)
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			obs := newRecorder()
			w := b(clk, obs)
			ctx := context.Background()

			// Admitted at once.
			_, err := w.Wait(ctx, ratelimit.Unit)
			require.NoError(t, err)

			// Admitted after a second of the limiter's time.
			done := make(chan error, 1)
			go func() { _, err := w.Wait(ctx, ratelimit.Unit); done <- err }()
			require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
			clk.Advance(time.Second)
			require.NoError(t, <-done)

			// Abandoned: its deadline would come first (nothing sleeps).
			dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = w.Wait(dctx, ratelimit.Unit)
			cancel()
			require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)

			// Abandoned: cancelled while asleep, after 400 ms.
			cctx, cancel := context.WithCancel(ctx)
			go func() { _, err := w.Wait(cctx, ratelimit.Unit); done <- err }()
			require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
			clk.Advance(400 * time.Millisecond)
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)

			// An ended context: started and abandoned, no decision.
			_, err = w.Wait(cctx, ratelimit.Unit)
			require.ErrorIs(t, err, context.Canceled)

			// A cost error: nothing at all.
			_, err = w.Wait(ctx, 0)
			require.Error(t, err)

			s := ratelimit.WaitStarted
			assert.Equal(t, []waitRecord{
				{"slow", s, 0}, {"slow", ratelimit.WaitAdmitted, 0},
				{"slow", s, 0}, {"slow", ratelimit.WaitAdmitted, time.Second},
				{"slow", s, 0}, {"slow", ratelimit.WaitAbandoned, 0},
				{"slow", s, 0}, {"slow", ratelimit.WaitAbandoned, 400 * time.Millisecond},
				{"slow", s, 0}, {"slow", ratelimit.WaitAbandoned, 0},
			}, obs.waits)
			assert.Equal(t, map[outcomeKey]int{{"slow", ratelimit.OutcomeAllowed}: 2, {"slow", ratelimit.OutcomeRefused}: 2}, obs.counts())
		})
	}
}

type waitFunc func(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error)

func (f waitFunc) Wait(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error) {
	return f(ctx, cost)
}

// TestObserverLeakyWait: a leaky bucket's Wait sleeps out its Delay; one
// cancelled in the queue stays spent (a decision allowed) but is
// abandoned.
func TestObserverLeakyWait(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	obs := newRecorder()
	s, err := ratelimit.NewStore(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10, Name: "queue"},
		ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.Wait(ctx, "k", ratelimit.Unit)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := s.Wait(ctx, "k", ratelimit.Unit); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(200 * time.Millisecond)
	require.NoError(t, <-done)
	cctx, cancel := context.WithCancel(ctx)
	go func() { _, err := s.Wait(cctx, "k", ratelimit.Unit); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.Equal(t, []waitRecord{
		{"queue", ratelimit.WaitStarted, 0}, {"queue", ratelimit.WaitAdmitted, 0},
		{"queue", ratelimit.WaitStarted, 0}, {"queue", ratelimit.WaitAdmitted, 200 * time.Millisecond},
		{"queue", ratelimit.WaitStarted, 0}, {"queue", ratelimit.WaitAbandoned, 0},
	}, obs.waits)
	assert.Equal(t, map[outcomeKey]int{{"queue", ratelimit.OutcomeAllowed}: 3}, obs.counts())
}

// TestObserverEvictions: the store's evictions, lossy or not, reach the
// observer exactly as its Stats count them, from a Store, a Composite's
// layers and a Plans' stores.
func TestObserverEvictions(t *testing.T) {
	t.Run("Store", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		obs := newRecorder()
		store, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 10, Window: time.Minute, Name: "fw"},
			ratelimit.WithMaxKeys(2), ratelimit.WithShards(1), ratelimit.WithClock(clk), ratelimit.WithObserver(obs))
		require.NoError(t, err)
		for _, k := range []string{"a", "b", "c"} {
			_, err := store.Check(k, ratelimit.Unit)
			require.NoError(t, err)
		}
		assert.Equal(t, map[string]uint64{"fw": 1}, obs.evicted)
		assert.Equal(t, map[string]uint64{"fw": 1}, obs.lossy)
		clk.Set(time.Minute) // both keys held are fresh again
		_, err = store.Check("d", ratelimit.Unit)
		require.NoError(t, err)
		st := store.Stats()
		assert.Equal(t, map[string]uint64{"fw": st.Evictions}, obs.evicted)
		assert.Equal(t, map[string]uint64{"fw": st.LossyEvictions}, obs.lossy)
		assert.Equal(t, uint64(3), st.Evictions)
		assert.Equal(t, "fw", st.Policy)
		assert.Equal(t, int64(10), st.Limit)
		assert.Equal(t, time.Minute, st.Window)
	})
	t.Run("random", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		obs := newRecorder()
		rng := rand.New(rand.NewPCG(7, 7))
		c, err := ratelimit.Compose([]ratelimit.Layer{
			{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(10), Burst: 5, Name: "per-key"}},
			{Rule: ratelimit.SlidingLog{Limit: 30, Window: time.Second, Name: "per-route"}, Key: func(k string) string { return k[:1] },
				Options: []ratelimit.Option{ratelimit.WithMaxKeys(4)}},
		}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs), ratelimit.WithMaxKeys(16), ratelimit.WithShards(2))
		require.NoError(t, err)
		p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
			"a": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 3}},
			"b": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(6), Burst: 6}},
		}, Default: "a"}, func(k string) string { return k[len(k)-1:] },
			ratelimit.WithClock(clk), ratelimit.WithObserver(obs), ratelimit.WithMaxKeys(8), ratelimit.WithShards(1))
		require.NoError(t, err)
		for range 3000 {
			clk.Advance(time.Duration(rng.IntN(50)) * time.Millisecond)
			key := string([]byte{byte('a' + rng.IntN(8)), byte('0' + rng.IntN(9)), byte('a' + rng.IntN(2))})
			_, err := c.Check(key, ratelimit.Unit)
			require.NoError(t, err)
			_, err = p.Check(key, ratelimit.Unit)
			require.NoError(t, err)
		}
		want, wantLossy := map[string]uint64{}, map[string]uint64{}
		for _, st := range c.Stats() {
			want[st.Policy] += st.Evictions
			wantLossy[st.Policy] += st.LossyEvictions
		}
		for name, sts := range p.Stats() {
			assert.Equal(t, name, sts[0].Policy, "an unnamed rule is its plan's")
			want[name] += sts[0].Evictions
			wantLossy[name] += sts[0].LossyEvictions
		}
		for _, policy := range []string{"per-key", "per-route", "a", "b"} {
			assert.NotZero(t, want[policy], policy)
			assert.NotZero(t, wantLossy[policy], policy)
		}
		assert.Equal(t, want, obs.evicted)
		assert.Equal(t, wantLossy, obs.lossy)
	})
}

// TestObserverConcurrent: under concurrent checks every decision is seen
// once: a limit of 100 against 1000 requests is 100 allowed, 900 refused.
func TestObserverConcurrent(t *testing.T) {
	var allowed, refused atomic.Int64
	obs := countingObserver{allowed: &allowed, refused: &refused}
	lim, err := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 100}, ratelimit.WithObserver(obs))
	require.NoError(t, err)
	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 100}, ratelimit.WithObserver(obs))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_, _ = lim.Check(ratelimit.Unit)
				_, _ = store.Check("k", ratelimit.Unit)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(200), allowed.Load())
	assert.Equal(t, int64(1800), refused.Load())
}

// countingObserver counts with atomics: an Observer that allocates nothing.
type countingObserver struct{ allowed, refused *atomic.Int64 }

func (c countingObserver) Decided(d ratelimit.Decision, _ ratelimit.Units, o ratelimit.Outcome) {
	if o == ratelimit.OutcomeAllowed {
		c.allowed.Add(1)
	} else {
		c.refused.Add(1)
	}
}
func (countingObserver) Waited(string, ratelimit.WaitEvent, time.Duration) {}
func (countingObserver) Evicted(string, uint64, bool)                      {}
func (countingObserver) Failed(string, error)                              {}

// TestObserverAllocatesNothing: an observed Check allocates no more than
// an unobserved one (nothing), with an observer that allocates nothing.
func TestObserverAllocatesNothing(t *testing.T) {
	var a, r atomic.Int64
	obs := ratelimit.WithObserver(countingObserver{&a, &r})
	for _, rule := range []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000},
		ratelimit.FixedWindow{Limit: 1_000_000, Window: time.Second},
	} {
		lim, err := ratelimit.New(rule, obs)
		require.NoError(t, err)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = lim.Check(ratelimit.Unit) }))
		store, err := ratelimit.NewStore(rule, obs)
		require.NoError(t, err)
		_, _ = store.Check("k", ratelimit.Unit)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = store.Check("k", ratelimit.Unit) }))
		c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, obs)
		require.NoError(t, err)
		_, _ = c.Check("k", ratelimit.Unit)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = c.Check("k", ratelimit.Unit) }))
	}
	assert.NotZero(t, a.Load())
}

// TestOutcomeStrings: the label values.
func TestOutcomeStrings(t *testing.T) {
	assert.Equal(t, "allowed", ratelimit.OutcomeAllowed.String())
	assert.Equal(t, "refused", ratelimit.OutcomeRefused.String())
	assert.Equal(t, "shadow_refused", ratelimit.OutcomeShadowRefused.String())
	assert.Equal(t, "started", ratelimit.WaitStarted.String())
	assert.Equal(t, "admitted", ratelimit.WaitAdmitted.String())
	assert.Equal(t, "abandoned", ratelimit.WaitAbandoned.String())
}

// BenchmarkObservedCheck is Check with an Observer that counts with
// atomics: what the hook costs when it is set (BenchmarkCheck and
// BenchmarkStoreCheck run without one).
func BenchmarkObservedCheck(b *testing.B) {
	var a, r atomic.Int64
	obs := ratelimit.WithObserver(countingObserver{&a, &r})
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000_000_000}
	for _, set := range []bool{false, true} {
		opts := []ratelimit.Option{}
		name := "unset"
		if set {
			opts, name = append(opts, obs), "set"
		}
		b.Run("New/"+name, func(b *testing.B) {
			lim, err := ratelimit.New(rule, opts...)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = lim.Check(ratelimit.Unit)
			}
		})
		b.Run("Store/"+name, func(b *testing.B) {
			s, err := ratelimit.NewStore(rule, opts...)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.Check("k", ratelimit.Unit)
			}
		})
	}
}
