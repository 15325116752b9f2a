package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// drawMachineRule draws a rule for the Machine tests: half the time one
// with small capacities, whose traces reach the limit, and half the time
// one from the whole accepted range, whose numbers go far past 2^53.
func drawMachineRule(t *rapid.T) (ratelimit.Rule, time.Duration) {
	if rapid.Bool().Draw(t, "wholeRange") {
		rule := drawRuleSpec(t).Rule
		scale := time.Duration(rapid.Int64Range(1, int64(100*year)).Draw(t, "scale"))
		return rule, scale
	}
	lc := drawLimitCase(t, rapid.SampledFrom(testedAlgorithms).Draw(t, "algorithm"))
	return lc.rule, lc.scale
}

// machinePair is a Machine and the single-key limiter of the same rule on
// a manual clock, for the tests that run one trace on both.
type machinePair struct {
	m        *ratelimit.Machine
	lim      ratelimit.Limiter
	clk      *ratelimit.ManualClock
	scale    time.Duration
	capacity ratelimit.Units
}

// drawMachinePair draws a rule (see drawMachineRule) and a start instant.
func drawMachinePair(t *rapid.T) machinePair {
	rule, scale := drawMachineRule(t)
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, int64(ratelimit.MaxTime)).Draw(t, "start")))
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	return machinePair{m: m, lim: lim, clk: clk, scale: scale, capacity: m.Params().Capacity}
}

// move draws the clock's next move: back, a leap of up to ten years, or a
// gap. With still, two moves in ten leave it where it is (an operation
// that follows the one before it at once).
func (p machinePair) move(t *rapid.T, still bool) {
	switch mv := rapid.IntRange(0, 9).Draw(t, "move"); {
	case mv == 0:
		p.clk.Set(p.clk.Now() - time.Duration(rapid.Int64Range(0, int64(p.scale)).Draw(t, "back")))
	case mv == 1:
		p.clk.Advance(time.Duration(rapid.Int64Range(0, int64(10*year)).Draw(t, "leap")))
	case still && mv <= 3:
	default:
		p.clk.Advance(time.Duration(rapid.Int64Range(0, int64(p.scale)/4+1).Draw(t, "gap")))
	}
}

// cost draws a cost from 1 to over past the capacity, or one of a few
// whole units (at most the capacity).
func (p machinePair) cost(t *rapid.T, over int64) ratelimit.Units {
	cost := ratelimit.Units(rapid.Int64Range(1, int64(p.capacity)+over).Draw(t, "cost"))
	if rapid.IntRange(0, 3).Draw(t, "whole") == 0 {
		cost = min(p.capacity, ratelimit.Unit*ratelimit.Units(rapid.Int64Range(1, 3).Draw(t, "units")))
	}
	return cost
}

// check checks cost on the limiter and steps state at now on the Machine,
// requires the same Decision, and returns it and the state written.
func (p machinePair) check(t *rapid.T, i int, state []byte, now time.Duration, cost ratelimit.Units) (ratelimit.Decision, []byte) {
	want, err := p.lim.Check(cost)
	require.NoError(t, err)
	got, next, err := p.m.Step(state, now, cost, true)
	require.NoError(t, err, "step %d on state %q", i, state)
	require.Equal(t, want, got, "step %d at %d, cost %d, state %q", i, now, cost, state)
	return got, next
}

// TestMachineMatchesLimiter checks that a Machine stepping an encoded
// state decides exactly as the single-key limiter does, field by field,
// on the same trace, backwards clock readings and leaps of years included,
// and that every state it writes reads back to itself.
func TestMachineMatchesLimiter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawMachinePair(t)
		var state []byte
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < n; i++ {
			p.move(t, false)
			cost := p.cost(t, 0)
			now := p.clk.Now()
			peek, same, err := p.m.Step(state, now, cost, false)
			require.NoError(t, err)
			require.Equal(t, string(state), string(same), "a look changes nothing")
			got, next := p.check(t, i, state, now, cost)
			require.Equal(t, got, peek, "the look decides as the check does")
			// What was written reads back (the next step decides on it,
			// and must again agree with the limiter).
			_, _, err = p.m.Step(next, 0, 1, false)
			require.NoError(t, err, "state %q does not read back", next)
			state = next
		}
	})
}

func TestMachineParams(t *testing.T) {
	m, err := ratelimit.NewMachine(ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 5, Name: "odd"})
	require.NoError(t, err)
	p := m.Params()
	// 7000 milli-units per 3e9 ns is 7 per 3e6 in lowest terms; the burst
	// of 5000 milli-units takes 5000*3e6/7 ns = 2142857142 + 6/7 ns.
	assert.Equal(t, ratelimit.Params{
		Algorithm: "token_bucket", Policy: "odd", Limit: 5, Window: 2142857143,
		Capacity:  5 * ratelimit.Unit,
		RateUnits: 7, RateNanos: 3_000_000, TauNanos: 2_142_857_142, TauFrac: 6,
	}, p)
	ns, frac := m.Span(ratelimit.Unit)
	assert.Equal(t, [2]uint64{428_571_428, 4}, [2]uint64{ns, frac}, "one unit takes 3e9/7 ns")
	ns, frac = m.Span(6 * ratelimit.Unit)
	assert.Zero(t, ns+frac, "a cost above the capacity has no span")

	w, err := ratelimit.NewMachine(&ratelimit.SlidingCounter{Limit: 100, Window: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Params{
		Algorithm: "sliding_counter", Limit: 100, Window: time.Minute,
		Capacity: 100 * ratelimit.Unit, WindowNanos: int64(time.Minute),
	}, w.Params())
}

// TestMachineRefusesBadStates checks that a state no check could have
// written is an error that admits nothing, never a decision.
func TestMachineRefusesBadStates(t *testing.T) {
	const now = 10 * time.Second
	gcra := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}
	for _, c := range []struct {
		name  string
		rule  ratelimit.Rule
		state string
	}{
		{"garbage", gcra, "hello"},
		{"sign", gcra, "-1 0 0"},
		{"leading zero", gcra, "01 0 0"},
		{"double space", gcra, "1  0 0"},
		{"trailing space", gcra, "1 0 0 "},
		{"too long a number", gcra, "99999999999999999999 0 0"},
		{"too few", gcra, "1 5"},
		{"too many", gcra, "1 5 0 0"},
		{"huge arrival time", gcra, "1 4000000000000000000 0"},
		{"beyond twice the burst", gcra, "10000000000 14000000001 0"},
		{"fraction out of range", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 2}, "1 1 7"},
		{"instant beyond MaxTime", gcra, "4611686018427387905 0 0"},
		{"count above twice the limit", ratelimit.FixedWindow{Limit: 5, Window: time.Second}, "1 1 10001"},
		{"window in the future", ratelimit.FixedWindow{Limit: 5, Window: time.Second}, "1 12 1"}, // 11, the next window, is a moved-in count
		{"counter above twice the limit", ratelimit.SlidingCounter{Limit: 5, Window: time.Second}, "1 1 10001 0"},
		{"log out of order", ratelimit.SlidingLog{Limit: 5, Window: time.Second}, "9000000000 2 1000 1 1000"},
		{"log over twice the limit", ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, "9000000000 2 1000 3 1001"},
		{"log entry over twice the limit", ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, "9000000000 2 2001"},
		{"log zero cost", ratelimit.SlidingLog{Limit: 5, Window: time.Second}, "9000000000 2 0"},
		{"log odd", ratelimit.SlidingLog{Limit: 5, Window: time.Second}, "9000000000 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ratelimit.NewMachine(c.rule)
			require.NoError(t, err)
			d, next, err := m.Step([]byte(c.state), now, ratelimit.Unit, true)
			require.ErrorIs(t, err, ratelimit.ErrInvalidState)
			assert.False(t, d.Allowed)
			assert.Equal(t, c.state, string(next), "the state is returned as it was")
		})
	}
}

func TestNilRulePointersAreErrors(t *testing.T) {
	rules := []ratelimit.Rule{
		nil, (*ratelimit.TokenBucket)(nil), (*ratelimit.GCRA)(nil), (*ratelimit.LeakyBucket)(nil),
		(*ratelimit.FixedWindow)(nil), (*ratelimit.SlidingLog)(nil), (*ratelimit.SlidingCounter)(nil),
	}
	for _, r := range rules {
		_, err := ratelimit.New(r)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidRule, "New(%T)", r)
		_, err = ratelimit.NewStore(r)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidRule, "NewStore(%T)", r)
		_, err = ratelimit.Compose([]ratelimit.Layer{{Rule: r}})
		assert.ErrorIs(t, err, ratelimit.ErrInvalidRule, "Compose(%T)", r)
		_, err = ratelimit.NewMachine(r)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidRule, "NewMachine(%T)", r)
	}
}

func TestCheckContext(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 1, Window: time.Second, Name: "one"}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Second, Name: "one"}}}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for name, lim := range map[string]ratelimit.ContextChecker{"Store": s, "Composite": c} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			d, err := lim.CheckContext(ctx, "k", ratelimit.Unit)
			require.ErrorIs(t, err, context.Canceled)
			assert.False(t, d.Allowed)
			assert.Equal(t, "one", d.Policy)
			// Nothing was spent: the one unit is still there.
			d, err = lim.CheckContext(context.Background(), "k", ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			d, err = lim.CheckContext(context.Background(), "k", ratelimit.Unit)
			require.NoError(t, err)
			assert.False(t, d.Allowed)
		})
	}
}

// TestCheckWithinSpendsNothing: a leaky bucket whose queue is longer than
// the caller will wait refuses without spending, with the exact RetryAfter
// after which the same request fits.
func TestCheckWithinSpendsNothing(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10, Name: "q"}
	s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	const maxDelay = 500 * time.Millisecond
	// Delays 0, 200, 400 ms fit; the fourth would wait 600 ms.
	for i := range 3 {
		d, err := s.CheckWithin("k", ratelimit.Unit, maxDelay)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, time.Duration(i)*200*time.Millisecond, d.Delay)
	}
	for range 5 { // refused again and again, spending nothing
		d, err := s.CheckWithin("k", ratelimit.Unit, maxDelay)
		require.NoError(t, err)
		assert.Equal(t, ratelimit.Decision{
			Limit: 10, Remaining: 7, RetryAfter: 100 * time.Millisecond,
			ResetAfter: 600 * time.Millisecond, Policy: "q", Window: 2 * time.Second,
		}, d)
	}
	clk.Advance(99 * time.Millisecond)
	d, err := s.CheckWithin("k", ratelimit.Unit, maxDelay)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Millisecond, d.RetryAfter)
	clk.Advance(time.Millisecond)
	d, err = s.CheckWithin("k", ratelimit.Unit, maxDelay)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, maxDelay, d.Delay)
}

// TestCompositeCheckWithinNamesTheQueue: the refusal of a request that
// would queue too long describes the layer whose queue it is, not the
// layer with the least Remaining, and a client that obeys its RetryAfter is
// admitted at its first retry.
func TestCompositeCheckWithinNamesTheQueue(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 1, Per: 10 * time.Second}, Capacity: 100, Name: "queue"}},
		{Rule: ratelimit.FixedWindow{Limit: 2, Window: 10 * time.Millisecond, Name: "burst"}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	const maxDelay = 15 * time.Second
	admitted := 0
	for i := range 40 {
		d, err := c.CheckWithin("k", ratelimit.Unit, maxDelay)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
			require.LessOrEqual(t, d.Delay, maxDelay)
			clk.Advance(10 * time.Millisecond)
			continue
		}
		require.Equal(t, "queue", d.Policy, "request %d", i)
		// Obey RetryAfter: the next attempt is admitted.
		clk.Advance(d.RetryAfter)
		d, err = c.CheckWithin("k", ratelimit.Unit, maxDelay)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d, retried after %v", i, d.RetryAfter)
		admitted++
	}
	assert.Equal(t, 40, admitted)
}

// TestCompositeRemainingIsTheComposites: a refused composite's Remaining is
// the largest cost the whole composite admits at that instant.
func TestCompositeRemainingIsTheComposites(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := ratelimit.NewManualClock(0)
		layers := drawLayers(t, "", false)
		c := compose(t, layers, clk, nil)
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "requests"); i < n; i++ {
			clk.Advance(drawGap(t, layers))
			key, cost := drawRequest(t, layers)
			d, err := c.Check(key, cost)
			if err != nil || d.Allowed || d.Remaining == 0 {
				continue
			}
			r := ratelimit.Units(d.Remaining) * ratelimit.Unit
			again, err := c.Check(key, r)
			require.NoError(t, err)
			require.True(t, again.Allowed, "Remaining %d said after a refusal, then refused", d.Remaining)
		}
	})
}

func TestSleepOnManualClock(t *testing.T) {
	clk := ratelimit.NewManualClock(time.Second)
	done := make(chan error, 1)
	go func() { done <- ratelimit.Sleep(context.Background(), clk, 3*time.Second) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1), "waiting for Sleep to sleep")
	clk.Advance(3*time.Second - 1)
	select {
	case <-done:
		t.Fatal("Sleep returned before its time")
	default:
	}
	clk.Advance(1)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Sleep did not return when the clock reached its time")
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	require.ErrorIs(t, ratelimit.Sleep(cctx, clk, time.Hour), context.Canceled)
	require.NoError(t, ratelimit.Sleep(context.Background(), clk, 0))
}

// countingClock counts its readings.
type countingClock struct {
	*ratelimit.ManualClock
	reads chan struct{}
}

func (c countingClock) Now() time.Duration {
	select {
	case c.reads <- struct{}{}:
	default:
	}
	return c.ManualClock.Now()
}

// TestWaitNeverSpinsPastMaxTime: a SlidingCounter with a 100-year window,
// checked on a clock past one window, denies with a RetryAfter that runs
// past MaxTime. Wait must block until its context ends, not spin reading
// the clock.
func TestWaitNeverSpinsPastMaxTime(t *testing.T) {
	rule := ratelimit.SlidingCounter{Limit: 1, Window: 100 * year}
	for name, build := range map[string]func(ratelimit.Clock) func(context.Context) (ratelimit.Decision, error){
		"Limiter": func(c ratelimit.Clock) func(context.Context) (ratelimit.Decision, error) {
			l, err := ratelimit.New(rule, ratelimit.WithClock(c))
			require.NoError(t, err)
			return func(ctx context.Context) (ratelimit.Decision, error) { return l.Wait(ctx, ratelimit.Unit) }
		},
		"Store": func(c ratelimit.Clock) func(context.Context) (ratelimit.Decision, error) {
			s, err := ratelimit.NewStore(rule, ratelimit.WithClock(c))
			require.NoError(t, err)
			return func(ctx context.Context) (ratelimit.Decision, error) { return s.Wait(ctx, "k", ratelimit.Unit) }
		},
		"Composite": func(c ratelimit.Clock) func(context.Context) (ratelimit.Decision, error) {
			cp, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, ratelimit.WithClock(c))
			require.NoError(t, err)
			return func(ctx context.Context) (ratelimit.Decision, error) { return cp.Wait(ctx, "k", ratelimit.Unit) }
		},
	} {
		t.Run(name, func(t *testing.T) {
			clk := countingClock{ratelimit.NewManualClock(150 * year), make(chan struct{}, 1000)}
			wait := build(clk)
			d, err := wait(context.Background()) // admitted at once
			require.NoError(t, err)
			require.True(t, d.Allowed)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { _, err := wait(ctx); done <- err }()
			deadline := time.After(5 * time.Second)
			// A spinning Wait reads the clock over and over; a blocked one
			// reads it a few times at most.
			for reads := 0; reads < 100; reads++ {
				select {
				case <-clk.reads:
				case <-time.After(100 * time.Millisecond):
					reads = 100 // quiet: it blocks
				case <-deadline:
					t.Fatal("waiting for Wait to block")
				}
				if reads == 99 {
					t.Fatal("Wait keeps reading the clock: it spins")
				}
			}
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-deadline:
				t.Fatal("Wait did not return when its context ended")
			}
		})
	}
}

// pastDeadline is a context whose deadline has passed but whose Err is
// still nil, as a context is for a moment before its timer fires.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }

func TestAllShadowCompositeWaitNeverRefuses(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Second}, Shadow: true},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for i := range 3 {
		d, err := c.Wait(pastDeadline{context.Background()}, "k", ratelimit.Unit)
		require.NoError(t, err, "attempt %d", i)
		assert.True(t, d.Allowed)
		assert.Equal(t, i > 0, d.Shadowed)
	}
}

// TestManyShardsAllocateAsKeysArrive: a store's tables are allocated as
// keys arrive; an empty store costs its shards' headers only.
func TestManyShardsAllocateAsKeysArrive(t *testing.T) {
	allocs := testing.AllocsPerRun(1, func() {
		_, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}, ratelimit.WithShards(1<<16))
		require.NoError(t, err)
	})
	// One allocation per shard would be 65536: an empty store makes a
	// handful (the store, its shard array).
	assert.Less(t, allocs, float64(16))
}

// failing is a keyed limiter whose backend has failed.
type failing struct{}

var errBackend = errors.New("backend down")

func (failing) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errBackend
}

func (failing) CheckContext(context.Context, string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errBackend
}

// TestShadowKeyedContext: a shadowed keyed limiter keeps the context form,
// and passes on errors that are not about the cost instead of admitting.
func TestShadowKeyedContext(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 1, Window: time.Second}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	var reports []ratelimit.ShadowReport
	sh := ratelimit.ShadowKeyed(s, func(r ratelimit.ShadowReport) { reports = append(reports, r) })
	cc, ok := sh.(ratelimit.ContextChecker)
	require.True(t, ok, "ShadowKeyed keeps CheckContext")
	for i := range 2 {
		d, err := cc.CheckContext(context.Background(), "k", ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, i == 1, d.Shadowed)
	}
	require.Len(t, reports, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = cc.CheckContext(ctx, "k", ratelimit.Unit)
	require.ErrorIs(t, err, context.Canceled)

	down := ratelimit.ShadowKeyed(failing{}, nil)
	_, err = down.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, errBackend)
	_, err = down.(ratelimit.ContextChecker).CheckContext(context.Background(), "k", ratelimit.Unit)
	require.ErrorIs(t, err, errBackend)
}
