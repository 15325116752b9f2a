package ratelimit_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// A SlidingCounter keeps its keys in 16 bytes when its counts fit 32 bits
// (a Limit of up to compactLimit units: no count exceeds twice the limit)
// and in 24 bytes above that. These tests hold the two states to the same
// decisions, amounts and encoded states, and the wide one, run under the
// small limits that fill windows, to the suites every algorithm passes.

// compactLimit is the largest Limit kept in the compact state:
// 2 x 1000 x Limit must fit a uint32.
const compactLimit = math.MaxUint32 / 2000

func TestSlidingCounterStateByLimit(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		want  string
	}{
		{1, "compact"},
		{1_000_000, "compact"},
		{compactLimit, "compact"},
		{compactLimit + 1, "wide"},
		{1e15, "wide"},
		{0, ""},
	} {
		for _, refused := range []bool{false, true} {
			rule := ratelimit.SlidingCounter{Limit: tc.limit, Window: time.Second, CountRefused: refused}
			require.Equal(t, tc.want, ratelimit.SlidingCounterState(rule), "Limit %d", tc.limit)
		}
	}
	require.Equal(t, int64(2_147_483), int64(compactLimit))
	require.LessOrEqual(t, uint64(2*1000*compactLimit), uint64(math.MaxUint32))
	require.Greater(t, uint64(2*1000*(compactLimit+1)), uint64(math.MaxUint32))
}

// scKeyed is one way of keeping a SlidingCounter's keys: a store and a
// Machine's encoded states, bound to the compact or the wide state.
type scKeyed struct {
	store  *ratelimit.Store
	m      *ratelimit.Machine
	states map[string][]byte
}

func newSCKeyed(t *rapid.T, rule ratelimit.SlidingCounter, clk ratelimit.Clock, wide bool) scKeyed {
	if wide {
		defer ratelimit.SetSlidingCounterCompactCap(0)()
	}
	want := "compact"
	if wide || rule.Limit > compactLimit {
		want = "wide"
	}
	require.Equal(t, want, ratelimit.SlidingCounterState(rule))
	// One shard: every key clamps to the latest instant any op read, as
	// the model does.
	s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithShards(1))
	require.NoError(t, err)
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	return scKeyed{store: s, m: m, states: map[string][]byte{}}
}

// drawSCLimit draws a Limit: small ones whose traces fill windows, and
// ones at and around the largest compact limit.
func drawSCLimit(t *rapid.T) int64 {
	return rapid.OneOf(
		rapid.Int64Range(1, 30),
		rapid.Int64Range(1, 1_000_000),
		rapid.Int64Range(compactLimit-3, compactLimit+3),
		rapid.SampledFrom([]int64{compactLimit, compactLimit + 1}),
		rapid.Int64Range(compactLimit, 1e15),
	).Draw(t, "limit")
}

// TestSlidingCounterCompactMatchesWide plays random traces of checks,
// peeks, refunds, settlements (into debt up to twice the limit), resets and
// clock moves on a store and a Machine in the compact state, the same in
// the wide state, and the reference model: every Decision, amount and
// encoded state must agree.
func TestSlidingCounterCompactMatchesWide(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rule := ratelimit.SlidingCounter{
			Limit:        drawSCLimit(t),
			Window:       drawWindow(t),
			CountRefused: rapid.Bool().Draw(t, "countRefused"),
			Name:         drawName(t),
		}
		clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
		compact := newSCKeyed(t, rule, clk, false)
		wide := newSCKeyed(t, rule, clk, true)
		capMilli := rule.Limit * 1000
		newModel := func() *refmodel.SlidingCounter {
			m := refmodel.NewSlidingCounter(rule.Limit, rule.Window)
			if rule.CountRefused {
				m.WithCountRefused()
			}
			return m
		}
		models := map[string]*refmodel.SlidingCounter{}
		model := func(key string) *refmodel.SlidingCounter {
			if models[key] == nil {
				models[key] = newModel()
			}
			return models[key]
		}
		want := func(d ratelimit.Decision) ratelimit.Decision {
			d.Policy, d.Window = rule.Name, rule.Window
			return d
		}
		drawKey := func(t *rapid.T) string { return rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "key") }
		// Costs up to the limit, whole units and the whole limit favoured.
		drawCost := func(t *rapid.T, label string) ratelimit.Units {
			return ratelimit.Units(rapid.OneOf(
				rapid.Int64Range(1, capMilli),
				rapid.Just(int64(1000)),
				rapid.Just(capMilli),
				rapid.Int64Range(max(1, capMilli-3), capMilli),
			).Draw(t, label))
		}
		// What a settlement turns out to cost: up to three times the
		// limit, so that debt reaches its bound of twice the limit.
		drawDebt := func(t *rapid.T) ratelimit.Units {
			return ratelimit.Units(rapid.OneOf(
				rapid.Int64Range(1, 3*capMilli),
				rapid.Just(2*capMilli),
				rapid.Just(int64(math.MaxInt64)),
			).Draw(t, "actual"))
		}
		machineNow := func(t *rapid.T) time.Duration {
			// The Machine takes any instant; it clamps to the key's own.
			return clk.Now() + time.Duration(rapid.Int64Range(-int64(rule.Window), int64(rule.Window)).Draw(t, "machineSkew"))
		}
		actions := traceActions(clk, rule.Window)
		// The model clamps to every instant read; a store only to those
		// of the ops that hold the key. Backward readings are the
		// Machine's here (machineNow), and the suites' elsewhere.
		delete(actions, "back")
		actions["check"] = func(t *rapid.T) {
			key, cost := drawKey(t), drawCost(t, "cost")
			dc, err := compact.store.Check(key, cost)
			require.NoError(t, err)
			dw, err := wide.store.Check(key, cost)
			require.NoError(t, err)
			require.Equal(t, dw, dc, "check %s %d", key, cost)
			require.Equal(t, want(model(key).Step(clk.modelNow(), int64(cost))), dc, "check %s %d", key, cost)
		}
		actions["peek"] = func(t *rapid.T) {
			key, cost := drawKey(t), drawCost(t, "cost")
			dc, err := compact.store.Peek(key, cost)
			require.NoError(t, err)
			dw, err := wide.store.Peek(key, cost)
			require.NoError(t, err)
			require.Equal(t, dw, dc, "peek %s %d", key, cost)
			require.Equal(t, want(model(key).Look(clk.modelNow(), int64(cost))), dc, "peek %s %d", key, cost)
		}
		actions["refund"] = func(t *rapid.T) {
			key, cost := drawKey(t), drawCost(t, "refund")
			at := time.Duration(rapid.Int64Range(0, clk.seen+int64(rule.Window)).Draw(t, "at"))
			gc, err := compact.store.Refund(key, cost, at)
			require.NoError(t, err)
			gw, err := wide.store.Refund(key, cost, at)
			require.NoError(t, err)
			require.Equal(t, gw, gc, "refund %s %d at %d", key, cost, at)
			now := clk.modelNow()
			require.Equal(t, model(key).Refund(now, min(int64(at), now), int64(cost)), int64(gc), "refund %s %d at %d", key, cost, at)
		}
		actions["settle"] = func(t *rapid.T) {
			key, charged, actual := drawKey(t), drawCost(t, "charged"), drawDebt(t)
			at := time.Duration(rapid.Int64Range(0, clk.seen+int64(rule.Window)).Draw(t, "at"))
			dc, sc, err := compact.store.Settle(key, charged, actual, at)
			require.NoError(t, err)
			dw, sw, err := wide.store.Settle(key, charged, actual, at)
			require.NoError(t, err)
			require.Equal(t, dw, dc, "settle %s %d of %d", key, actual, charged)
			require.Equal(t, sw, sc, "settle %s %d of %d", key, actual, charged)
			now := clk.modelNow()
			d, settled := settleModel(model(key), now, int64(charged), int64(actual), min(int64(at), now))
			require.Equal(t, want(d), dc, "settle %s %d of %d", key, actual, charged)
			require.Equal(t, settled, int64(sc), "settle %s %d of %d", key, actual, charged)
		}
		actions["reset"] = func(t *rapid.T) {
			key := drawKey(t)
			compact.store.Reset(key)
			wide.store.Reset(key)
			delete(models, key)
			delete(compact.states, key)
			delete(wide.states, key)
		}
		// The Machine's encoded states must be the very same bytes.
		actions["machineStep"] = func(t *rapid.T) {
			key, cost, now := drawKey(t), drawCost(t, "cost"), machineNow(t)
			commit := rapid.Bool().Draw(t, "commit")
			dc, nc, err := compact.m.Step(compact.states[key], now, cost, commit)
			require.NoError(t, err)
			dw, nw, err := wide.m.Step(wide.states[key], now, cost, commit)
			require.NoError(t, err)
			require.Equal(t, dw, dc)
			require.Equal(t, string(nw), string(nc), "state after a step of %d", cost)
			compact.states[key], wide.states[key] = nc, nw
		}
		actions["machineRefund"] = func(t *rapid.T) {
			key, cost, now := drawKey(t), drawCost(t, "refund"), machineNow(t)
			at := time.Duration(rapid.Int64Range(0, max(int64(now), 0)).Draw(t, "at"))
			gc, nc, err := compact.m.Refund(compact.states[key], now, at, cost)
			require.NoError(t, err)
			gw, nw, err := wide.m.Refund(wide.states[key], now, at, cost)
			require.NoError(t, err)
			require.Equal(t, gw, gc)
			require.Equal(t, string(nw), string(nc), "state after a refund of %d", cost)
			compact.states[key], wide.states[key] = nc, nw
		}
		actions["machineSettle"] = func(t *rapid.T) {
			key, charged, actual, now := drawKey(t), drawCost(t, "charged"), drawDebt(t), machineNow(t)
			at := time.Duration(rapid.Int64Range(0, max(int64(now), 0)).Draw(t, "at"))
			dc, sc, nc, err := compact.m.Settle(compact.states[key], now, at, charged, actual)
			require.NoError(t, err)
			dw, sw, nw, err := wide.m.Settle(wide.states[key], now, at, charged, actual)
			require.NoError(t, err)
			require.Equal(t, dw, dc)
			require.Equal(t, sw, sc)
			require.Equal(t, string(nw), string(nc), "state after settling %d of %d", actual, charged)
			compact.states[key], wide.states[key] = nc, nw
		}
		t.Repeat(actions)
	})
}

// TestSlidingCounterCompactDebtBound fills a key at the largest compact
// limit to its debt bound, twice the limit (a count that needs all 32
// bits), and reads it back through the store and the Machine.
func TestSlidingCounterCompactDebtBound(t *testing.T) {
	for _, limit := range []int64{compactLimit, compactLimit + 1} {
		rule := ratelimit.SlidingCounter{Limit: limit, Window: time.Minute}
		capMilli := ratelimit.Units(limit * 1000)
		clk := ratelimit.NewManualClock(time.Minute)
		s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		_, err = s.Check("k", capMilli)
		require.NoError(t, err)
		d, settled, err := s.Settle("k", capMilli, math.MaxInt64, 0)
		require.NoError(t, err)
		require.Equal(t, 2*capMilli, settled, "Limit %d: a debt of the limit, twice the limit in use", limit)
		require.False(t, d.Allowed)
		require.Equal(t, 2*time.Minute, d.ResetAfter)
		// A minute on the whole count is the previous window's, weighing
		// it all at the window's start: the estimate is twice the limit.
		clk.Advance(time.Minute)
		d, err = s.Peek("k", ratelimit.Unit)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.Equal(t, time.Minute, d.ResetAfter)
		// The estimate falls to the limit less a unit half a window later
		// (2L x (W-e)/W <= L-1 from e = W(L+1)/(2L)), rounded up.
		e := (time.Minute*time.Duration(limit+1) + time.Duration(2*limit) - 1) / time.Duration(2*limit)
		require.Equal(t, e, d.RetryAfter, "Limit %d", limit)

		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		_, state, err := m.Step(nil, time.Minute, capMilli, true)
		require.NoError(t, err)
		_, settled, state, err = m.Settle(state, time.Minute, 0, capMilli, math.MaxInt64)
		require.NoError(t, err)
		require.Equal(t, 2*capMilli, settled)
		wantState := "60000000000 1 0 " + strconv.FormatInt(2*int64(capMilli), 10)
		require.Equal(t, wantState, string(state))
		_, next, err := m.Step(state, time.Minute, ratelimit.Unit, true)
		require.NoError(t, err)
		require.Equal(t, wantState, string(next), "a refused check at the same instant changes nothing")
		_, _, err = m.Step([]byte("60000000000 1 0 "+strconv.FormatInt(2*int64(capMilli)+1, 10)), time.Minute, ratelimit.Unit, true)
		require.ErrorIs(t, err, ratelimit.ErrInvalidState, "a count above twice the limit")
	}
}

// TestSlidingCounterWideStateSuites runs the suites that range over every
// algorithm on the SlidingCounter with its keys in the wide state, under
// the small limits those suites draw (kept compact otherwise).
func TestSlidingCounterWideStateSuites(t *testing.T) {
	if testing.Short() {
		t.Skip("the wide state's run of the suites is long")
	}
	defer ratelimit.SetSlidingCounterCompactCap(0)()
	saved := testedAlgorithms
	defer func() { testedAlgorithms = saved }()
	testedAlgorithms = []testedAlgorithm{testedAlgorithmNamed("SlidingCounter")}
	require.Equal(t, "wide", ratelimit.SlidingCounterState(ratelimit.SlidingCounter{Limit: 1, Window: time.Second}))
	for _, s := range []struct {
		name  string
		suite func(*testing.T)
	}{
		{"Model", TestModel},
		{"RetryAfterIsExact", TestRetryAfterIsExact},
		{"ResetAfterIsExact", TestResetAfterIsExact},
		{"DenialSpendsNothing", TestDenialSpendsNothing},
		{"WaitingNeverHurts", TestWaitingNeverHurts},
		{"BackwardsClockGrantsNothing", TestBackwardsClockGrantsNothing},
		{"StoreMatchesLimiters", TestStoreMatchesLimiters},
		{"StoreEvictionAccounting", TestStoreEvictionAccounting},
		{"PeekIsCheckWithoutSpending", TestPeekIsCheckWithoutSpending},
		{"ResetStartsFresh", TestResetStartsFresh},
		{"RefundModel", TestRefundModel},
		{"RefundKeyedMatchesLimiter", TestRefundKeyedMatchesLimiter},
		{"RefundNeverGivesMore", TestRefundNeverGivesMore},
		{"SettleDebtBound", TestSettleDebtBound},
		{"SettleExtremes", TestSettleExtremes},
		{"MachineMatchesLimiter", TestMachineMatchesLimiter},
		{"PlansMatchModel", TestPlansMatchModel},
		{"CompositeMatchesModels", TestCompositeMatchesModels},
		{"ConcurrentChecksAdmitExactlyTheLimit", TestConcurrentChecksAdmitExactlyTheLimit},
		{"CheckDoesNotAllocate", TestCheckDoesNotAllocate},
	} {
		t.Run(s.name, s.suite)
	}
}
