package ratelimit_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// resetAll resets key in every kind of limiter.
func resetAll(t require.TestingT, k allKinds, key string) {
	require.NoError(t, ratelimit.Reset(k.lim))
	k.store.Reset(key)
	k.comp.Reset(key)
	k.plans.Reset(key)
}

// TestResetStartsFresh checks, for every algorithm and every kind of
// limiter, that after Reset a key decides every later check exactly as a
// limiter built fresh at that instant.
func TestResetStartsFresh(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				rule := a.rule(s)
				key := rapid.SampledFrom(afterKeys).Draw(t, "key")
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
				used := buildKinds(t, rule, clk)
				var fresh *allKinds // built at the latest reset
				capMilli := s.capacity * int64(ratelimit.Unit)
				actions := traceActions(clk, a.scale(s))
				delete(actions, "back") // see TestPeekIsCheckWithoutSpending
				actions["check"] = func(t *rapid.T) {
					cost := drawCost(t, capMilli)
					for _, op := range kindOps {
						d1, err1 := op.check(used, key, cost)
						if fresh == nil {
							continue
						}
						d2, err2 := op.check(*fresh, key, cost)
						require.Equal(t, err2, err1, op.name)
						require.Equal(t, d2, d1, "%s: a reset key decides as a fresh one", op.name)
					}
				}
				actions["reset"] = func(t *rapid.T) {
					resetAll(t, used, key)
					k := buildKinds(t, rule, clk)
					fresh = &k
					for _, op := range kindOps[1:] {
						require.Zero(t, op.keys(used), "%s: a reset key is dropped", op.name)
					}
				}
				t.Repeat(actions)
			})
		})
	}
}

// TestResetPlansForgetsMovedKey checks that Plans.Reset drops what another
// plan's store still holds of a key, so that it cannot move back.
func TestResetPlansForgetsMovedKey(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	rule := ratelimit.FixedWindow{Limit: 5, Window: time.Second}
	var plan atomic.Value
	plan.Store("one")
	set := ratelimit.PlanSet{
		Plans:   map[string]ratelimit.Plan{"one": {Rule: rule}, "two": {Rule: rule}},
		Default: "one",
	}
	p, err := ratelimit.NewPlans(set, func(string) string { return plan.Load().(string) }, ratelimit.WithClock(clk))
	require.NoError(t, err)

	d, err := p.Check("c", 5*ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	plan.Store("two")
	d, err = p.Peek("c", ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "what the key spent moves with it")

	p.Reset("c")
	d, err = p.Check("c", 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a reset key is fresh on its new plan")
	plan.Store("one")
	d, err = p.Check("c", ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "and brings what it spent since back with it")

	p.Reset("c")
	d, err = p.Check("c", 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)

	// Spent on plan one, now on plan two but not checked since: reset
	// there, the key has nothing left to move.
	plan.Store("two")
	p.Reset("c")
	d, err = p.Check("c", 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
}

// TestResetPlansKeepsOldPlansSharedLayers checks that Plans.Reset of a key
// whose record names another plan than its own resets that plan's layers
// of the key's own, but not its layers with a Key, which the keys still on
// it share: resetting one key gives no other key a fresh global limit.
func TestResetPlansKeepsOldPlansSharedLayers(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	on := map[string]string{"a": "team", "b": "team"}
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 5, Window: time.Hour}},
		"team": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 5, Window: time.Hour}},
			{Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour, Name: "global"}, Key: func(string) string { return "all" }},
		}},
	}}
	p, err := ratelimit.NewPlans(set, func(k string) string { return on[k] }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := p.Check("a", 2*ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = p.Check("b", 2*ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	on["a"] = "free" // a's record still names team
	p.Reset("a")
	d, err = p.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "team's global limit, spent by a and b, is still spent")
	assert.Equal(t, "global", d.Policy)

	d, err = p.Check("a", 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a is fresh on its new plan: nothing of its own moved")
}

func TestResetUnsupported(t *testing.T) {
	lim, err := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	require.NoError(t, err)
	assert.True(t, errors.Is(ratelimit.Reset(ratelimit.Shadow(lim, nil)), errors.ErrUnsupported))
}

// TestPlansResetSharedLayerAfterUpdate: after an Update that changes a
// plan's layer with a Key (a global limit), its shared entry waits in the
// replaced plan's store to move, once and whole, into the new layer at the
// next check of a key whose record names the replaced plan. A Reset resets
// the plan's shared layers, so it must drop that waiting entry too, or the
// spent global allowance moves back in right after the reset.
func TestPlansResetSharedLayerAfterUpdate(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	team := func(globalName string) ratelimit.Plan {
		return ratelimit.Plan{Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour}},
			{Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour, Name: globalName}, Key: func(string) string { return "all" }},
		}}
	}
	set := ratelimit.PlanSet{Default: "team", Plans: map[string]ratelimit.Plan{"team": team("global")}}
	p, err := ratelimit.NewPlans(set, func(string) string { return "team" }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for _, k := range []string{"a", "b"} {
		d, err := p.Check(k, 2*ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	// The global layer's rule changes (a new store); the per-key layer's is kept.
	set2 := ratelimit.PlanSet{Default: "team", Plans: map[string]ratelimit.Plan{"team": team("global2")}}
	require.NoError(t, p.Update(set2, ratelimit.MigrateProportional))

	p.Reset("a") // resets the plan's global layer too, per the godoc

	d, err := p.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "after Reset the shared global entry is fresh for every key; got %+v", d)
}
