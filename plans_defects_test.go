package ratelimit_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestPlansCheckWithinRefusesTooSlow: a request a plan's queue would admit
// but hold longer than maxDelay is refused, spending nothing, with the
// Decision a Store of the plan's rule gives (Policy aside: the plan's
// name), for a plan of one rule and for a plan of layers. The HTTP
// middleware's WithMaxDelay over Plans relies on it.
func TestPlansCheckWithinRefusesTooSlow(t *testing.T) {
	queue := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10}
	const maxDelay = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		plan ratelimit.Plan
	}{
		{"one rule", ratelimit.Plan{Rule: queue}},
		{"layers", ratelimit.Plan{Layers: []ratelimit.Layer{
			{Rule: queue},
			{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour}},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{
				Plans:   map[string]ratelimit.Plan{"q": tc.plan},
				Default: "q",
			}, func(string) string { return "" }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			// Delays 0, 200, 400 ms fit; the fourth would wait 600 ms.
			for i := range 3 {
				d, err := p.CheckWithin("k", ratelimit.Unit, maxDelay)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, time.Duration(i)*200*time.Millisecond, d.Delay)
			}
			want := ratelimit.Decision{
				Limit: 10, Remaining: 7, RetryAfter: 100 * time.Millisecond,
				ResetAfter: 600 * time.Millisecond, Policy: "q", Window: 2 * time.Second,
			}
			for range 5 { // refused again and again, spending nothing
				d, err := p.CheckWithin("k", ratelimit.Unit, maxDelay)
				require.NoError(t, err)
				assert.Equal(t, want, d)
			}
			d, err := p.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, 600*time.Millisecond, d.Delay, "nothing spent: the queue is as three requests left it")
			clk.Advance(100 * time.Millisecond)
			d, err = p.CheckWithin("k", ratelimit.Unit, maxDelay)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.Equal(t, maxDelay, d.Delay)
		})
	}
}

// TestPlansResetDropsReplacedStores: a key spent under a rule that an
// Update then replaced, and reset before its next check, starts fresh under
// the new rule; the old store's spend must not move back to it.
func TestPlansResetDropsReplacedStores(t *testing.T) {
	for _, tc := range []struct {
		name string
		plan func(burst int64) ratelimit.Plan
	}{
		{"one rule", func(burst int64) ratelimit.Plan {
			return ratelimit.Plan{Rule: ratelimit.TokenBucket{Rate: slow, Burst: burst}}
		}},
		{"layers", func(burst int64) ratelimit.Plan {
			return ratelimit.Plan{Layers: []ratelimit.Layer{
				{Rule: ratelimit.TokenBucket{Rate: slow, Burst: burst}},
				{Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Hour}},
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			set := func(burst int64) ratelimit.PlanSet {
				return ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"free": tc.plan(burst)}, Default: "free"}
			}
			p, err := ratelimit.NewPlans(set(10), func(string) string { return "" }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			d, err := p.Check("k", 8*ratelimit.Unit)
			require.NoError(t, err)
			require.Equal(t, int64(2), d.Remaining)
			// Each round replaces the rule (20, then 10 again) with the key
			// spent, and resets it before its next check.
			for _, m := range []ratelimit.Migration{ratelimit.MigrateProportional, ratelimit.MigrateAsIs, ratelimit.MigrateAdditive} {
				for _, burst := range []int64{20, 10} {
					require.NoError(t, p.Update(set(burst), m))
					p.Reset("k")
					d, err = p.Check("k", ratelimit.Unit)
					require.NoError(t, err)
					assert.Equal(t, burst-1, d.Remaining, "%v, burst %d: the reset key starts fresh under the new rule", m, burst)
					_, err = p.Check("k", 7*ratelimit.Unit)
					require.NoError(t, err)
				}
			}
		})
	}
}

// TestPlansPlanFunctionOncePerCheck: a check runs the plan function once,
// on the held key's path and on the attempt's (a plan of layers, a key
// that moves); it ran twice when the held key's path missed.
func TestPlansPlanFunctionOncePerCheck(t *testing.T) {
	var calls atomic.Int64
	on := "layers"
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"layers": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}},
			{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour}},
		}},
		"one": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(5), Burst: 5}},
	}, Default: "one"}, func(string) string { calls.Add(1); return on }, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	for _, plan := range []string{"layers", "layers", "one", "one", "layers"} {
		on = plan
		calls.Store(0)
		_, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, int64(1), calls.Load(), "a check on %q", plan)
	}
}
