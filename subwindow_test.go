package ratelimit_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

func TestSubWindowVectors(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		rule     ratelimit.SubWindow
		bursts   []winBurst
		admitted []int // per burst
	}{
		{
			name:     "one bucket is a fixed window: 10 on each side of a boundary",
			rule:     ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 1},
			bursts:   []winBurst{{900 * ms, 10 * ms, 10}, {1000 * ms, 10 * ms, 10}},
			admitted: []int{10, 10},
		},
		{
			name:     "ten buckets: the 10 at 900 ms count until 1900 ms",
			rule:     ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 10},
			bursts:   []winBurst{{900 * ms, 10 * ms, 10}, {1000 * ms, 10 * ms, 10}, {1899 * ms, 0, 1}, {1900 * ms, 0, 1}},
			admitted: []int{10, 0, 0, 1},
		},
		{
			name: "two buckets: the oldest bucket is forgotten whole",
			rule: ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 2},
			// 10 in [0, 500ms) count until 1000 ms, not 1400 ms as the log would.
			bursts:   []winBurst{{400 * ms, 0, 10}, {999 * ms, 0, 1}, {1000 * ms, 0, 10}},
			admitted: []int{10, 0, 10},
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

func TestSubWindowDecisions(t *testing.T) {
	const s = time.Second
	// 100 per 60 s in 6 buckets of 10 s: 30 at 5 s, 50 at 25 s.
	clk := ratelimit.NewManualClock(5 * s)
	lim, err := ratelimit.New(ratelimit.SubWindow{Limit: 100, Window: time.Minute, Buckets: 6}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := lim.Check(30 * ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 70, ResetAfter: 55 * s, At: 5 * s, Window: time.Minute}, d)
	clk.Set(25 * s)
	d, _ = lim.Check(50 * ratelimit.Unit)
	assert.Equal(t, ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 20, ResetAfter: 55 * s, At: 25 * s, Window: time.Minute}, d,
		"the key is fresh when the bucket [20 s, 30 s) leaves, at 80 s")
	// 40 more at 59 s: 80 counted, room for 20. It fits once the bucket
	// [0, 10 s) leaves, at 60 s.
	clk.Set(59 * s)
	d, _ = lim.Check(40 * ratelimit.Unit)
	assert.Equal(t, ratelimit.Decision{Limit: 100, Remaining: 20, RetryAfter: s, ResetAfter: 21 * s, At: 59 * s, Window: time.Minute}, d)
	// 80 at 60 s needs the 50 gone too: at 80 s.
	clk.Set(60 * s)
	d, _ = lim.Check(80 * ratelimit.Unit)
	assert.Equal(t, ratelimit.Decision{Limit: 100, Remaining: 50, RetryAfter: 20 * s, ResetAfter: 20 * s, At: 60 * s, Window: time.Minute}, d)
	clk.Set(80 * s)
	d, _ = lim.Check(80 * ratelimit.Unit)
	assert.True(t, d.Allowed)
}

func TestSubWindowRuleValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  ratelimit.SubWindow
		field string
	}{
		{"no buckets", ratelimit.SubWindow{Limit: 1, Window: time.Second}, "Buckets"},
		{"too many buckets", ratelimit.SubWindow{Limit: 1, Window: time.Second, Buckets: 61}, "Buckets"},
		{"a window that buckets do not divide", ratelimit.SubWindow{Limit: 1, Window: time.Second + 1, Buckets: 6}, "Window"},
		{"no limit", ratelimit.SubWindow{Window: time.Second, Buckets: 6}, "Limit"},
		{"no window", ratelimit.SubWindow{Limit: 1, Buckets: 6}, "Window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ratelimit.New(tc.rule)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			var re *ratelimit.RuleError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, "SubWindow", re.Rule)
			assert.Equal(t, tc.field, re.Field)
		})
	}
	for _, k := range []int{1, 6, 7, 16, 17, 60} {
		_, err := ratelimit.New(ratelimit.SubWindow{Limit: 1, Window: time.Duration(k) * time.Millisecond, Buckets: k})
		assert.NoError(t, err, "buckets %d", k)
	}
}

// TestSubWindowOneBucketIsFixedWindow: with one bucket every Decision is
// the fixed window's.
func TestSubWindowOneBucketIsFixedWindow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit, window := drawCapacity(t), drawWindow(t)
		clk := ratelimit.NewManualClock(0)
		sw, err := ratelimit.New(ratelimit.SubWindow{Limit: limit, Window: window, Buckets: 1}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		fw, err := ratelimit.New(ratelimit.FixedWindow{Limit: limit, Window: window}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		actions := traceActions(&traceClock{ManualClock: clk}, window)
		actions["check"] = func(t *rapid.T) {
			cost := drawCost(t, limit*1000)
			want, werr := fw.Check(cost)
			got, gerr := sw.Check(cost)
			require.Equal(t, werr == nil, gerr == nil)
			require.Equal(t, want, got)
		}
		t.Repeat(actions)
	})
}

// TestSubWindowModel checks SubWindow against its model with every bucket
// count and both settings of CountRefused, on windows the buckets divide.
func TestSubWindowModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, ratelimit.MaxSubWindowBuckets).Draw(t, "buckets")
		g := rapid.OneOf(rapid.Int64Range(1, 50), rapid.Int64Range(1, int64(time.Hour))).Draw(t, "bucketNs")
		window := time.Duration(g * int64(k))
		limit := rapid.OneOf(rapid.Int64Range(1, 5), drawCapacityGen()).Draw(t, "limit")
		refused := rapid.Bool().Draw(t, "countRefused")
		name := drawName(t)
		runModel(t, modelCase{
			rule:  ratelimit.SubWindow{Limit: limit, Window: window, Buckets: k, CountRefused: refused, Name: name},
			model: refmodel.NewSubWindow(limit, window, k, refused),
			scale: window, valid: true, name: name, window: window,
		})
	})
}

func drawCapacityGen() *rapid.Generator[int64] { return rapid.Int64Range(1, 1_000_000) }

func TestSubWindowJSON(t *testing.T) {
	var spec ratelimit.RuleSpec
	require.NoError(t, json.Unmarshal([]byte(`{"algorithm":"sub_window","limit":100,"window":"1m","buckets":6,"count_refused":true}`), &spec))
	assert.Equal(t, ratelimit.SubWindow{Limit: 100, Window: time.Minute, Buckets: 6, CountRefused: true}, spec.Rule)
	b, err := json.Marshal(spec)
	require.NoError(t, err)
	assert.JSONEq(t, `{"algorithm":"sub_window","limit":100,"window":"1m","buckets":6,"count_refused":true}`, string(b))
	b, err = json.Marshal(ratelimit.RuleSpec{Rule: ratelimit.SubWindow{Limit: 5, Window: time.Second, Buckets: 10, Name: "api"}})
	require.NoError(t, err)
	assert.Equal(t, `{"name":"api","algorithm":"sub_window","limit":5,"window":"1s","buckets":10}`, string(b))

	for _, tc := range []struct{ json, want string }{
		{`{"algorithm":"sub_window","limit":1,"window":"1s"}`, `buckets is missing`},
		{`{"algorithm":"sub_window","limit":1,"window":"1s","buckets":61}`, `buckets must be from 1 to 60`},
		{`{"algorithm":"sub_window","limit":1,"window":"1s","buckets":7}`, `window must be a whole multiple of Buckets nanoseconds`},
		{`{"algorithm":"sub_window","limit":1,"window":"1s","buckets":2,"count_refused":1}`, `count_refused must be true or false`},
		{`{"algorithm":"fixed_window","limit":1,"window":"1s","buckets":2}`, `buckets is not a field of fixed_window`},
	} {
		err := json.Unmarshal([]byte(tc.json), &spec)
		require.ErrorIs(t, err, ratelimit.ErrInvalidRule, tc.json)
		assert.Contains(t, err.Error(), tc.want)
	}
}

func TestSubWindowMachine(t *testing.T) {
	m, err := ratelimit.NewMachine(ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 4})
	require.NoError(t, err)
	p := m.Params()
	assert.Equal(t, "sub_window", p.Algorithm)
	assert.Equal(t, int64(4), p.Buckets)
	assert.Equal(t, int64(time.Second), p.WindowNanos)
	d, state, err := m.Step(nil, 600*time.Millisecond, 3*ratelimit.Unit, true)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, "600000000 2 0 0 0 3000", string(state))
	d, state, err = m.Step(state, 1100*time.Millisecond, 8*ratelimit.Unit, true)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, 400*time.Millisecond, d.RetryAfter)
	assert.Equal(t, "1100000000 2 0 0 0 3000", string(state), "a denial changes nothing but the instant")
	for _, bad := range []string{
		"1100000000 5 0 0 0 0",        // a bucket after the instant
		"1100000000 4 0 3000 0",       // too few counts
		"1100000000 4 0 12000 0 9000", // the window above twice the limit
		"1100000000 4 0 3000 0 21000",
		"1100000000 1 1000 0 0 0", // a count before the clock's origin
	} {
		_, _, err := m.Step([]byte(bad), 1100*time.Millisecond, ratelimit.Unit, true)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidState, bad)
	}
}

// TestSubWindowExactSpan is the overshoot bound's proof checked on random
// traces: whatever arrives, the cost admitted in any span of W - W/k + 1 ns
// is at most Limit, and in any span of W at most twice Limit.
func TestSubWindowExactSpan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, ratelimit.MaxSubWindowBuckets).Draw(t, "buckets")
		g := rapid.Int64Range(1, 1000).Draw(t, "bucketNs")
		window := time.Duration(g * int64(k))
		limit := rapid.Int64Range(1, 20).Draw(t, "limit")
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.SubWindow{Limit: limit, Window: window, Buckets: k}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		type admission struct {
			at   time.Duration
			cost int64
		}
		var admitted []admission
		for range rapid.IntRange(1, 200).Draw(t, "requests") {
			clk.Advance(time.Duration(rapid.Int64Range(0, 2*g).Draw(t, "gap")))
			cost := drawCost(t, limit*1000)
			if d, err := lim.Check(cost); err == nil && d.Allowed {
				admitted = append(admitted, admission{clk.Now(), int64(cost)})
			}
		}
		// most is the most admitted in any span (x - span, x].
		most := func(span time.Duration) int64 {
			var best, sum int64
			lo := 0
			for _, a := range admitted {
				sum += a.cost
				for admitted[lo].at <= a.at-span {
					sum -= admitted[lo].cost
					lo++
				}
				best = max(best, sum)
			}
			return best
		}
		require.LessOrEqual(t, most(window-window/time.Duration(k)+1), limit*1000)
		require.LessOrEqual(t, most(window), 2*limit*1000)
	})
}
