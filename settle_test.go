package ratelimit_test

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// drawActual draws a settled request's real cost: up to three capacities,
// now and then a whole number of units, or a huge one.
func drawActual(t *rapid.T, capMilli int64) ratelimit.Units {
	return ratelimit.Units(rapid.OneOf(
		rapid.Int64Range(1, 3*capMilli),
		rapid.Map(rapid.Int64Range(1, 3*capMilli/1000), func(n int64) int64 { return n * 1000 }),
		rapid.Just(int64(math.MaxInt64)),
	).Draw(t, "actual"))
}

// settleModel settles on a model by the definition: the difference charged
// (within the debt bound) or refunded, then the Decision a request of cost
// charged would get. It returns that Decision (Window left 0) and the cost
// as settled.
func settleModel(m refmodel.Model, now, charged, actual, at int64) (ratelimit.Decision, int64) {
	settled := charged
	if actual >= charged {
		settled += m.(refmodel.Settler).Charge(now, actual-charged)
	} else {
		settled -= m.(refmodel.Refunder).Refund(now, min(at, now), charged-actual)
	}
	return m.(refmodel.Settler).Look(now, charged), settled
}

// settleKind settles on one kind of limiter (kindOps' names).
func settleKind(k allKinds, kind, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	switch kind {
	case "Limiter":
		return ratelimit.Settle(k.lim, charged, actual, at)
	case "Store":
		return k.store.Settle(key, charged, actual, at)
	case "Composite":
		return k.comp.Settle(key, charged, actual, at)
	}
	d, settled, err := k.plans.Settle(key, charged, actual, at)
	if d.Policy == "one" {
		d.Policy = "" // an unnamed rule reports its plan's name
	}
	return d, settled, err
}

// TestSettleVectors: worked examples, one or more per algorithm, on every
// kind of limiter: a request checked at its estimate, settled at its real
// cost, and what the key then decides.
func TestSettleVectors(t *testing.T) {
	const (
		s  = time.Second
		ms = time.Millisecond
		u  = ratelimit.Unit
	)
	type probe struct {
		at      time.Duration
		cost    ratelimit.Units
		allowed bool
		delay   time.Duration
	}
	tests := []struct {
		name       string
		rule       ratelimit.Rule
		checks     []ratelimit.Units // at checkAt, all admitted
		checkAt    time.Duration
		settleAt   time.Duration
		charged    ratelimit.Units
		actual     ratelimit.Units
		settled    ratelimit.Units
		want       ratelimit.Decision // Allowed, Remaining, RetryAfter, ResetAfter, Delay
		afterwards []probe
	}{
		{
			// Reserve 1000, used 2400, settled 5 s later: the bucket had
			// earned 500, so it holds 500 - 1400 = -900, and a request of
			// 1000 waits until it has earned 1900: 19 s. One of 1 waits 9.01 s.
			name: "token bucket, reserve 1000, used 2400", rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 1000},
			checks: []ratelimit.Units{1000 * u}, settleAt: 5 * s, charged: 1000 * u, actual: 2400 * u, settled: 2400 * u,
			want:       ratelimit.Decision{RetryAfter: 19 * s, ResetAfter: 19 * s},
			afterwards: []probe{{5*s + 9010*ms - 1, u, false, 0}, {5*s + 9010*ms, u, true, 0}},
		},
		{
			// Settled at once, the debt bound stops the charge at -1000
			// tokens: 1000 of the 1400 are charged, and the bucket is
			// whole again after 2000 units at 100/s.
			name: "token bucket, the debt bound", rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 1000},
			checks: []ratelimit.Units{1000 * u}, charged: 1000 * u, actual: 2400 * u, settled: 2000 * u,
			want:       ratelimit.Decision{RetryAfter: 20 * s, ResetAfter: 20 * s},
			afterwards: []probe{{10*s - 1, u, false, 0}, {10*s + 10*ms, u, true, 0}},
		},
		{
			name: "GCRA, reserve 1000, used 2400", rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 1000},
			checks: []ratelimit.Units{1000 * u}, settleAt: 5 * s, charged: 1000 * u, actual: 2400 * u, settled: 2400 * u,
			want:       ratelimit.Decision{RetryAfter: 19 * s, ResetAfter: 19 * s},
			afterwards: []probe{{24*s - 1, 1000 * u, false, 0}, {24 * s, 1000 * u, true, 0}},
		},
		{
			// Cheaper than charged: Refund's rules. 5 charged, 2 used, 100 ms
			// later: 3 back less the 1 earned since, so 18 are held.
			name: "token bucket, cheaper than charged", rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
			checks: []ratelimit.Units{5 * u}, settleAt: 100 * ms, charged: 5 * u, actual: 2 * u, settled: 3 * u,
			want: ratelimit.Decision{Allowed: true, Remaining: 13, ResetAfter: 700 * ms}, // 18 held, less the 5 looked at
		},
		{
			// 10 queued at 5/s, then the last turns out to cost 6: 15 are
			// queued, the queue is empty at 3 s, and a request of 1 fits when
			// 6 have drained (1.2 s) and goes on when the rest has (1.8 s on).
			name: "leaky bucket, a queued request cost more", rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10},
			checks: []ratelimit.Units{u, u, u, u, u, u, u, u, u, u}, charged: u, actual: 6 * u, settled: 6 * u,
			want:       ratelimit.Decision{RetryAfter: 1200 * ms, ResetAfter: 3 * s},
			afterwards: []probe{{1200*ms - 1, u, false, 0}, {1200 * ms, u, true, 1800 * ms}},
		},
		{
			// 20 in a window of a limit of 10; the debt ends with the window.
			name: "fixed window", rule: ratelimit.FixedWindow{Limit: 10, Window: s},
			checks: []ratelimit.Units{4 * u}, checkAt: 500 * ms, settleAt: 500 * ms, charged: 4 * u, actual: 20 * u, settled: 20 * u,
			want:       ratelimit.Decision{RetryAfter: 500 * ms, ResetAfter: 500 * ms},
			afterwards: []probe{{s - 1, u, false, 0}, {s, 10 * u, true, 0}},
		},
		{
			// 2 at 0, settled at 15 half a second later: an entry of 13 at
			// 500 ms, which leaves at 1.5 s.
			name: "sliding log", rule: ratelimit.SlidingLog{Limit: 10, Window: s},
			checks: []ratelimit.Units{2 * u}, settleAt: 500 * ms, charged: 2 * u, actual: 15 * u, settled: 15 * u,
			want:       ratelimit.Decision{RetryAfter: s, ResetAfter: s},
			afterwards: []probe{{s, u, false, 0}, {1500*ms - 1, 2 * u, false, 0}, {1500 * ms, 10 * u, true, 0}},
		},
		{
			// 5 at 5 s, settled at 25: the estimate may reach 20, so 15 of
			// the 20 are charged. 20 then weigh on the next window; 5 fit
			// once 20 x (W-e)/W <= 5, at e = 7.5 s.
			name: "sliding counter, the debt bound", rule: ratelimit.SlidingCounter{Limit: 10, Window: 10 * s},
			checks: []ratelimit.Units{5 * u}, checkAt: 5 * s, settleAt: 5 * s, charged: 5 * u, actual: 25 * u, settled: 20 * u,
			want:       ratelimit.Decision{RetryAfter: 12500 * ms, ResetAfter: 15 * s},
			afterwards: []probe{{17500*ms - 1, 5 * u, false, 0}, {17500 * ms, 5 * u, true, 0}},
		},
		{
			// 3 at 100 ms in buckets of 250 ms, settled at 12: bucket 0
			// holds 12 until it leaves the window at 1 s.
			name: "sub-window", rule: ratelimit.SubWindow{Limit: 10, Window: s, Buckets: 4},
			checks: []ratelimit.Units{3 * u}, checkAt: 100 * ms, settleAt: 100 * ms, charged: 3 * u, actual: 12 * u, settled: 12 * u,
			want:       ratelimit.Decision{RetryAfter: 900 * ms, ResetAfter: 900 * ms},
			afterwards: []probe{{s - 1, u, false, 0}, {s, 10 * u, true, 0}},
		},
	}
	for _, tc := range tests {
		for _, op := range kindOps {
			t.Run(tc.name+"/"+op.name, func(t *testing.T) {
				clk := ratelimit.NewManualClock(tc.checkAt)
				k := buildKinds(t, tc.rule, clk)
				var at time.Duration
				for _, c := range tc.checks {
					d, err := op.check(k, "k1", c)
					require.NoError(t, err)
					require.True(t, d.Allowed)
					at = d.At
				}
				clk.Set(tc.settleAt)
				got, settled, err := settleKind(k, op.name, "k1", tc.charged, tc.actual, at)
				require.NoError(t, err)
				assert.Equal(t, tc.settled, settled, "settled")
				want := tc.want
				want.Limit, want.Window, want.At = got.Limit, got.Window, tc.settleAt
				assert.Equal(t, want, got)
				p, err := op.peek(k, "k1", tc.charged)
				require.NoError(t, err)
				if op.name == "Plans" {
					p.Policy = ""
				}
				assert.Equal(t, p, got, "the Decision is a Peek of the charged cost")
				for _, pr := range tc.afterwards {
					clk.Set(pr.at)
					d, err := op.check(k, "k1", pr.cost)
					require.NoError(t, err)
					assert.Equal(t, pr.allowed, d.Allowed, "cost %v at %v", pr.cost, pr.at)
					assert.Equal(t, pr.delay, d.Delay, "cost %v at %v", pr.cost, pr.at)
				}
			})
		}
	}
}

func TestSettleErrors(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	k := buildKinds(t, ratelimit.FixedWindow{Limit: 5, Window: time.Second, Name: "five"}, clk)
	for _, op := range kindOps {
		for _, c := range []struct {
			charged, actual ratelimit.Units
			want            error
		}{
			{0, ratelimit.Unit, ratelimit.ErrInvalidCost},
			{-1, ratelimit.Unit, ratelimit.ErrInvalidCost},
			{ratelimit.Unit, 0, ratelimit.ErrInvalidCost},
			{ratelimit.Unit, math.MinInt64, ratelimit.ErrInvalidCost},
			{5*ratelimit.Unit + 1, ratelimit.Unit, ratelimit.ErrCostExceedsCapacity},
		} {
			d, settled, err := settleKind(k, op.name, "k1", c.charged, c.actual, 0)
			require.ErrorIs(t, err, c.want, "%s %v %v", op.name, c.charged, c.actual)
			assert.Zero(t, settled)
			assert.False(t, d.Allowed)
			assert.Equal(t, int64(5), d.Limit, op.name)
		}
		d, err := op.peek(k, "k1", 5*ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "%s: an error settles nothing", op.name)
		assert.Zero(t, op.keys(k), "%s: an error adds no key", op.name)
	}
	_, _, err := ratelimit.Settle(ratelimit.Shadow(k.lim, nil), ratelimit.Unit, ratelimit.Unit, 0)
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// TestSettleDebtBound checks the bound on every algorithm: with the clock
// still, whatever checks and settlements arrive, a fresh key admits at
// most its capacity and has at most twice its capacity spent (what it
// admitted plus what settlements charged on top), reaches exactly twice
// once a settlement asks for more, and is then charged nothing more.
func TestSettleDebtBound(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, int64(ratelimit.MaxTime)).Draw(t, "now")))
				lim, err := ratelimit.New(a.rule(s), ratelimit.WithClock(clk))
				require.NoError(t, err)
				capMilli := s.capacity * int64(ratelimit.Unit)
				// A bucket's debt also stops where its schedule would pass
				// the last int64 instant, at most a milli-unit's pace after
				// it: there the debt may end short of twice the capacity.
				atCeiling := func(d ratelimit.Decision) bool {
					if s.rate.Count == 0 {
						return false
					}
					pace := int64(s.rate.Per)/(s.rate.Count*int64(ratelimit.Unit)) + 1
					return int64(d.At) > math.MaxInt64-int64(d.ResetAfter)-pace
				}
				var admitted, spent int64
				for range rapid.IntRange(1, 20).Draw(t, "ops") {
					cost := ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, "cost"))
					if rapid.Bool().Draw(t, "check") {
						d, err := lim.Check(cost)
						require.NoError(t, err)
						if d.Allowed {
							admitted += int64(cost)
							spent += int64(cost)
						}
						continue
					}
					actual := ratelimit.Units(rapid.Int64Range(int64(cost), math.MaxInt64).Draw(t, "actual"))
					d, settled, err := ratelimit.Settle(lim, cost, actual, time.Duration(clk.Now()))
					require.NoError(t, err)
					spent += int64(settled - cost)
					require.LessOrEqual(t, spent, 2*capMilli, "no more than a capacity of debt")
					if settled < actual {
						if !atCeiling(d) {
							require.Equal(t, 2*capMilli, spent, "charged up to the bound before stopping")
						}
						require.Zero(t, d.Remaining)
						require.False(t, d.Allowed)
					}
				}
				require.LessOrEqual(t, admitted, capMilli)
				d, settled, err := ratelimit.Settle(lim, ratelimit.Unit, math.MaxInt64, 0)
				require.NoError(t, err)
				if !atCeiling(d) {
					require.Equal(t, 2*capMilli, spent+int64(settled-ratelimit.Unit), "a huge settlement fills the debt to its bound")
				}
				_, settled, err = ratelimit.Settle(lim, ratelimit.Unit, math.MaxInt64, 0)
				require.NoError(t, err)
				require.Equal(t, ratelimit.Unit, settled, "nothing more is charged at the bound")
			})
		})
	}
}

// TestSettleExtremes settles at the ends of time on rules whose spans come
// close to MaxTime, where a bucket's schedule could pass the largest int64
// instant, and checks every Decision and amount against the model.
func TestSettleExtremes(t *testing.T) {
	type setting struct {
		rate     ratelimit.Rate
		capacity int64
	}
	long := ratelimit.MaxTime - 1
	cases := []setting{
		{ratelimit.Rate{Count: 1, Per: long}, 1},
		{ratelimit.Rate{Count: 3, Per: long}, 2},
		{ratelimit.Rate{Count: 1e15, Per: long}, 1e15},
		{ratelimit.Rate{Count: 7, Per: 3 * time.Second}, 5},
	}
	clocks := []time.Duration{0, ratelimit.MaxTime / 2, ratelimit.MaxTime - long/3, ratelimit.MaxTime - 1, ratelimit.MaxTime, math.MaxInt64}
	for _, a := range testedAlgorithms {
		for _, st := range cases {
			for _, start := range clocks {
				s := settings{rate: st.rate, capacity: st.capacity, window: st.rate.Per}
				if !a.valid(s) {
					continue
				}
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(start)}
				lim, err := ratelimit.New(a.rule(s), ratelimit.WithClock(clk))
				require.NoError(t, err)
				m := a.model(s)
				window := a.decisionWindow(s)
				capMilli := s.capacity * int64(ratelimit.Unit)
				name := fmt.Sprintf("%s %+v from %d", a.name, st, start)
				check := func(cost int64) ratelimit.Decision {
					got, err := lim.Check(ratelimit.Units(cost))
					require.NoError(t, err, name)
					want := m.Step(clk.modelNow(), cost)
					want.Window = window
					require.Equal(t, want, got, name)
					return got
				}
				settle := func(charged, actual int64, at time.Duration) {
					got, settled, err := ratelimit.Settle(lim, ratelimit.Units(charged), ratelimit.Units(actual), at)
					require.NoError(t, err, name)
					want, wantSettled := settleModel(m, clk.modelNow(), charged, actual, int64(at))
					want.Window = window
					require.Equal(t, wantSettled, int64(settled), name)
					require.Equal(t, want, got, name)
				}
				d := check(capMilli)
				settle(capMilli, math.MaxInt64, d.At)
				check(1)
				settle(1, math.MaxInt64, d.At)
				clk.Advance(long / 2)
				check(capMilli)
				settle(1, math.MaxInt64, 0)
				settle(capMilli, 1, d.At)
				clk.Set(ratelimit.MaxTime)
				check(1)
				settle(1, math.MaxInt64, ratelimit.MaxTime)
				check(capMilli)
			}
		}
	}
}

// TestSettleMachineStates checks that Machine reads the states a key in
// debt is left in, deciding on them as the in-process store does, and
// still refuses a state beyond the debt's bound.
func TestSettleMachineStates(t *testing.T) {
	const s = time.Second
	u := ratelimit.Unit
	for _, c := range []struct {
		name            string
		rule            ratelimit.Rule
		at              time.Duration
		checked, actual ratelimit.Units
		state, beyond   string
	}{
		{"gcra", ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, 10 * s, 20 * u, 40 * u,
			"10000000000 14000000000 0", "10000000000 14000000001 0"},
		{"gcra, fractions", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * s}, Burst: 2}, 10 * s, 2 * u, 4 * u,
			"10000000000 11714285714 2", "10000000000 11714285714 3"},
		{"leaky bucket", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 20}, 10 * s, 20 * u, 40 * u,
			"10000000000 14000000000 0", "10000000000 14000000001 0"},
		{"fixed window", ratelimit.FixedWindow{Limit: 5, Window: s}, 10 * s, 5 * u, 10 * u,
			"10000000000 10 10000", "10000000000 10 10001"},
		{"sliding counter", ratelimit.SlidingCounter{Limit: 5, Window: s}, 10 * s, 5 * u, 10 * u,
			"10000000000 10 0 10000", "10000000000 10 0 10001"},
		{"sliding log", ratelimit.SlidingLog{Limit: 5, Window: time.Minute}, 9 * s, 5 * u, 10 * u,
			"9000000000 9000000000 10000", "9000000000 9000000000 10001"},
		{"sub-window", ratelimit.SubWindow{Limit: 10, Window: s, Buckets: 4}, 1100 * time.Millisecond, 3 * u, 20 * u,
			"1100000000 4 0 0 0 20000", "1100000000 4 0 0 0 20001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(c.at)
			store, err := ratelimit.NewStore(c.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			d, err := store.Check("k", c.checked)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			_, settled, err := store.Settle("k", c.checked, c.actual, d.At)
			require.NoError(t, err)
			require.Equal(t, c.actual, settled)
			m, err := ratelimit.NewMachine(c.rule)
			require.NoError(t, err)
			for _, later := range []time.Duration{0, 100 * time.Millisecond, 1500 * time.Millisecond, 10 * s} {
				for _, cost := range []ratelimit.Units{1, u, 2 * u} {
					clk.Set(c.at + later)
					want, err := store.Peek("k", cost)
					require.NoError(t, err)
					got, next, err := m.Step([]byte(c.state), c.at+later, cost, false)
					require.NoError(t, err, "a state in debt reads")
					assert.Equal(t, want, got, "at %v cost %v", later, cost)
					assert.Equal(t, c.state, string(next))
				}
			}
			_, _, err = m.Step([]byte(c.beyond), c.at, u, false)
			require.ErrorIs(t, err, ratelimit.ErrInvalidState, "beyond the bound")
		})
	}
}

// TestSettleComposite checks a composite's settlement: every enforced layer
// is charged within its own bound, the settled cost is the one furthest
// from actual, and a shadow layer is left as it was.
func TestSettleComposite(t *testing.T) {
	u := ratelimit.Unit
	clk := ratelimit.NewManualClock(0)
	comp, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 10, Window: time.Second, Name: "small"}},
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Second, Name: "big"}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := comp.Check("k", 5*u)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	got, settled, err := comp.Settle("k", 5*u, 30*u, d.At)
	require.NoError(t, err)
	assert.Equal(t, 20*u, settled, "the small layer stops at twice its limit; the big one takes all 30")
	assert.Equal(t, ratelimit.Decision{Limit: 10, RetryAfter: time.Second, ResetAfter: time.Second, Policy: "small", Window: time.Second}, got)
	_, settled, err = comp.Settle("k", 5*u, 3*u, d.At)
	require.NoError(t, err)
	assert.Equal(t, 3*u, settled, "each layer gives 2 back")
	clk.Set(time.Second)
	got, err = comp.Check("k", 10*u)
	require.NoError(t, err)
	assert.True(t, got.Allowed, "the debt ended with the window")

	// A shadow layer keeps what it spent: it was not charged.
	var shadowDenied int
	watched, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Second, Name: "big"}},
		{Rule: ratelimit.FixedWindow{Limit: 12, Window: time.Second, Name: "watch"}, Shadow: true,
			OnShadow: func(r ratelimit.ShadowReport) {
				if !r.Decision.Allowed {
					shadowDenied++
				}
			}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err = watched.Check("k", 5*u)
	require.NoError(t, err)
	_, settled, err = watched.Settle("k", 5*u, 30*u, d.At)
	require.NoError(t, err)
	assert.Equal(t, 30*u, settled)
	got, err = watched.Check("k", 7*u)
	require.NoError(t, err)
	assert.True(t, got.Allowed)
	assert.False(t, got.Shadowed, "the shadow layer holds 5 + 7")
	assert.Zero(t, shadowDenied)
	got, err = watched.Check("k", u)
	require.NoError(t, err)
	assert.True(t, got.Shadowed, "and now 12")
}

// TestSettleConcurrent races settlements with checks on one key, the clock
// still: the accounting stays exact, within the bound. What was admitted
// plus what settlements charged (less what they gave back) never exceeds
// twice the capacity, and a last huge settlement charges exactly what is
// left of that bound.
func TestSettleConcurrent(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, // lock-free
		ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 20},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 20},
		ratelimit.FixedWindow{Limit: 20, Window: time.Second},
		ratelimit.SlidingLog{Limit: 20, Window: time.Second},
		ratelimit.SlidingCounter{Limit: 20, Window: time.Second},
		ratelimit.SubWindow{Limit: 20, Window: time.Second, Buckets: 4},
	}
	const capMilli = 20 * int64(ratelimit.Unit)
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(time.Hour)
		k := buildKinds(t, rule, clk)
		for _, op := range kindOps {
			var total atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 100 {
						cost := ratelimit.Units((g+i)%3+1) * ratelimit.Unit
						d, err := op.check(k, "k1", cost)
						if !assert.NoError(t, err) || !d.Allowed {
							continue
						}
						total.Add(int64(cost))
						actual := cost + ratelimit.Units((g*7+i)%9-4)*ratelimit.Unit/2
						_, settled, err := settleKind(k, op.name, "k1", cost, max(actual, 1), d.At)
						assert.NoError(t, err)
						total.Add(int64(settled - cost))
					}
				}()
			}
			waitGroup(t, &wg, "the checks and settlements")
			assert.LessOrEqual(t, total.Load(), 2*capMilli, "%T %s", rule, op.name)
			_, settled, err := settleKind(k, op.name, "k1", ratelimit.Unit, math.MaxInt64, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, 2*capMilli, total.Load()+int64(settled-ratelimit.Unit), "%T %s: exact accounting", rule, op.name)
		}
	}
}

// BenchmarkSettle settles a request at half as much again as it was
// charged, on a single-key limiter and on a Store, for every algorithm.
func BenchmarkSettle(b *testing.B) {
	for _, br := range benchRules() {
		b.Run(br.name+"/Limiter", func(b *testing.B) {
			lim, err := ratelimit.New(br.rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = ratelimit.Settle(lim, ratelimit.Unit, ratelimit.Unit*3/2, 0)
			}
		})
		b.Run(br.name+"/Store", func(b *testing.B) {
			store, err := ratelimit.NewStore(br.rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = store.Settle("k", ratelimit.Unit, ratelimit.Unit*3/2, 0)
			}
		})
	}
}

// TestSettlePlansMovedKey settles a key whose plan changed since its check:
// it moves to its new plan's store first, as its next check would move it,
// and settles there.
func TestSettlePlansMovedKey(t *testing.T) {
	u := ratelimit.Unit
	clk := ratelimit.NewManualClock(0)
	var plan atomic.Value
	plan.Store("small")
	set := ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"small": {Rule: ratelimit.FixedWindow{Limit: 10, Window: time.Second}},
			"big":   {Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Second}},
		},
		Default: "small",
	}
	p, err := ratelimit.NewPlans(set, func(string) string { return plan.Load().(string) }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := p.Check("c", 5*u)
	require.NoError(t, err)
	plan.Store("big") // half spent moves as half spent: 50 of 100
	got, settled, err := p.Settle("c", 5*u, 30*u, d.At)
	require.NoError(t, err)
	assert.Equal(t, 30*u, settled)
	// 75 of 100 spent: a request of 5 passes, leaving 20.
	assert.Equal(t, ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 20, ResetAfter: time.Second, Policy: "big", Window: time.Second}, got)
	d, err = p.Check("c", 26*u)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "75 spent")
	assert.Equal(t, int64(25), d.Remaining)
}
