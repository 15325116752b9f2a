package ratelimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// slRequest is one request of a vector: sent at at, it must be admitted or
// not, and when denied wait exactly retry.
type slRequest struct {
	at      time.Duration
	allowed bool
	retry   time.Duration
}

// slBurst returns count requests at start, start+every, ..., all expecting
// the same outcome.
func slBurst(start, every time.Duration, count int, allowed bool, retry func(at time.Duration) time.Duration) []slRequest {
	var rs []slRequest
	for i := range count {
		at := start + time.Duration(i)*every
		r := slRequest{at: at, allowed: allowed}
		if retry != nil {
			r.retry = retry(at)
		}
		rs = append(rs, r)
	}
	return rs
}

func TestSlidingLogVectors(t *testing.T) {
	// 10 per second: the 10 at 900 ms count until 1900 ms.
	tenPerSecond := append(append(
		slBurst(900*ms, 10*ms, 10, true, nil),
		slBurst(1000*ms, 10*ms, 10, false, func(at time.Duration) time.Duration { return 1900*ms - at })...),
		slRequest{at: 1899 * ms, retry: time.Millisecond},
		slRequest{at: 1900 * ms, allowed: true},
	)
	// 10/s from 50 s to 70 s against 100 per minute: the first 100 fill the
	// minute, and none of them leaves it before 110 s.
	hundredPerMinute := append(
		slBurst(50*time.Second, 100*ms, 100, true, nil),
		slBurst(60*time.Second, 100*ms, 100, false, func(at time.Duration) time.Duration { return 110*time.Second - at })...,
	)
	tests := []struct {
		name     string
		rule     ratelimit.SlidingLog
		requests []slRequest
		admitted int
	}{
		{
			name:     "10 per 1 s: 10 at 900..990 ms and 10 at 1000..1090 ms, then 1899 ms and 1900 ms",
			rule:     ratelimit.SlidingLog{Limit: 10, Window: time.Second},
			requests: tenPerSecond,
			admitted: 11,
		},
		{
			name: "5 per 10 s: 0, 1, 2, 2.5, 3, 3.1, 9, 10.5, 10.6 s",
			rule: ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second},
			requests: []slRequest{
				{at: 0, allowed: true},
				{at: 1000 * ms, allowed: true},
				{at: 2000 * ms, allowed: true},
				{at: 2500 * ms, allowed: true},
				{at: 3000 * ms, allowed: true},
				{at: 3100 * ms, retry: 6900 * ms},
				{at: 9000 * ms, retry: 1000 * ms},
				{at: 10500 * ms, allowed: true},
				{at: 10600 * ms, retry: 400 * ms},
			},
			admitted: 6,
		},
		{
			name:     "100 per minute: 200 requests at 10/s from 50 s to 70 s admit 100",
			rule:     ratelimit.SlidingLog{Limit: 100, Window: time.Minute},
			requests: hundredPerMinute,
			admitted: 100,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			admitted := 0
			for i, r := range tc.requests {
				clk.Set(r.at)
				d, err := lim.Check(ratelimit.Unit)
				require.NoError(t, err)
				assert.Equal(t, r.allowed, d.Allowed, "request %d at %v", i, r.at)
				assert.Equal(t, r.retry, d.RetryAfter, "request %d at %v", i, r.at)
				if d.Allowed {
					admitted++
				}
			}
			assert.Equal(t, tc.admitted, admitted)
		})
	}
}

// TestSlidingLogDecisionFields pins every field of a few decisions,
// weighted costs included.
func TestSlidingLogDecisionFields(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second, Name: "login"}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	policy := ratelimit.Decision{Limit: 5, Policy: "login", Window: 10 * time.Second}
	with := func(f func(*ratelimit.Decision)) ratelimit.Decision {
		d := policy
		f(&d)
		return d
	}
	steps := []struct {
		name string
		at   time.Duration
		cost ratelimit.Units
		want ratelimit.Decision
	}{
		{"a fresh key admits 2.5 units", 0, 2*ratelimit.Unit + ratelimit.Unit/2, with(func(d *ratelimit.Decision) {
			d.Allowed, d.Remaining, d.ResetAfter = true, 2, 10*time.Second
		})},
		{"the same instant merges", 0, ratelimit.Unit / 2, with(func(d *ratelimit.Decision) {
			d.Allowed, d.Remaining, d.ResetAfter = true, 2, 10*time.Second
		})},
		{"2 more at 4 s leave 0", 4 * time.Second, 2 * ratelimit.Unit, with(func(d *ratelimit.Decision) {
			d.Allowed, d.Remaining, d.ResetAfter = true, 0, 10*time.Second
		})},
		{"1 more waits for the 3 at 0 s", 5 * time.Second, ratelimit.Unit, with(func(d *ratelimit.Decision) {
			d.RetryAfter, d.ResetAfter = 5*time.Second, 9*time.Second
		})},
		{"4 wait for the 2 at 4 s as well", 5 * time.Second, 4 * ratelimit.Unit, with(func(d *ratelimit.Decision) {
			d.RetryAfter, d.ResetAfter = 9*time.Second, 9*time.Second
		})},
		{"at 10 s the first 3 have expired", 10 * time.Second, ratelimit.Unit, with(func(d *ratelimit.Decision) {
			d.Allowed, d.Remaining, d.ResetAfter = true, 2, 10*time.Second
		})},
		{"a clock stepping back is clamped to the newest admission", 3 * time.Second, 3 * ratelimit.Unit, with(func(d *ratelimit.Decision) {
			d.RetryAfter, d.Remaining, d.ResetAfter = 4*time.Second, 2, 10*time.Second
		})},
	}
	var latest time.Duration
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.Set(st.at)
			d, err := lim.Check(st.cost)
			require.NoError(t, err)
			want := st.want
			latest = max(latest, st.at) // a clock that steps back is clamped
			want.At = latest
			assert.Equal(t, want, d)
		})
	}
}

func TestSlidingLogRuleValidation(t *testing.T) {
	const tenYears = 10 * 365 * 24 * time.Hour
	tests := []struct {
		name  string
		rule  ratelimit.SlidingLog
		field string // "" for a valid rule
	}{
		{"smallest", ratelimit.SlidingLog{Limit: 1, Window: time.Nanosecond}, ""},
		{"1 ms window", ratelimit.SlidingLog{Limit: 5, Window: time.Millisecond}, ""},
		{"10 year window", ratelimit.SlidingLog{Limit: 5, Window: tenYears}, ""},
		{"largest limit", ratelimit.SlidingLog{Limit: 1e15, Window: time.Second}, ""},
		{"largest window", ratelimit.SlidingLog{Limit: 1e15, Window: ratelimit.MaxTime - 1}, ""},
		{"zero rule", ratelimit.SlidingLog{}, "Limit"},
		{"zero limit", ratelimit.SlidingLog{Limit: 0, Window: time.Second}, "Limit"},
		{"negative limit", ratelimit.SlidingLog{Limit: -1, Window: time.Second}, "Limit"},
		{"limit above 1e15", ratelimit.SlidingLog{Limit: 1e15 + 1, Window: time.Second}, "Limit"},
		{"zero window", ratelimit.SlidingLog{Limit: 5}, "Window"},
		{"negative window", ratelimit.SlidingLog{Limit: 5, Window: -time.Second}, "Window"},
		{"window of MaxTime", ratelimit.SlidingLog{Limit: 5, Window: ratelimit.MaxTime}, "Window"},
		{"window beyond MaxTime", ratelimit.SlidingLog{Limit: 5, Window: 1<<63 - 1}, "Window"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(ratelimit.NewManualClock(ratelimit.MaxTime)))
			if tc.field == "" {
				require.NoError(t, err)
				d, err := lim.Check(ratelimit.Units(tc.rule.Limit) * ratelimit.Unit)
				require.NoError(t, err)
				assert.True(t, d.Allowed, "a fresh key admits the whole limit")
				assert.Equal(t, tc.rule.Window, d.ResetAfter)
				return
			}
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.Nil(t, lim)
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re), "%T", err)
			assert.Equal(t, "SlidingLog", re.Rule)
			assert.Equal(t, tc.field, re.Field)
		})
	}
}

func TestSlidingLogCostErrors(t *testing.T) {
	lim, err := ratelimit.New(ratelimit.SlidingLog{Limit: 5, Window: time.Second}, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cost ratelimit.Units
		want error
	}{
		{"zero", 0, ratelimit.ErrInvalidCost},
		{"negative", -ratelimit.Unit, ratelimit.ErrInvalidCost},
		{"above the limit", 5*ratelimit.Unit + 1, ratelimit.ErrCostExceedsCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := lim.Check(tc.cost)
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, ratelimit.Decision{Limit: 5, Window: time.Second}, d)
		})
	}
	d, err := lim.Check(5 * ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "errors spent nothing")
}

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
