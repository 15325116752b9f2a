package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// TestSlidingLogModelBursts drives long traces of small steps, so that the
// log grows to many entries, wraps around its ring, merges same-instant
// admissions and shrinks again when a burst expires, all checked against the
// model.
func TestSlidingLogModelBursts(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 200).Draw(t, "limit")
		window := time.Duration(rapid.Int64Range(1, 1000).Draw(t, "window"))
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.SlidingLog{Limit: limit, Window: window}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		model := refmodel.NewLog(limit, window)
		steps := rapid.IntRange(1, 2000).Draw(t, "steps")
		for i := range steps {
			clk.Advance(time.Duration(rapid.OneOf(
				rapid.Int64Range(0, 2),
				rapid.Int64Range(0, 3*int64(window)),
			).Draw(t, "advance")))
			cost := rapid.OneOf(
				rapid.Just(int64(1000)),
				rapid.Int64Range(1, 10),
				rapid.Int64Range(1, limit*1000),
			).Draw(t, "cost")
			got, err := lim.Check(ratelimit.Units(cost))
			require.NoError(t, err)
			want := model.Step(int64(clk.Now()), cost)
			want.Window = window
			require.Equal(t, want, got, "step %d at %d cost %d", i, clk.Now(), cost)
		}
	})
}

// TestSlidingLogNeverExceedsLimit checks the sliding log's promise on a
// recorded history: for every admission at t, the cost admitted in
// (t - Window, t] is at most Limit. The maximum over all windows is reached
// at a window that ends at an admission, so checking those is enough.
func TestSlidingLogNeverExceedsLimit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 50).Draw(t, "limit")
		window := time.Duration(rapid.Int64Range(1, 10_000).Draw(t, "window"))
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.SlidingLog{Limit: limit, Window: window}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		type admission struct{ t, cost int64 }
		var history []admission
		steps := rapid.IntRange(1, 500).Draw(t, "steps")
		for range steps {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(window)/4+1).Draw(t, "advance")))
			cost := rapid.OneOf(rapid.Just(int64(1000)), rapid.Int64Range(1, limit*1000)).Draw(t, "cost")
			d, err := lim.Check(ratelimit.Units(cost))
			require.NoError(t, err)
			if d.Allowed {
				history = append(history, admission{int64(clk.Now()), cost})
			}
		}
		for _, end := range history {
			var sum int64
			for _, a := range history {
				if a.t > end.t-int64(window) && a.t <= end.t {
					sum += a.cost
				}
			}
			require.LessOrEqual(t, sum, limit*1000, "admitted in (%d, %d]", end.t-int64(window), end.t)
		}
	})
}
