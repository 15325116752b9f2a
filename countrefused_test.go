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

// hammer sends one request every `every` from `from` to `to` (excluded) and
// returns how many were admitted in each window of w from 0.
func hammer(t *testing.T, rule ratelimit.Rule, from, to, every, w time.Duration) []int {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	admitted := make([]int, int((to+w-1)/w))
	for at := from; at < to; at += every {
		clk.Set(at)
		d, err := lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		if d.Allowed {
			admitted[at/w]++
		}
	}
	return admitted
}

func TestCountRefusedVectors(t *testing.T) {
	const s = time.Second
	minute := time.Minute
	tests := []struct {
		name     string
		rule     ratelimit.Rule
		from, to time.Duration
		admitted []int // per minute
	}{
		// 10 a second from 50 s to 70 s against 100 per minute: the first 100
		// fill the window; of the second 100 the plain counter admits 16 as
		// the estimate falls, the counting one none, as every refusal keeps
		// the estimate up.
		{"sliding counter, the 200 requests", ratelimit.SlidingCounter{Limit: 100, Window: minute}, 50 * s, 70 * s, []int{100, 16}},
		{"sliding counter counting refusals, the 200 requests", ratelimit.SlidingCounter{Limit: 100, Window: minute, CountRefused: true}, 50 * s, 70 * s, []int{100, 0}},
		// A client that keeps hammering at 10 a second for four minutes gets a
		// slice of every new window from the plain counter, and nothing after
		// its first 100 from the counting one.
		{"sliding counter, hammering", ratelimit.SlidingCounter{Limit: 100, Window: minute}, 0, 4 * minute, []int{100, 99, 99, 99}},
		{"sliding counter counting refusals, hammering", ratelimit.SlidingCounter{Limit: 100, Window: minute, CountRefused: true}, 0, 4 * minute, []int{100, 0, 0, 0}},
		{"sub-window counter, hammering", ratelimit.SubWindow{Limit: 100, Window: minute, Buckets: 6}, 0, 4 * minute, []int{100, 100, 100, 100}},
		{"sub-window counter counting refusals, hammering", ratelimit.SubWindow{Limit: 100, Window: minute, Buckets: 6, CountRefused: true}, 0, 4 * minute, []int{100, 0, 0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.admitted, hammer(t, tc.rule, tc.from, tc.to, 100*time.Millisecond, minute))
		})
	}
}

// TestCountRefusedDecision: a refusal spends, and its Decision is about the
// key after it.
func TestCountRefusedDecision(t *testing.T) {
	const s = time.Second
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(ratelimit.SlidingCounter{Limit: 10, Window: 10 * s, CountRefused: true}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, _ := lim.Check(8 * ratelimit.Unit)
	require.True(t, d.Allowed)
	// 5 more is refused and counted: the window holds 10 (the cap), and the
	// request fits when 10 x (W-e)/W <= 5, 5 s into the next window.
	d, _ = lim.Check(5 * ratelimit.Unit)
	assert.Equal(t, ratelimit.Decision{Limit: 10, Remaining: 0, RetryAfter: 15 * s, ResetAfter: 20 * s, Window: 10 * s}, d)
	clk.Set(15*s - 1)
	d, _ = lim.Check(5 * ratelimit.Unit)
	assert.False(t, d.Allowed, "refused, and counted in the new window")
	assert.Equal(t, 5*s+1, d.RetryAfter, "the 5 counted now weigh nothing alone at the next window's start")

	// Without the option the same refusal spends nothing.
	clk.Set(0)
	plain, err := ratelimit.New(ratelimit.SlidingCounter{Limit: 10, Window: 10 * s}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	plain.Check(8 * ratelimit.Unit)
	d, _ = plain.Check(5 * ratelimit.Unit)
	assert.Equal(t, ratelimit.Decision{Limit: 10, Remaining: 2, RetryAfter: 10*s + 3750*time.Millisecond, ResetAfter: 20 * s, Window: 10 * s}, d)
}

// TestSlidingCounterCountRefusedModel checks the option against the model.
func TestSlidingCounterCountRefusedModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit, window := drawCapacity(t), drawWindow(t)
		if rapid.Bool().Draw(t, "small") {
			limit = rapid.Int64Range(1, 5).Draw(t, "smallLimit")
		}
		name := drawName(t)
		runModel(t, modelCase{
			rule:  ratelimit.SlidingCounter{Limit: limit, Window: window, CountRefused: true, Name: name},
			model: refmodel.NewSlidingCounter(limit, window).WithCountRefused(),
			scale: window, valid: true, name: name, window: window,
		})
	})
}

func TestCountRefusedJSON(t *testing.T) {
	var spec ratelimit.RuleSpec
	require.NoError(t, json.Unmarshal([]byte(`{"algorithm":"sliding_counter","limit":100,"window":"1m","count_refused":true}`), &spec))
	assert.Equal(t, ratelimit.SlidingCounter{Limit: 100, Window: time.Minute, CountRefused: true}, spec.Rule)
	b, err := json.Marshal(spec)
	require.NoError(t, err)
	assert.Equal(t, `{"algorithm":"sliding_counter","limit":100,"window":"1m","count_refused":true}`, string(b))
	require.NoError(t, json.Unmarshal([]byte(`{"algorithm":"sliding_counter","limit":100,"window":"1m","count_refused":false}`), &spec))
	assert.Equal(t, ratelimit.SlidingCounter{Limit: 100, Window: time.Minute}, spec.Rule)
	err = json.Unmarshal([]byte(`{"algorithm":"fixed_window","limit":100,"window":"1m","count_refused":true}`), &spec)
	assert.ErrorContains(t, err, "count_refused is not a field of fixed_window")
	m, err := ratelimit.NewMachine(ratelimit.SlidingCounter{Limit: 1, Window: time.Second, CountRefused: true})
	require.NoError(t, err)
	assert.True(t, m.Params().CountRefused)
}
