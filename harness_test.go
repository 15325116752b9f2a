package ratelimit_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// The model harness: every algorithm is checked field by field against its
// reference model over random rules and random traces on virtual time.
//
// A failing rapid check saves its input under testdata/rapid, which is
// ignored by git and never read back unless asked for with
// -rapid.failfile, so every run starts from its own fresh draws: files left
// by an earlier failure change nothing.

const (
	day  = 24 * time.Hour
	year = 365 * day
)

// namedRates are the rates the design and the docs keep coming back
// to; drawRate mixes them with random ones.
var namedRates = []ratelimit.Rate{
	{Count: 7, Per: 3 * time.Second},
	ratelimit.PerMinute(100),
	ratelimit.PerHour(1_000_003),
	{Count: 1, Per: day},
	ratelimit.PerSecond(10),
	ratelimit.PerSecond(3),
	{Count: 1_000_000, Per: time.Millisecond},
	{Count: 13, Per: 7 * time.Microsecond},
}

func drawRate(t *rapid.T) ratelimit.Rate {
	if rapid.Bool().Draw(t, "namedRate") {
		return rapid.SampledFrom(namedRates).Draw(t, "rate")
	}
	per := rapid.SampledFrom([]time.Duration{
		time.Microsecond, time.Millisecond, time.Second, 3 * time.Second, time.Minute, time.Hour, day, 10 * year,
	}).Draw(t, "per")
	if rapid.Bool().Draw(t, "oddPer") {
		per = time.Duration(rapid.Int64Range(1, int64(per)).Draw(t, "perNs"))
	}
	return ratelimit.Rate{Count: rapid.Int64Range(1, 2_000_000).Draw(t, "count"), Per: per}
}

func drawCapacity(t *rapid.T) int64 {
	return rapid.OneOf(rapid.Int64Range(1, 30), rapid.Int64Range(1, 1_000_000)).Draw(t, "capacity")
}

func drawWindow(t *rapid.T) time.Duration {
	w := rapid.SampledFrom([]time.Duration{
		time.Millisecond, time.Second, 10 * time.Second, time.Minute, time.Hour, day, 10 * year,
	}).Draw(t, "window")
	if rapid.Bool().Draw(t, "oddWindow") {
		w = time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(w)).Draw(t, "windowNs"))
	}
	return w
}

func drawName(t *rapid.T) string {
	return rapid.SampledFrom([]string{"", "api", "login-per-ip"}).Draw(t, "name")
}

// modelCase is one drawn configuration: the rule, a model of it, and the
// time scale to draw advances from (a period or a window).
type modelCase struct {
	rule   ratelimit.Rule
	model  refmodel.Model
	scale  time.Duration
	valid  bool          // whether New must accept the rule
	name   string        // the rule's Name: every Decision's Policy
	window time.Duration // every Decision's Window
}

// traceClock is a ManualClock plus the clamped time a correct limiter must
// be using, for the model's side.
type traceClock struct {
	*ratelimit.ManualClock
	seen int64
}

func (c *traceClock) modelNow() int64 {
	t := int64(c.Now())
	t = min(max(t, 0), int64(ratelimit.MaxTime))
	c.seen = max(c.seen, t)
	return c.seen
}

// traceActions returns the rapid actions shared by every trace test: moving
// the clock (forwards by up to two time scales, by a few nanoseconds, by up
// to two years, or backwards).
func traceActions(clk *traceClock, scale time.Duration) map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"advance": func(t *rapid.T) {
			clk.Advance(time.Duration(rapid.Int64Range(0, 2*int64(scale)).Draw(t, "advance")))
		},
		"nudge": func(t *rapid.T) {
			clk.Advance(time.Duration(rapid.Int64Range(0, 3).Draw(t, "nudge")))
		},
		"leap": func(t *rapid.T) {
			clk.Advance(time.Duration(rapid.Int64Range(0, 2*int64(year)).Draw(t, "leap")))
		},
		"back": func(t *rapid.T) {
			clk.Advance(-time.Duration(rapid.Int64Range(0, int64(scale)).Draw(t, "back")))
		},
	}
}

// drawCost draws a cost from 1 milli-unit to capacity plus two units,
// favouring whole units.
func drawCost(t *rapid.T, capMilli int64) ratelimit.Units {
	return ratelimit.Units(rapid.OneOf(
		rapid.Int64Range(1, capMilli+2000),
		rapid.Map(rapid.Int64Range(1, capMilli/1000+2), func(n int64) int64 { return n * 1000 }),
		rapid.Just(int64(1000)),
	).Draw(t, "cost"))
}

// runModel checks a limiter against its model on one random trace.
func runModel(t *rapid.T, mc modelCase) {
	clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
	lim, err := ratelimit.New(mc.rule, ratelimit.WithClock(clk))
	if !mc.valid {
		require.ErrorIs(t, err, ratelimit.ErrInvalidRule, "rule %+v", mc.rule)
		return
	}
	require.NoError(t, err, "rule %+v", mc.rule)
	capMilli := mc.model.Capacity()
	actions := traceActions(clk, mc.scale)
	actions["check"] = func(t *rapid.T) {
		cost := drawCost(t, capMilli)
		got, err := lim.Check(cost)
		if int64(cost) > capMilli {
			require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
			return
		}
		require.NoError(t, err)
		want := mc.model.Step(clk.modelNow(), int64(cost))
		want.Policy, want.Window = mc.name, mc.window
		require.Equal(t, want, got, "rule %+v at %d cost %d", mc.rule, clk.seen, cost)
	}
	// A settlement charges past the limit or refunds (see settle_test.go):
	// what follows a key in debt must match the model too.
	actions["settle"] = func(t *rapid.T) {
		charged := ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, "charged"))
		at := time.Duration(rapid.Int64Range(0, clk.seen).Draw(t, "at"))
		actual := drawActual(t, capMilli)
		got, settled, err := ratelimit.Settle(lim, charged, actual, at)
		require.NoError(t, err)
		want, wantSettled := settleModel(mc.model, clk.modelNow(), int64(charged), int64(actual), int64(at))
		want.Policy, want.Window = mc.name, mc.window
		require.Equal(t, wantSettled, int64(settled), "settled")
		require.Equal(t, want, got, "rule %+v at %d charged %d actual %d", mc.rule, clk.seen, charged, actual)
	}
	t.Repeat(actions)
}

func TestCostErrors(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 5},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 5},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 5},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5},
	}
	for _, rule := range rules {
		lim, err := ratelimit.New(rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
		require.NoError(t, err)
		for _, tc := range []struct {
			cost ratelimit.Units
			want error
		}{{0, ratelimit.ErrInvalidCost}, {-1, ratelimit.ErrInvalidCost}, {5*ratelimit.Unit + 1, ratelimit.ErrCostExceedsCapacity}} {
			d, err := lim.Check(tc.cost)
			require.Truef(t, errors.Is(err, tc.want), "%T cost %d: %v", rule, tc.cost, err)
			require.Equal(t, ratelimit.Decision{Limit: 5, Window: d.Window}, d, "an error spends nothing and says only what the policy is")
			require.Positive(t, d.Window)
		}
		d, err := lim.Check(5 * ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%T: a fresh key starts full", rule)
	}
}

// Tests never block without a deadline of their own: a Wait that never
// returns, or a goroutine that never finishes, fails the test at once with
// what it was waiting for instead of hanging until go test's timeout.
const (
	// blockTimeout bounds, in real time, a wait for something that takes
	// no real time at all: a Wait on virtual time, a goroutine going to
	// sleep on a ManualClock.
	blockTimeout = 5 * time.Second
	// workTimeout bounds a wait for goroutines doing real work, such as a
	// thousand concurrent checks under the race detector.
	workTimeout = 2 * time.Minute
)

// receive returns the next value from ch, failing the test if none comes
// within blockTimeout.
func receive[T any](t require.TestingT, ch <-chan T, what string) T {
	return receiveWithin(t, ch, blockTimeout, what)
}

func receiveWithin[T any](t require.TestingT, ch <-chan T, timeout time.Duration, what string) T {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		require.FailNow(t, "timed out after "+timeout.String()+" waiting for "+what)
		var zero T
		return zero
	}
}

// bounded runs wait (a Wait) in a goroutine and returns its results,
// failing the test if it has not returned within blockTimeout.
func bounded(t require.TestingT, what string, wait func() (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	res := make(chan waitResult, 1)
	go func() {
		d, err := wait()
		res <- waitResult{d: d, err: err}
	}()
	r := receive(t, res, what)
	return r.d, r.err
}

// waitGroup waits for wg, failing the test if it is not done within
// workTimeout.
func waitGroup(t require.TestingT, wg *sync.WaitGroup, what string) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	receiveWithin(t, done, workTimeout, what)
}
