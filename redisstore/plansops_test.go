package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlansOps: Peek, Refund, Settle and Reset act on the keys of the
// key's plan, moving it first when its record names another plan, with
// the in-process Plans' results; bad input is refused as in process.
func TestPlansOps(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	on := map[string]string{}
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour}},
		"team": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour}},
			{Rule: ratelimit.FixedWindow{Limit: 6, Window: time.Hour, Name: "global"}, Key: func(string) string { return "all" }},
		}},
	}}
	planOf := func(k string) string { return on[k] }
	local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk))
	require.NoError(t, err)
	remote, err := NewPlans(rdb, set, planOf, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	type ops = interface {
		Check(string, ratelimit.Units) (ratelimit.Decision, error)
		Peek(string, ratelimit.Units) (ratelimit.Decision, error)
		Refund(string, ratelimit.Units, time.Duration) (ratelimit.Units, error)
		Settle(string, ratelimit.Units, ratelimit.Units, time.Duration) (ratelimit.Decision, ratelimit.Units, error)
	}
	both := func(f func(p ops) any) {
		t.Helper()
		assert.Equal(t, f(local), f(remote))
	}
	check := func(key string, cost ratelimit.Units) func(p ops) any {
		return func(p ops) any { d, err := p.Check(key, cost); return []any{d, err} }
	}
	peek := func(key string, cost ratelimit.Units) func(p ops) any {
		return func(p ops) any { d, err := p.Peek(key, cost); return []any{d, err} }
	}
	refund := func(key string, cost ratelimit.Units) func(p ops) any {
		return func(p ops) any { g, err := p.Refund(key, cost, clk.Now()); return []any{g, err} }
	}
	settle := func(key string, charged, actual ratelimit.Units) func(p ops) any {
		return func(p ops) any { d, x, err := p.Settle(key, charged, actual, clk.Now()); return []any{d, x, err} }
	}
	both(check("a", 3*ratelimit.Unit))
	both(peek("a", ratelimit.Unit))
	both(refund("a", 2*ratelimit.Unit))
	both(settle("a", ratelimit.Unit, 3*ratelimit.Unit))
	both(peek("a", 2*ratelimit.Unit))
	on["a"] = "team" // a moves at its next operation: a refund
	both(refund("a", ratelimit.Unit))
	both(peek("a", 4*ratelimit.Unit))
	both(check("b", 2*ratelimit.Unit))
	both(settle("a", 2*ratelimit.Unit, ratelimit.Unit))
	local.Reset("a")
	require.NoError(t, remote.Reset("a"))
	both(peek("a", 4*ratelimit.Unit))
	both(check("a", 4*ratelimit.Unit))
	assert.Equal(t, uint64(1), remote.Stats().Moves)

	// Bad input, as in process.
	for _, f := range []func(p ops) any{
		peek("a", 0), peek("a", -1), peek("a", 5*ratelimit.Unit), check("a", 7*ratelimit.Unit),
		refund("a", 0), refund("a", -ratelimit.Unit),
		settle("a", 0, ratelimit.Unit), settle("a", ratelimit.Unit, 0), settle("a", 5*ratelimit.Unit, ratelimit.Unit),
	} {
		want, got := f(local).([]any), f(remote).([]any)
		require.Error(t, want[len(want)-1].(error))
		assert.Equal(t, want[:len(want)-1], got[:len(got)-1])
		assert.ErrorIs(t, got[len(got)-1].(error), costError(want[len(want)-1].(error)))
	}
	st := remote.Stats()
	assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
}

// costError is the cost error err matches, or err.
func costError(err error) error {
	for _, e := range []error{ratelimit.ErrInvalidCost, ratelimit.ErrCostExceedsCapacity} {
		if errors.Is(err, e) {
			return e
		}
	}
	return err
}

// TestPlansResetSharedLayerAfterUpdate: as in process, a Reset drops the
// shared entry that an Update's replaced layer still holds for the key's
// plan (it waits to move into the plan's new layer at the next check of a
// key whose record names the replaced plan), so the spent global allowance
// does not move back in after the reset.
func TestPlansResetSharedLayerAfterUpdate(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	team := func(global string) ratelimit.PlanSet {
		return ratelimit.PlanSet{Default: "team", Plans: map[string]ratelimit.Plan{"team": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour}},
			{Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour, Name: global}, Key: func(string) string { return "all" }},
		}}}}
	}
	local, err := ratelimit.NewPlans(team("global"), nil, ratelimit.WithClock(clk))
	require.NoError(t, err)
	remote, err := NewPlans(rdb, team("global"), nil, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	for _, k := range []string{"a", "b"} {
		want, err := local.Check(k, 2*ratelimit.Unit)
		require.NoError(t, err)
		got, err := remote.Check(k, 2*ratelimit.Unit)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	require.NoError(t, local.Update(team("global2"), ratelimit.MigrateProportional))
	require.NoError(t, remote.Update(team("global2"), ratelimit.MigrateProportional))
	local.Reset("a")
	require.NoError(t, remote.Reset("a"))
	want, err := local.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	got, err := remote.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, got.Allowed, "the reset global layer is fresh for every key: %+v", got)
	assert.Equal(t, want, got)
}
