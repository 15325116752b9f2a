package ratelimit_test

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// sharedPlans reads testdata/sharedplans.json: plans a and b each have a
// per-key layer and a global layer (Key "global") of 5 per hour, and plan
// c has a per-key layer where a and b have their global one. Redis's test
// of the same name reads it too.
func sharedPlans(t *testing.T) ratelimit.PlanSet { return readPlanSet(t, "testdata/sharedplans.json") }

// readPlanSet reads the rule set of a JSON file.
func readPlanSet(t *testing.T, path string) ratelimit.PlanSet {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var set ratelimit.PlanSet
	require.NoError(t, json.Unmarshal(b, &set))
	return set
}

// TestPlansMoveLeavesSharedLayers: five keys on plan a spend its global
// layer; one of them moves to plan b. The global layer's state is the
// plan's, not the key's: it stays with a, whose other keys are still
// refused by it, and b's global layer is b's own, which the moved key
// enters as it stands (it does not bring a's count along). The key's own
// layer moves as always. Moving to a plan whose layer at that place is a
// per-key one (c) takes nothing from the shared state either. An Update
// that changes the global layer's rule moves its state once, as a whole,
// to the new rule: every key of the plan still finds it spent.
func TestPlansMoveLeavesSharedLayers(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	var kp keyPlans
	set := sharedPlans(t)
	p, err := ratelimit.NewPlans(set, kp.of, ratelimit.WithClock(clk))
	require.NoError(t, err)
	check := func(key string) ratelimit.Decision {
		t.Helper()
		d, err := p.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		return d
	}
	for i := 1; i <= 5; i++ {
		require.True(t, check("k"+strconv.Itoa(i)).Allowed)
	}
	d := check("k6")
	require.False(t, d.Allowed)
	require.Equal(t, "a-all", d.Policy)

	kp.set("k1", "b")
	d = check("k1")
	assert.True(t, d.Allowed, "b's global layer is b's, and fresh: %+v", d)
	d = check("k2")
	assert.False(t, d.Allowed, "a's global layer is still spent after k1 left: %+v", d)
	assert.Equal(t, "a-all", d.Policy)
	for i := range 4 { // b's global layer: 1 spent by k1, 4 left
		key := "b" + strconv.Itoa(i)
		kp.set(key, "b")
		d = check(key)
		assert.True(t, d.Allowed, "b's global layer holds what b's keys spent, not a's count: %+v", d)
	}
	d = check("k1")
	assert.False(t, d.Allowed, "b's global layer: 5 of 5 spent")
	assert.Equal(t, "b-all", d.Policy)

	kp.set("k3", "c")
	d = check("k3")
	assert.True(t, d.Allowed, "c's second layer is k3's own: %+v", d)
	assert.False(t, check("k4").Allowed, "a's global layer gave nothing to k3's own layer in c")

	kp.set("k1", "a")
	d = check("k1")
	assert.False(t, d.Allowed, "back on a: its global layer is still spent")
	assert.Equal(t, "a-all", d.Policy)

	// An Update of a's global rule moves the shared state once, as a whole.
	set.Plans["a"].Layers[1].Rule = ratelimit.FixedWindow{Limit: 10, Window: time.Hour, Name: "a-all2"}
	require.NoError(t, p.Update(set, ratelimit.MigrateProportional))
	for _, key := range []string{"k2", "k5", "k6", "new"} {
		d = check(key)
		assert.False(t, d.Allowed, "%s: 5 of 5 is 10 of 10 under a's new global rule", key)
		assert.Equal(t, "a-all2", d.Policy)
	}
}

// allSharedPlans returns a Plans over testdata/allsharedplans.json: plans
// free (2 per hour) and pro (4 per hour) are of one rule, the key's own;
// plan team has only a layer with a Key (a global limit of 100 per hour),
// so nothing of a key's own can move onto it. Redis's tests of these plans
// read the file too. check checks key a1 on a plan.
func allSharedPlans(t *testing.T) (p *ratelimit.Plans, check func(plan string) ratelimit.Decision) {
	return filePlans(t, "testdata/allsharedplans.json")
}

// filePlans returns a Plans over the rule set of the JSON file path, and
// a check of key a1 on a plan.
func filePlans(t *testing.T, path string) (p *ratelimit.Plans, check func(plan string) ratelimit.Decision) {
	var kp keyPlans
	p, err := ratelimit.NewPlans(readPlanSet(t, path), kp.of, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	return p, func(plan string) ratelimit.Decision {
		t.Helper()
		kp.set("a1", plan)
		d, err := p.Check("a1", ratelimit.Unit)
		require.NoError(t, err)
		return d
	}
}

// TestPlansMoveOntoAllSharedPlanKeepsOwnState: a key that spent free and
// was then checked once on team, whose every layer is shared, still has
// what it spent: back on free it is refused, and moving on to pro carries
// free's count (2 of 2 is 4 of 4), rather than starting fresh.
func TestPlansMoveOntoAllSharedPlanKeepsOwnState(t *testing.T) {
	_, check := allSharedPlans(t)
	require.True(t, check("free").Allowed)
	require.True(t, check("free").Allowed)
	require.True(t, check("team").Allowed, "the global limit admits")
	assert.False(t, check("free").Allowed, "back on free: still spent")
	d := check("pro")
	assert.False(t, d.Allowed, "free's count moves on to pro: %+v", d)
	assert.Equal(t, "pro", d.Policy)
}

// TestPlansResetAfterAllSharedPlan: a Reset of a key that spent free and
// was then checked on team, whose every layer is shared, finds its state in
// free (see resetAfterTeam).
func TestPlansResetAfterAllSharedPlan(t *testing.T) {
	resetAfterTeam(t, "testdata/allsharedplans.json")
}

// TestPlansResetDropsStateLeftBehind: a key that spent free, a rule of its
// own, and moved to team, whose first layer is shared and whose second is
// the key's own, left free's state in free and its record with team; a
// Reset drops free's state too (see resetAfterTeam).
func TestPlansResetDropsStateLeftBehind(t *testing.T) {
	resetAfterTeam(t, "testdata/splitplans.json")
}

// resetAfterTeam checks, over the plans of the JSON file path (free, 2
// per hour, and pro, 4 per hour, each a rule of the key's own; team, whose
// first layer is shared), that a key that spent free and was then checked
// on team is fresh on free after a Reset, and moves on to pro with the one
// unit it spent since (1 of 2 is 2 of 4).
func resetAfterTeam(t *testing.T, path string) {
	p, check := filePlans(t, path)
	require.True(t, check("free").Allowed)
	require.True(t, check("free").Allowed)
	require.True(t, check("team").Allowed, "free's count stays in free")
	p.Reset("a1")
	d := check("free")
	assert.True(t, d.Allowed, "reset: free starts fresh: %+v", d)
	assert.Equal(t, int64(1), d.Remaining)
	d = check("pro")
	assert.True(t, d.Allowed, "1 of 2 spent moves to 2 of 4: %+v", d)
	assert.Equal(t, int64(1), d.Remaining)
}
