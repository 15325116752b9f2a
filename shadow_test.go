package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// asShadow is what a shadow limit returns for a limit's own Decision.
func asShadow(d ratelimit.Decision) ratelimit.Decision {
	d.Shadowed = !d.Allowed
	d.Allowed, d.RetryAfter, d.Delay = true, 0, 0
	return d
}

// reports collects a shadow limit's reports.
type reports struct {
	mu  sync.Mutex
	got []ratelimit.ShadowReport
}

func (r *reports) add(rep ratelimit.ShadowReport) {
	r.mu.Lock()
	r.got = append(r.got, rep)
	r.mu.Unlock()
}

func (r *reports) take() []ratelimit.ShadowReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// TestShadowReportsTheModel runs a shadow limit of every algorithm against
// the limit's reference model: every request is admitted, each report is
// exactly the model's Decision (the model spends only what it admits, as
// an enforcing limit would), and the Decision returned is that Decision
// made into an admission.
func TestShadowReportsTheModel(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				lc := drawLimitCase(t, a)
				clk := ratelimit.NewManualClock(0)
				real, err := ratelimit.New(lc.rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				var reps reports
				lim := ratelimit.Shadow(real, reps.add)
				model := lc.newModel()
				for i, n := 0, rapid.IntRange(1, 60).Draw(t, "requests"); i < n; i++ {
					clk.Advance(time.Duration(rapid.Int64Range(0, int64(lc.scale)).Draw(t, "gap")))
					cost := ratelimit.Units(rapid.Int64Range(1, lc.capMilli+2000).Draw(t, "cost"))
					var got ratelimit.Decision
					if rapid.Bool().Draw(t, "wait") {
						got, err = bounded(t, "a Wait on a shadow limit", func() (ratelimit.Decision, error) {
							return lim.Wait(context.Background(), cost)
						})
					} else {
						got, err = lim.Check(cost)
					}
					require.NoError(t, err)
					reps := reps.take()
					require.Len(t, reps, 1)
					require.Empty(t, reps[0].Key)
					if int64(cost) > lc.capMilli {
						require.ErrorIs(t, reps[0].Err, ratelimit.ErrCostExceedsCapacity)
						want := ratelimit.Decision{Limit: lc.capMilli / 1000, Policy: lc.name, Window: lc.window}
						require.Equal(t, want, reps[0].Decision)
						require.Equal(t, ratelimit.Decision{Allowed: true, Shadowed: true, Limit: want.Limit, Policy: lc.name, Window: lc.window}, got)
						continue
					}
					require.NoError(t, reps[0].Err)
					want := lc.want(model.Step(int64(clk.Now()), int64(cost)))
					require.Equal(t, want, reps[0].Decision)
					require.Equal(t, asShadow(want), got)
				}
			})
		})
	}
}

func TestShadowKeyed(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store, err := ratelimit.NewStore(ratelimit.SlidingLog{Limit: 2, Window: time.Minute, Name: "login-per-ip"}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	var reps reports
	lim := ratelimit.ShadowKeyed(store, reps.add)
	for i := range 3 {
		for _, key := range []string{"10.0.0.1", "10.0.0.2"} {
			d, err := lim.Check(key, ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.Equal(t, i == 2, d.Shadowed, "request %d of %s", i+1, key)
			assert.Equal(t, "login-per-ip", d.Policy)
			assert.Zero(t, d.RetryAfter)
		}
	}
	got := reps.take()
	require.Len(t, got, 6)
	assert.Equal(t, "10.0.0.2", got[5].Key)
	assert.False(t, got[5].Decision.Allowed)
	assert.Equal(t, time.Minute, got[5].Decision.RetryAfter)
	// The third request of each key was denied, so it spent nothing: the
	// store is where an enforcing store would be.
	clk.Advance(time.Minute)
	d, err := store.Check("10.0.0.1", 2*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
}

func TestShadowEdges(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	real, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 2}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	lim := ratelimit.Shadow(real, nil) // no report: still admits and flags

	d, err := lim.Check(0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost, "no rule admits a cost of zero")
	assert.False(t, d.Allowed)

	for i := range 3 {
		d, err := lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Zero(t, d.Delay, "a shadow limit never holds a request back")
		assert.Equal(t, i == 2, d.Shadowed)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = bounded(t, "a Wait on a cancelled context", func() (ratelimit.Decision, error) {
		return lim.Wait(ctx, ratelimit.Unit)
	})
	require.ErrorIs(t, err, context.Canceled)
	d, err = bounded(t, "a Wait on a shadow limit", func() (ratelimit.Decision, error) {
		return lim.Wait(context.Background(), ratelimit.Unit)
	})
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.Shadowed, "Wait returns at once, as Check does")
}
