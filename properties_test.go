package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// Properties that hold for every algorithm, checked on random rules and
// random traces by replaying the same trace against fresh limiters.

// ruleCase is a drawn, valid rule with its capacity and time scale.
type ruleCase struct {
	rule     ratelimit.Rule
	capMilli int64
	scale    time.Duration
}

func drawValidBucket(t *rapid.T) (ratelimit.Rate, int64) {
	for {
		r, c := drawRate(t), drawCapacity(t)
		if spanFits(r, c) {
			return r, c
		}
	}
}

// forEachKind runs prop as a rapid check for every algorithm, on a random
// valid rule from the algorithm's generator.
func forEachKind(t *testing.T, prop func(t *rapid.T, rc ruleCase)) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				prop(t, ruleCase{a.rule(s), s.capacity * 1000, a.scale(s)})
			})
		})
	}
}

// request is one step of a trace: a cost sent at an absolute time.
type request struct {
	at   time.Duration
	cost ratelimit.Units
}

// drawTrace draws requests at non-decreasing times within the clock's
// range (at most MaxTime), costs within capacity.
func drawTrace(t *rapid.T, rc ruleCase) []request {
	n := rapid.IntRange(1, 40).Draw(t, "requests")
	trace := make([]request, n)
	var at time.Duration
	for i := range trace {
		gap := time.Duration(rapid.OneOf(
			rapid.Just(int64(0)),
			rapid.Int64Range(0, 5),
			rapid.Int64Range(0, 2*int64(rc.scale)),
		).Draw(t, "gap"))
		at += min(gap, ratelimit.MaxTime-at)
		trace[i] = request{at: at, cost: ratelimit.Units(rapid.OneOf(
			rapid.Int64Range(1, rc.capMilli),
			rapid.Just(int64(1000)),
			rapid.Just(rc.capMilli),
		).Draw(t, "cost"))}
	}
	return trace
}

// replay plays trace against a fresh limiter and returns it, its clock and
// the decisions.
func replay(t require.TestingT, rule ratelimit.Rule, trace []request) (ratelimit.Limiter, *ratelimit.ManualClock, []ratelimit.Decision) {
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	ds := make([]ratelimit.Decision, len(trace))
	for i, r := range trace {
		clk.Set(r.at)
		ds[i], err = lim.Check(r.cost)
		require.NoError(t, err)
	}
	return lim, clk, ds
}

// probe replays trace, then sends cost at time at and returns the decision.
func probe(t require.TestingT, rule ratelimit.Rule, trace []request, at time.Duration, cost ratelimit.Units) ratelimit.Decision {
	lim, clk, _ := replay(t, rule, trace)
	clk.Set(at)
	d, err := lim.Check(cost)
	require.NoError(t, err)
	return d
}

func TestRetryAfterIsExact(t *testing.T) {
	forEachKind(t, func(t *rapid.T, rc ruleCase) {
		trace := drawTrace(t, rc)
		_, _, ds := replay(t, rc.rule, trace)
		for i, d := range ds {
			if d.Allowed {
				require.Zero(t, d.RetryAfter, "allowed at step %d", i)
				continue
			}
			require.Positive(t, d.RetryAfter, "denied at step %d", i)
			at := trace[i].at + d.RetryAfter
			if at > ratelimit.MaxTime || at < trace[i].at {
				// The clock stops at MaxTime, before the retry comes.
				require.False(t, probe(t, rc.rule, trace[:i], ratelimit.MaxTime, trace[i].cost).Allowed,
					"step %d: allowed at MaxTime, before RetryAfter %v", i, d.RetryAfter)
				return
			}
			before := trace[i].at + time.Duration(rapid.Int64Range(0, int64(d.RetryAfter)-1).Draw(t, "before"))
			require.True(t, probe(t, rc.rule, trace[:i], at, trace[i].cost).Allowed,
				"step %d: not allowed after RetryAfter %v", i, d.RetryAfter)
			require.False(t, probe(t, rc.rule, trace[:i], at-1, trace[i].cost).Allowed,
				"step %d: allowed 1ns before RetryAfter %v", i, d.RetryAfter)
			require.False(t, probe(t, rc.rule, trace[:i], before, trace[i].cost).Allowed,
				"step %d: allowed %v before RetryAfter %v", i, at-before, d.RetryAfter)
			return // one denial per trace keeps the replays cheap
		}
	})
}

func TestResetAfterIsExact(t *testing.T) {
	forEachKind(t, func(t *rapid.T, rc ruleCase) {
		trace := drawTrace(t, rc)
		resetAfterIsExact(t, rc, trace, rapid.IntRange(0, len(trace)-1).Draw(t, "step"))
	})
	// A full burst spent 6 years in comes back 140.625 years later, after
	// MaxTime (about 146.2 years), where the clock stops.
	t.Run("past MaxTime", func(t *testing.T) {
		rate, burst := ratelimit.Rate{Count: 16, Per: 10 * year}, int64(225)
		for _, a := range testedAlgorithms {
			if !a.bucket {
				continue
			}
			t.Run(a.name, func(t *testing.T) {
				rc := ruleCase{a.rule(settings{rate: rate, capacity: burst}), burst * 1000, rate.Per}
				trace := []request{{at: 6 * year, cost: ratelimit.Units(burst * 1000)}}
				resetAfterIsExact(t, rc, trace, 0)
			})
		}
	})
}

// resetAfterIsExact checks the ResetAfter of step i of trace: at it the
// whole capacity is admitted, one nanosecond before it not. A ResetAfter
// that ends after MaxTime is never reached: at MaxTime, the latest instant
// a clock gives, the whole capacity is still refused.
func resetAfterIsExact(t require.TestingT, rc ruleCase, trace []request, i int) {
	_, _, ds := replay(t, rc.rule, trace)
	d := ds[i]
	full := ratelimit.Units(rc.capMilli)
	at := trace[i].at + d.ResetAfter
	if at > ratelimit.MaxTime || at < trace[i].at {
		require.Positive(t, d.ResetAfter)
		require.False(t, probe(t, rc.rule, trace[:i+1], ratelimit.MaxTime, full).Allowed,
			"full capacity admitted at MaxTime, before ResetAfter %v", d.ResetAfter)
		return
	}
	got := probe(t, rc.rule, trace[:i+1], at, full)
	require.True(t, got.Allowed, "full capacity not admitted after ResetAfter %v", d.ResetAfter)
	require.Zero(t, got.Remaining)
	if d.ResetAfter > 0 {
		require.False(t, probe(t, rc.rule, trace[:i+1], at-1, full).Allowed,
			"full capacity admitted 1ns before ResetAfter %v", d.ResetAfter)
	}
}

func TestDenialSpendsNothing(t *testing.T) {
	forEachKind(t, func(t *rapid.T, rc ruleCase) {
		trace := drawTrace(t, rc)
		_, _, ds := replay(t, rc.rule, trace)
		var kept []request
		var want []ratelimit.Decision
		for i, d := range ds {
			if d.Allowed {
				kept = append(kept, trace[i])
				want = append(want, d)
			}
		}
		// Without the denied requests, the admitted ones see the very same
		// decisions: a denial changed nothing.
		_, _, got := replay(t, rc.rule, kept)
		require.Equal(t, want, got)
	})
}

func TestWaitingNeverHurts(t *testing.T) {
	forEachKind(t, func(t *rapid.T, rc ruleCase) {
		trace := drawTrace(t, rc)
		last := trace[len(trace)-1].at
		cost := ratelimit.Units(rapid.Int64Range(1, rc.capMilli).Draw(t, "cost"))
		// A wait past MaxTime would be cut short by the clock.
		wait := time.Duration(rapid.Int64Range(0, min(3*int64(rc.scale), int64(ratelimit.MaxTime-last))).Draw(t, "wait"))
		now := probe(t, rc.rule, trace, last, cost)
		later := probe(t, rc.rule, trace, last+wait, cost)
		if now.Allowed {
			require.True(t, later.Allowed, "allowed now, denied %v later", wait)
		}
		if !later.Allowed {
			require.Equal(t, now.RetryAfter-wait, later.RetryAfter, "waiting %v did not bring the retry %v closer", wait, now.RetryAfter)
		}
	})
}

func TestBackwardsClockGrantsNothing(t *testing.T) {
	forEachKind(t, func(t *rapid.T, rc ruleCase) {
		// One limiter sees a clock that sometimes jumps back; the other sees
		// the same readings clamped. They must agree on every decision.
		clk, mono := ratelimit.NewManualClock(0), ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(rc.rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		ref, err := ratelimit.New(rc.rule, ratelimit.WithClock(mono))
		require.NoError(t, err)
		var high time.Duration
		for _, r := range drawTrace(t, rc) {
			at := r.at
			if rapid.Bool().Draw(t, "jumpBack") {
				at -= time.Duration(rapid.Int64Range(0, int64(rc.scale)*3).Draw(t, "back"))
			}
			clk.Set(at)
			high = max(high, at)
			mono.Set(high)
			got, err := lim.Check(r.cost)
			require.NoError(t, err)
			want, err := ref.Check(r.cost)
			require.NoError(t, err)
			require.Equal(t, want, got, "clock read %v, highest %v", at, high)
		}
	})
}
