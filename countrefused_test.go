package ratelimit_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// refusalView is the part of a Decision that tells a refusal's story.
type refusalView struct {
	Allowed                bool
	Remaining              int64
	RetryAfter, ResetAfter time.Duration
}

func viewOf(d ratelimit.Decision) refusalView {
	return refusalView{d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter}
}

// uncountedCaller is a way to ask about a rule that never counts a
// refusal: a Composite, a plan of layers, CheckWithin, a LayeredMachine
// (a plan of one rule counts one, as a Store does: see
// TestPlansCountRefusedAsStore). It returns
// a function that decides cost for one key at the clock's time.
type uncountedCaller struct {
	name string
	make func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error)
}

var uncountedCallers = []uncountedCaller{
	{"Composite", func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error) {
		c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return func(cost ratelimit.Units) (ratelimit.Decision, error) { return c.Check("k", cost) }
	}},
	{"Composite with a second layer", func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error) {
		c, err := ratelimit.Compose([]ratelimit.Layer{
			{Rule: rule},
			{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1000), Burst: 1000}},
		}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return func(cost ratelimit.Units) (ratelimit.Decision, error) { return c.Check("k", cost) }
	}},
	{"plan of layers", func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error) {
		p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"p": {Layers: []ratelimit.Layer{{Rule: rule}}}}, Default: "p"},
			func(string) string { return "" }, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return func(cost ratelimit.Units) (ratelimit.Decision, error) { return p.Check("k", cost) }
	}},
	{"Store.CheckWithin", func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error) {
		s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return func(cost ratelimit.Units) (ratelimit.Decision, error) { return s.CheckWithin("k", cost, time.Hour) }
	}},
	{"LayeredMachine", func(t require.TestingT, rule ratelimit.Rule, clk *ratelimit.ManualClock) func(ratelimit.Units) (ratelimit.Decision, error) {
		lm, err := ratelimit.NewLayeredMachine([]ratelimit.Layer{{Rule: rule}})
		require.NoError(t, err)
		states := make([][]byte, 1)
		return func(cost ratelimit.Units) (ratelimit.Decision, error) {
			d, next, _, err := lm.Step(states, clk.Now(), cost, true)
			states = next
			return d, err
		}
	}},
}

// TestCountRefusedUncountedCallers: a caller that never counts a refusal
// (a Composite, a plan of layers, CheckWithin, a LayeredMachine) reports a refusal
// of a rule with CountRefused as uncounted, for RetryAfter is when this
// same request passes; Check on the rule itself counts it and says so.
func TestCountRefusedUncountedCallers(t *testing.T) {
	const s = time.Second
	type req struct {
		at   time.Duration
		cost int64
	}
	for _, tc := range []struct {
		name               string
		rule               ratelimit.Rule
		trace              []req
		uncounted, counted refusalView // the last request's, without and with counting it
	}{
		{
			// Nothing is counted at 10 s, so 1 passes when the estimate is
			// 10 x (W-e)/W <= 9, at 11 s; the window's 10 weigh until 20 s.
			// Counted, the 1 makes it 10 x (W-e)/W <= 8 and the key full
			// until the next window ends.
			name:      "sliding counter",
			rule:      ratelimit.SlidingCounter{Limit: 10, Window: 10 * s, CountRefused: true},
			trace:     []req{{0, 10}, {10 * s, 1}},
			uncounted: refusalView{RetryAfter: 1 * s, ResetAfter: 10 * s},
			counted:   refusalView{RetryAfter: 2 * s, ResetAfter: 20 * s},
		},
		{
			// The window [0.5 s, 1.5 s] holds 1 (bucket 0, until 2 s): 1
			// left; the 2 fits when bucket 0 leaves. Counted, bucket 1 holds
			// 2 and the 2 fits only when it leaves at 3 s.
			name:      "sub-window",
			rule:      ratelimit.SubWindow{Limit: 2, Window: 2 * s, Buckets: 2, CountRefused: true},
			trace:     []req{{0, 1}, {1500 * time.Millisecond, 2}},
			uncounted: refusalView{Remaining: 1, RetryAfter: 500 * time.Millisecond, ResetAfter: 500 * time.Millisecond},
			counted:   refusalView{RetryAfter: 1500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			last := len(tc.trace) - 1
			for _, c := range uncountedCallers {
				t.Run(c.name, func(t *testing.T) {
					clk := ratelimit.NewManualClock(0)
					check := c.make(t, tc.rule, clk)
					var d ratelimit.Decision
					for i, r := range tc.trace {
						clk.Set(r.at)
						var err error
						d, err = check(ratelimit.Units(r.cost) * ratelimit.Unit)
						require.NoError(t, err)
						require.Equal(t, i < last, d.Allowed, "request %d", i)
					}
					assert.Equal(t, tc.uncounted, viewOf(d))
					// Nothing was counted: the same request passes at RetryAfter.
					clk.Advance(d.RetryAfter - 1)
					d, err := check(ratelimit.Units(tc.trace[last].cost) * ratelimit.Unit)
					require.NoError(t, err)
					assert.False(t, d.Allowed, "1 ns before RetryAfter")
					clk.Advance(1)
					d, err = check(ratelimit.Units(tc.trace[last].cost) * ratelimit.Unit)
					require.NoError(t, err)
					assert.True(t, d.Allowed, "at RetryAfter")
				})
			}
			// The rule's own Check counts the refusal, and its Peek, and a
			// Store's, report it as Check does.
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			store, err := ratelimit.NewStore(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			for i, r := range tc.trace {
				clk.Set(r.at)
				cost := ratelimit.Units(r.cost) * ratelimit.Unit
				if i == last {
					d, err := ratelimit.Peek(lim, cost)
					require.NoError(t, err)
					assert.Equal(t, tc.counted, viewOf(d), "Peek")
					d, err = store.Peek("k", cost)
					require.NoError(t, err)
					assert.Equal(t, tc.counted, viewOf(d), "Store.Peek")
				}
				d, err := lim.Check(cost)
				require.NoError(t, err)
				ds, err := store.Check("k", cost)
				require.NoError(t, err)
				if i == last {
					assert.Equal(t, tc.counted, viewOf(d), "Check")
					assert.Equal(t, tc.counted, viewOf(ds), "Store.Check")
				}
			}
		})
	}
}

// TestCountRefusedWaitWakesWhenAdmitted: Wait never counts a refusal, so
// it sleeps exactly until the request it did not count passes. The rule
// admits 10 at 0; a Wait for 1 started at 10 s must wake at 11 s.
func TestCountRefusedWaitWakesWhenAdmitted(t *testing.T) {
	const s = time.Second
	rule := ratelimit.SlidingCounter{Limit: 10, Window: 10 * s, CountRefused: true}
	type waiter func(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error)
	for _, tc := range []struct {
		name string
		make func(t *testing.T, clk *ratelimit.ManualClock) waiter
	}{
		{"New", func(t *testing.T, clk *ratelimit.ManualClock) waiter {
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return lim.Wait
		}},
		{"Store", func(t *testing.T, clk *ratelimit.ManualClock) waiter {
			st, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return func(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error) {
				return st.Wait(ctx, "k", cost)
			}
		}},
		{"Composite", func(t *testing.T, clk *ratelimit.ManualClock) waiter {
			c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return func(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error) {
				return c.Wait(ctx, "k", cost)
			}
		}},
		{"Plans", func(t *testing.T, clk *ratelimit.ManualClock) waiter {
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"p": {Rule: rule}}, Default: "p"},
				func(string) string { return "" }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return func(ctx context.Context, cost ratelimit.Units) (ratelimit.Decision, error) {
				return p.Wait(ctx, "k", cost)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
			defer cancel()
			clk := ratelimit.NewManualClock(0)
			wait := tc.make(t, clk)
			d, err := wait(ctx, 10*ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clk.Set(10 * s)
			res := make(chan waitResult, 1)
			go func() {
				d, err := wait(ctx, ratelimit.Unit)
				res <- waitResult{d, err, clk.Now()}
			}()
			at, done := nextWake(t, clk, res)
			require.Nil(t, done, "the request is refused at 10 s: Wait sleeps")
			assert.Equal(t, 11*s, at)
			clk.Set(at)
			select {
			case r := <-res:
				require.NoError(t, r.err)
				assert.True(t, r.d.Allowed)
				assert.Equal(t, 11*s, r.d.At)
			case <-ctx.Done():
				t.Fatal("Wait did not return once its request passed")
			}
		})
	}
}

// TestCountRefusedUncountedRetryAfterIsExact: for every caller that never
// counts a refusal, a refused request sent again at RetryAfter is
// admitted, and 1 ns before it is not, with nothing else arriving, under
// rules that count refusals.
func TestCountRefusedUncountedRetryAfterIsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 20).Draw(t, "limit")
		var rule ratelimit.Rule
		var window time.Duration
		if rapid.Bool().Draw(t, "subWindow") {
			k := rapid.IntRange(1, 6).Draw(t, "buckets")
			window = time.Duration(k) * time.Duration(rapid.Int64Range(1, int64(10*time.Second)).Draw(t, "bucket"))
			rule = ratelimit.SubWindow{Limit: limit, Window: window, Buckets: k, CountRefused: true}
		} else {
			window = time.Duration(rapid.Int64Range(1, int64(time.Minute)).Draw(t, "window"))
			rule = ratelimit.SlidingCounter{Limit: limit, Window: window, CountRefused: true}
		}
		c := uncountedCallers[rapid.IntRange(0, len(uncountedCallers)-1).Draw(t, "caller")]
		clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "start")))
		check := c.make(t, rule, clk)
		refusals := 0
		for i, n := 0, rapid.IntRange(1, 60).Draw(t, "requests"); i < n; i++ {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(window)).Draw(t, "gap")) / time.Duration(rapid.SampledFrom([]int64{1, 1, 4, 16}).Draw(t, "shrink")))
			cost := ratelimit.Units(rapid.Int64Range(1, limit*1000).Draw(t, "cost"))
			d, err := check(cost)
			require.NoError(t, err)
			if d.Allowed {
				continue
			}
			refusals++
			require.Positive(t, d.RetryAfter, "%s: a refusal waits", c.name)
			clk.Advance(d.RetryAfter - 1)
			early, err := check(cost)
			require.NoError(t, err)
			require.False(t, early.Allowed, "%s: refused 1 ns before RetryAfter %v", c.name, d.RetryAfter)
			clk.Advance(1)
			late, err := check(cost)
			require.NoError(t, err)
			require.True(t, late.Allowed, "%s: admitted at RetryAfter %v", c.name, d.RetryAfter)
		}
		t.Logf("%d refusals", refusals)
	})
}

// TestPlansCountRefusedAsStore: a plan of one rule that counts refusals
// (CountRefused) gives, on a trace of checks and looks, the Decisions a
// Store of that rule gives (Policy aside: the plan's name): its checks
// count a refusal, as the Store's do, and its looks report one as counted.
// A key that moves onto the plan with debt has its first, refused check
// counted too.
func TestPlansCountRefusedAsStore(t *testing.T) {
	const s = time.Second
	for _, rule := range []ratelimit.Rule{
		ratelimit.SlidingCounter{Limit: 10, Window: 10 * s, CountRefused: true},
		ratelimit.SubWindow{Limit: 10, Window: 10 * s, Buckets: 5, CountRefused: true},
	} {
		t.Run(fmt.Sprintf("%T", rule), func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			on := "p"
			plans, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
				"p": {Rule: rule},
				"o": {Rule: ratelimit.FixedWindow{Limit: 10, Window: 10 * s}},
			}, Default: "p"}, func(string) string { return on }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			for at := time.Duration(0); at < 40*s; at += 100 * time.Millisecond {
				clk.Set(at)
				want, err := store.Peek("k", ratelimit.Unit)
				require.NoError(t, err)
				got, err := plans.Peek("k", ratelimit.Unit)
				require.NoError(t, err)
				got.Policy = ""
				require.Equal(t, want, got, "look at %v", at)
				want, err = store.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				got, err = plans.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				got.Policy = ""
				require.Equal(t, want, got, "check at %v", at)
			}

			// A key spent on "o" moves to "p" with 8 of 10 in use: its
			// first check there, of 5, is refused and counted (the moved
			// key takes the attempt's path, not the held key's).
			on = "o"
			d, err := plans.Check("m", 8*ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			on = "p"
			d, err = plans.Check("m", 5*ratelimit.Unit)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			after, err := plans.Peek("m", ratelimit.Unit)
			require.NoError(t, err)
			assert.False(t, after.Allowed, "the 5 refused were counted: 10 of 10 in use, not 8")
		})
	}
}
