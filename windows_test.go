package ratelimit_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// winBurst is count requests of one unit each, the first at start and then
// every `every`.
type winBurst struct {
	start, every time.Duration
	count        int
}

// sendWinBursts sends the bursts in order on lim, moving clk, and returns how
// many of each burst were admitted and the last Decision.
func sendWinBursts(t *testing.T, lim ratelimit.Limiter, clk *ratelimit.ManualClock, bursts []winBurst) ([]int, ratelimit.Decision) {
	t.Helper()
	admitted := make([]int, len(bursts))
	var last ratelimit.Decision
	for i, b := range bursts {
		for j := 0; j < b.count; j++ {
			clk.Set(b.start + time.Duration(j)*b.every)
			d, err := lim.Check(ratelimit.Unit)
			require.NoError(t, err)
			if d.Allowed {
				admitted[i]++
			}
			last = d
		}
	}
	return admitted, last
}

func TestWindowVectors(t *testing.T) {
	const ms = time.Millisecond
	tenPerSecond := func(from, to time.Duration) winBurst {
		return winBurst{start: from, every: 100 * ms, count: int((to - from) / (100 * ms))}
	}
	tests := []struct {
		name     string
		rule     ratelimit.Rule
		bursts   []winBurst
		admitted []int // per burst
	}{
		{
			name:     "fixed window 10 per 1 s admits 10 on each side of a boundary",
			rule:     ratelimit.FixedWindow{Limit: 10, Window: time.Second},
			bursts:   []winBurst{{900 * ms, 10 * ms, 10}, {1000 * ms, 10 * ms, 10}},
			admitted: []int{10, 10},
		},
		{
			name:     "sliding counter 10 per 10 s: a burst half-way through the next window gets half",
			rule:     ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			bursts:   []winBurst{{5 * time.Second, 0, 10}, {15 * time.Second, 0, 10}},
			admitted: []int{10, 5},
		},
		{
			name:     "sliding counter 10 per 10 s: the same burst 1 ms apart",
			rule:     ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			bursts:   []winBurst{{5 * time.Second, 0, 10}, {15 * time.Second, ms, 10}},
			admitted: []int{10, 5},
		},
		{
			name:     "10 per second from 50 s to 70 s against fixed window 100 per minute",
			rule:     ratelimit.FixedWindow{Limit: 100, Window: time.Minute},
			bursts:   []winBurst{tenPerSecond(50*time.Second, 70*time.Second)},
			admitted: []int{200},
		},
		{
			name:     "10 per second from 50 s to 70 s against sliding counter 100 per minute",
			rule:     ratelimit.SlidingCounter{Limit: 100, Window: time.Minute},
			bursts:   []winBurst{tenPerSecond(50*time.Second, 70*time.Second)},
			admitted: []int{116},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			admitted, _ := sendWinBursts(t, lim, clk, tc.bursts)
			assert.Equal(t, tc.admitted, admitted)
		})
	}
}

// TestWindowDecisions checks every field of one Decision after a history
// built from real checks.
func TestWindowDecisions(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name    string
		rule    ratelimit.Rule
		history []winBurst // all must be admitted
		at      time.Duration
		cost    ratelimit.Units
		want    ratelimit.Decision
	}{
		{
			// 80 in [0, 60 s), then 30 late in the first 20 s of [60 s, 120 s):
			// at 79 s the estimate is 80 x 41/60 + 29 = 83.67, so all 30 fit.
			// At 80 s: 80 x 40/60 + 30 = 83.33, plus 1 admitted; what is left is
			// 100 - 31 - ceil(53.33) = 15.
			name:    "sliding counter 100 per 60 s: previous 80, current 30, 20 s in",
			rule:    ratelimit.SlidingCounter{Limit: 100, Window: time.Minute},
			history: []winBurst{{30 * time.Second, 0, 80}, {79 * time.Second, 10 * ms, 30}},
			at:      80 * time.Second,
			cost:    ratelimit.Unit,
			want: ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 15,
				ResetAfter: 100 * time.Second, Window: time.Minute},
		},
		{
			name:    "sliding counter: only the previous count, weighted, counts",
			rule:    ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second, Name: "sc"},
			history: []winBurst{{5 * time.Second, 0, 10}},
			at:      17500 * ms, // 10 x 2.5/10 = 2.5 counts
			cost:    ratelimit.Unit / 2,
			want: ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 7,
				ResetAfter: 12500 * ms, Window: 10 * time.Second, Policy: "sc"},
		},
		{
			name:    "sliding counter: two windows idle and nothing counts",
			rule:    ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			history: []winBurst{{5 * time.Second, 0, 10}},
			at:      20 * time.Second,
			cost:    10 * ratelimit.Unit,
			want: ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 0,
				ResetAfter: 20 * time.Second, Window: 10 * time.Second},
		},
		{
			name:    "fixed window: denied until the window ends",
			rule:    ratelimit.FixedWindow{Limit: 10, Window: time.Second, Name: "fw"},
			history: []winBurst{{1200 * ms, ms, 10}},
			at:      1500 * ms,
			cost:    ratelimit.Unit,
			want: ratelimit.Decision{Limit: 10, RetryAfter: 500 * ms,
				ResetAfter: 500 * ms, Window: time.Second, Policy: "fw"},
		},
		{
			name:    "fixed window: a new window is fresh",
			rule:    ratelimit.FixedWindow{Limit: 10, Window: time.Second},
			history: []winBurst{{1200 * ms, ms, 10}},
			at:      2 * time.Second,
			cost:    4 * ratelimit.Unit,
			want: ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 6,
				ResetAfter: time.Second, Window: time.Second},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			admitted, _ := sendWinBursts(t, lim, clk, tc.history)
			for i, b := range tc.history {
				require.Equal(t, b.count, admitted[i], "history burst %d", i)
			}
			clk.Set(tc.at)
			got, err := lim.Check(tc.cost)
			require.NoError(t, err)
			want := tc.want
			want.At = tc.at
			assert.Equal(t, want, got)
		})
	}
}

// TestWindowRetryAfterExact: a denied request is denied again one
// nanosecond before its RetryAfter and admitted exactly at it.
func TestWindowRetryAfterExact(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name    string
		rule    ratelimit.Rule
		history []winBurst
		at      time.Duration
		cost    ratelimit.Units
		want    time.Duration // RetryAfter
	}{
		{
			name:    "fixed window: the end of the window",
			rule:    ratelimit.FixedWindow{Limit: 10, Window: time.Second},
			history: []winBurst{{900 * ms, 0, 10}},
			at:      950 * ms,
			cost:    ratelimit.Unit,
			want:    50 * ms,
		},
		{
			name:    "fixed window 7 per 3 s",
			rule:    ratelimit.FixedWindow{Limit: 7, Window: 3 * time.Second},
			history: []winBurst{{3001 * ms, 0, 5}},
			at:      4 * time.Second,
			cost:    3 * ratelimit.Unit,
			want:    2 * time.Second,
		},
		{
			// 10 x (10-e)/10 + 5 + 1 <= 10 from e = 6 s.
			name:    "sliding counter: later in the same window",
			rule:    ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			history: []winBurst{{5 * time.Second, 0, 10}, {15 * time.Second, 0, 5}},
			at:      15 * time.Second,
			cost:    ratelimit.Unit,
			want:    time.Second,
		},
		{
			// The current 10 leave no room in this window; in the next one
			// 10 x (10-e)/10 + 1 <= 10 from e = 1 s.
			name:    "sliding counter: in the next window",
			rule:    ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			history: []winBurst{{5 * time.Second, 0, 10}},
			at:      5 * time.Second,
			cost:    ratelimit.Unit,
			want:    6 * time.Second,
		},
		{
			// A cost of the whole Limit passes only once nothing counts.
			name:    "sliding counter: the whole limit waits for the window after next",
			rule:    ratelimit.SlidingCounter{Limit: 10, Window: 10 * time.Second},
			history: []winBurst{{5 * time.Second, 0, 1}},
			at:      5 * time.Second,
			cost:    10 * ratelimit.Unit,
			want:    15 * time.Second,
		},
		{
			// 7 in [0, 3 s); at 4 s, 7 x 2/3 + 2 = 6.67 and one more needs
			// 7 x (3 s - e)/3 s + 3 <= 7, so 3 s - e <= 12/7 s: e >= 3 s -
			// 1714285714 ns = 1285714286 ns (rounded up), 285714286 ns on.
			name:    "sliding counter 7 per 3 s rounds up to the nanosecond",
			rule:    ratelimit.SlidingCounter{Limit: 7, Window: 3 * time.Second},
			history: []winBurst{{time.Second, 0, 7}, {4 * time.Second, 0, 2}},
			at:      4 * time.Second,
			cost:    ratelimit.Unit,
			want:    285714286,
		},
		{
			// 4 x (10-e)/10 + 2.5 <= 4 in the next window: e >= 6.25 s.
			name:    "sliding counter: a fractional cost",
			rule:    ratelimit.SlidingCounter{Limit: 4, Window: 10 * time.Second},
			history: []winBurst{{5 * time.Second, 0, 4}},
			at:      9 * time.Second,
			cost:    2500,
			want:    7250 * ms,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			admitted, _ := sendWinBursts(t, lim, clk, tc.history)
			for i, b := range tc.history {
				require.Equal(t, b.count, admitted[i], "history burst %d", i)
			}
			clk.Set(tc.at)
			d, err := lim.Check(tc.cost)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			assert.Equal(t, tc.want, d.RetryAfter)
			clk.Set(tc.at + d.RetryAfter - 1)
			d2, err := lim.Check(tc.cost)
			require.NoError(t, err)
			assert.False(t, d2.Allowed, "admitted 1 ns before RetryAfter")
			clk.Set(tc.at + d.RetryAfter)
			d3, err := lim.Check(tc.cost)
			require.NoError(t, err)
			assert.True(t, d3.Allowed, "denied at RetryAfter")
		})
	}
}

func TestWindowRuleValidation(t *testing.T) {
	rules := map[string]func(limit int64, window time.Duration) ratelimit.Rule{
		"FixedWindow": func(l int64, w time.Duration) ratelimit.Rule {
			return ratelimit.FixedWindow{Limit: l, Window: w}
		},
		"SlidingCounter": func(l int64, w time.Duration) ratelimit.Rule {
			return ratelimit.SlidingCounter{Limit: l, Window: w}
		},
	}
	tests := []struct {
		name   string
		limit  int64
		window time.Duration
		field  string // "" when the rule is valid
	}{
		{"zero limit", 0, time.Second, "Limit"},
		{"negative limit", -1, time.Second, "Limit"},
		{"most negative limit", math.MinInt64, time.Second, "Limit"},
		{"limit above 1e15", 1e15 + 1, time.Second, "Limit"},
		{"largest int64 limit", math.MaxInt64, time.Second, "Limit"},
		{"zero window", 10, 0, "Window"},
		{"negative window", 10, -time.Nanosecond, "Window"},
		{"window of MaxTime", 10, ratelimit.MaxTime, "Window"},
		{"largest window", 10, math.MaxInt64, "Window"},
		{"limit 1e15", 1e15, time.Second, ""},
		{"window 1 ns", 1, time.Nanosecond, ""},
		{"window 1 ms", 10, time.Millisecond, ""},
		{"window 10 years", 10, 10 * 365 * 24 * time.Hour, ""},
		{"window just under MaxTime", 1e15, ratelimit.MaxTime - 1, ""},
	}
	for kind, mk := range rules {
		for _, tc := range tests {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				lim, err := ratelimit.New(mk(tc.limit, tc.window), ratelimit.WithClock(ratelimit.NewManualClock(0)))
				if tc.field == "" {
					require.NoError(t, err)
					d, err := lim.Check(ratelimit.Units(tc.limit * 1000))
					require.NoError(t, err)
					assert.True(t, d.Allowed, "a fresh key admits the whole limit")
					assert.Equal(t, tc.window, d.Window)
					return
				}
				require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
				var re *ratelimit.RuleError
				require.True(t, errors.As(err, &re), "error %v is not a *RuleError", err)
				assert.Equal(t, kind, re.Rule)
				assert.Equal(t, tc.field, re.Field)
				assert.Nil(t, lim)
			})
		}
	}
}

func TestWindowCostErrors(t *testing.T) {
	rules := map[string]ratelimit.Rule{
		"FixedWindow":    ratelimit.FixedWindow{Limit: 5, Window: time.Second, Name: "FixedWindow"},
		"SlidingCounter": ratelimit.SlidingCounter{Limit: 5, Window: time.Second, Name: "SlidingCounter"},
	}
	for kind, rule := range rules {
		for _, tc := range []struct {
			name string
			cost ratelimit.Units
			want error
		}{
			{"zero", 0, ratelimit.ErrInvalidCost},
			{"negative", -ratelimit.Unit, ratelimit.ErrInvalidCost},
			{"above the limit", 5*ratelimit.Unit + 1, ratelimit.ErrCostExceedsCapacity},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				lim, err := ratelimit.New(rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
				require.NoError(t, err)
				d, err := lim.Check(tc.cost)
				require.ErrorIs(t, err, tc.want)
				assert.Equal(t, ratelimit.Decision{Limit: 5, Window: time.Second, Policy: kind}, d,
					"an error says only what the policy is")
				d, err = lim.Check(5 * ratelimit.Unit)
				require.NoError(t, err)
				assert.True(t, d.Allowed, "an error spends nothing")
			})
		}
	}
}

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
