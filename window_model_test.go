package ratelimit_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// drawWindowRule draws a window rule's Limit and Window, now and then an
// out-of-range one, and whether New must accept them.
func drawWindowRule(t *rapid.T) (limit int64, window time.Duration, valid bool) {
	limit, window = drawCapacity(t), drawWindow(t)
	switch rapid.IntRange(0, 19).Draw(t, "edge") { // 0 (the simplest) draws a plain rule
	case 15:
		limit = rapid.SampledFrom([]int64{0, -1, math.MinInt64, 1e15 + 1, math.MaxInt64}).Draw(t, "badLimit")
	case 16:
		window = rapid.SampledFrom([]time.Duration{0, -1, math.MinInt64, ratelimit.MaxTime, math.MaxInt64}).Draw(t, "badWindow")
	case 17:
		limit = 1e15
	case 18:
		window = ratelimit.MaxTime - 1
	case 19:
		window = time.Duration(rapid.Int64Range(1, 1000).Draw(t, "tinyWindow"))
	}
	valid = limit >= 1 && limit <= 1e15 && window > 0 && window < ratelimit.MaxTime
	return limit, window, valid
}

// TestWindowDenseTraces complements the model tests with traces that stay
// within a few windows, so that previous and current counts meet often: every
// Decision must equal the model's, and every RetryAfter must be exact (the
// same request is denied one nanosecond before it and admitted at it).
func TestWindowDenseTraces(t *testing.T) {
	for _, kind := range []string{"FixedWindow", "SlidingCounter"} {
		t.Run(kind, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { denseTrace(t, kind) })
		})
	}
}

func denseTrace(t *rapid.T, kind string) {
	limit := rapid.OneOf(rapid.Int64Range(1, 10), rapid.Int64Range(1, 1e15)).Draw(t, "limit")
	window := drawWindow(t)
	if rapid.Bool().Draw(t, "tiny") {
		window = time.Duration(rapid.Int64Range(1, 50).Draw(t, "tinyWindow"))
	}
	var rule ratelimit.Rule
	var model refmodel.Model
	switch kind {
	case "FixedWindow":
		rule, model = ratelimit.FixedWindow{Limit: limit, Window: window}, refmodel.NewFixedWindow(limit, window)
	case "SlidingCounter":
		rule, model = ratelimit.SlidingCounter{Limit: limit, Window: window}, refmodel.NewSlidingCounter(limit, window)
	}
	start := rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, int64(ratelimit.MaxTime)/2)).Draw(t, "start")
	clk := ratelimit.NewManualClock(time.Duration(start))
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	capMilli := model.Capacity()
	check := func(cost ratelimit.Units) ratelimit.Decision {
		got, err := lim.Check(cost)
		require.NoError(t, err)
		now := int64(clk.Now())
		want := model.Step(now, int64(cost))
		want.Window = window
		require.Equal(t, want, got, "rule %+v at %d cost %d", rule, now, cost)
		return got
	}
	steps := rapid.IntRange(1, 200).Draw(t, "steps")
	for range steps {
		clk.Advance(time.Duration(rapid.OneOf(
			rapid.Just(int64(0)),
			rapid.Int64Range(0, 3),
			rapid.Int64Range(0, int64(window)/4),
			rapid.Int64Range(0, 2*int64(window)),
		).Draw(t, "advance")))
		if clk.Now() > ratelimit.MaxTime-2*window {
			return
		}
		cost := drawCost(t, capMilli)
		if int64(cost) > capMilli {
			continue
		}
		d := check(cost)
		if d.Allowed || d.RetryAfter == 0 {
			require.True(t, d.Allowed, "denied with RetryAfter 0")
			continue
		}
		now := clk.Now()
		clk.Set(now + d.RetryAfter - 1)
		require.False(t, check(cost).Allowed, "admitted 1 ns before RetryAfter %v", d.RetryAfter)
		clk.Set(now + d.RetryAfter)
		require.True(t, check(cost).Allowed, "denied at RetryAfter %v", d.RetryAfter)
	}
}
