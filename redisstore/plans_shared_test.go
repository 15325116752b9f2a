package redisstore

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readPlanSet reads the rule set of a JSON file.
func readPlanSet(t *testing.T, path string) ratelimit.PlanSet {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var set ratelimit.PlanSet
	require.NoError(t, json.Unmarshal(b, &set))
	return set
}

// twinPlans returns an in-process Plans and one in Redis over set, on one
// client clock, with the plan function of on.
func twinPlans(t *testing.T, set ratelimit.PlanSet) (local *ratelimit.Plans, remote *Plans, on map[string]string) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	on = map[string]string{}
	planOf := func(key string) string { return on[key] }
	local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
	require.NoError(t, err)
	remote, err = NewPlans(rdb, set, planOf, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	return local, remote, on
}

// TestPlansMoveLeavesSharedLayers: the in-process test of the same name,
// in Redis, each check compared with the in-process Plans': a key that
// moves to another plan leaves its plan's global layer (a constant Key)
// where it is, to the keys still on it, and neither brings its count into
// the new plan's nor gives it to a layer of the key's own; an Update that
// changes the global layer's rule moves its state once, as a whole.
func TestPlansMoveLeavesSharedLayers(t *testing.T) {
	set := readPlanSet(t, "../testdata/sharedplans.json") // the in-process test's plans
	local, remote, on := twinPlans(t, set)
	check := func(key string) ratelimit.Decision {
		t.Helper()
		want, err := local.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		got, err := remote.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		require.Equal(t, want, got, "key %s", key)
		return got
	}
	for i := 1; i <= 5; i++ {
		require.True(t, check("k"+strconv.Itoa(i)).Allowed)
	}
	require.False(t, check("k6").Allowed)

	on["k1"] = "b"
	assert.True(t, check("k1").Allowed, "b's global layer is b's, and fresh")
	d := check("k2")
	assert.False(t, d.Allowed, "a's global layer is still spent after k1 left")
	assert.Equal(t, "a-all", d.Policy)
	for i := range 4 {
		key := "b" + strconv.Itoa(i)
		on[key] = "b"
		assert.True(t, check(key).Allowed, "b's global layer holds what b's keys spent")
	}
	assert.False(t, check("k1").Allowed, "b's global layer: 5 of 5 spent")

	on["k3"] = "c"
	assert.True(t, check("k3").Allowed, "c's second layer is k3's own")
	assert.False(t, check("k4").Allowed, "a's global layer gave nothing to k3's own layer in c")
	on["k1"] = "a"
	assert.False(t, check("k1").Allowed, "back on a: its global layer is still spent")

	set.Plans["a"].Layers[1].Rule = ratelimit.FixedWindow{Limit: 10, Window: time.Hour, Name: "a-all2"}
	require.NoError(t, local.Update(set, ratelimit.MigrateProportional))
	require.NoError(t, remote.Update(set, ratelimit.MigrateProportional))
	for _, key := range []string{"k2", "k5", "k6", "new"} {
		d := check(key)
		assert.False(t, d.Allowed, "%s: 5 of 5 is 10 of 10 under a's new global rule", key)
		assert.Equal(t, "a-all2", d.Policy)
	}
	st := remote.Stats()
	assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
}

// allSharedTrace runs the in-process Plans and Redis's over the plans of
// ../testdata/allsharedplans.json (free and pro of the key's own rule, team
// of a global layer only) and returns a check of key a1 on a plan, which
// requires both to decide alike, and a Reset of it in both.
func allSharedTrace(t *testing.T) (check func(plan string) ratelimit.Decision, reset func()) {
	local, remote, on := twinPlans(t, readPlanSet(t, "../testdata/allsharedplans.json")) // the in-process tests' plans
	t.Cleanup(func() {
		st := remote.Stats()
		assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
	})
	check = twinCheck(t, local, remote, on, "a1")
	reset = func() {
		local.Reset("a1")
		require.NoError(t, remote.Reset("a1"))
	}
	return check, reset
}

// TestPlansMoveOntoAllSharedPlanKeepsOwnState: the in-process test of the
// same name, in Redis, each check compared with the in-process Plans': a
// key that spent free and was then checked once on team, whose every layer
// is shared, is refused back on free, and carries free's count on to pro.
func TestPlansMoveOntoAllSharedPlanKeepsOwnState(t *testing.T) {
	check, _ := allSharedTrace(t)
	require.True(t, check("free").Allowed)
	require.True(t, check("free").Allowed)
	require.True(t, check("team").Allowed, "the global limit admits")
	assert.False(t, check("free").Allowed, "back on free: still spent")
	d := check("pro")
	assert.False(t, d.Allowed, "free's count moves on to pro: %+v", d)
}

// TestPlansResetAfterAllSharedPlan: the in-process test of the same name,
// in Redis, each check compared with the in-process Plans': a Reset of a
// key that spent free and was then checked on team finds its state in free.
func TestPlansResetAfterAllSharedPlan(t *testing.T) {
	check, reset := allSharedTrace(t)
	require.True(t, check("free").Allowed)
	require.True(t, check("free").Allowed)
	require.True(t, check("team").Allowed)
	reset()
	d := check("free")
	assert.True(t, d.Allowed, "reset: free starts fresh: %+v", d)
	assert.Equal(t, int64(1), d.Remaining)
	d = check("pro")
	assert.True(t, d.Allowed, "1 of 2 spent moves to 2 of 4: %+v", d)
	assert.Equal(t, int64(1), d.Remaining)
}

// TestPlansLookLeavesRecordOnEmptyEntry: a key that spent its plan's own
// layer and was then refused on a plan of two layers of its own (the
// second, which the first's refusal left untouched, holds nothing spent)
// is still refused on a third plan after a Peek on a plan whose first
// layer is shared and whose second is the key's own: the Peek finds only
// an entry as good as fresh to move, which moves nothing, so the record
// keeps naming the plan that holds the key's spent state, in process as
// in Redis.
func TestPlansLookLeavesRecordOnEmptyEntry(t *testing.T) {
	tb := func(name string) ratelimit.Rule {
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 1, Per: time.Second}, Burst: 1, Name: name}
	}
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: tb("free")},
		"pro":  {Layers: []ratelimit.Layer{{Rule: tb("pro0")}, {Rule: tb("pro1")}}},
		"team": {Rule: tb("team")},
	}}
	local, remote, _ := twinPlans(t, set)
	check := func(plan string) ratelimit.Decision {
		t.Helper()
		ctx := ratelimit.ContextWithPlan(context.Background(), plan)
		want, err := local.CheckContext(ctx, "a2", ratelimit.Unit)
		require.NoError(t, err)
		got, err := remote.CheckContext(ctx, "a2", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, want, got, "on %s", plan)
		return got
	}
	require.True(t, check("free").Allowed)
	set.Plans["free"] = ratelimit.Plan{Layers: []ratelimit.Layer{
		{Rule: tb("free-all"), Key: func(string) string { return "all" }},
		{Rule: tb("free-own")},
	}}
	require.NoError(t, local.Update(set, ratelimit.MigrateProportional))
	require.NoError(t, remote.Update(set, ratelimit.MigrateProportional))
	require.False(t, check("pro").Allowed, "free's count moves on to pro's first layer")
	want, err := local.Peek("a2", ratelimit.Unit)
	require.NoError(t, err)
	got, err := remote.Peek("a2", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, want, got, "peek on free")
	d := check("team")
	assert.False(t, d.Allowed, "pro's spent first layer moves on to team: %+v", d)
	st := remote.Stats()
	assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
}

// TestPlansResetDropsStateLeftBehind: a key that spent free, a rule of
// its own, and moved to team, whose first layer is shared, left free's
// state where it was; a Reset on team drops it too, in process as in
// Redis (where free's deny cache forgets its refusal): back on free the key
// starts fresh, and what it spends there moves on to pro.
func TestPlansResetDropsStateLeftBehind(t *testing.T) {
	tb := func(name string) ratelimit.Rule {
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 1, Per: time.Second}, Burst: 1, Name: name}
	}
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: tb("free")},
		"pro":  {Rule: tb("pro")},
		"team": {Layers: []ratelimit.Layer{{Rule: tb("team-all"), Key: func(string) string { return "all" }}, {Rule: tb("team-own")}}},
	}}
	local, remote, on := twinPlans(t, set)
	check := twinCheck(t, local, remote, on, "a1")
	require.True(t, check("free").Allowed)
	require.False(t, check("free").Allowed, "spent: free's deny cache remembers it")
	require.True(t, check("team").Allowed, "free's state stays in free")
	local.Reset("a1")
	require.NoError(t, remote.Reset("a1"))
	require.True(t, check("free").Allowed, "reset: free starts fresh")
	d := check("pro")
	assert.False(t, d.Allowed, "free's spent state moves on to pro: %+v", d)
	st := remote.Stats()
	assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
}

// TestPlansResetLeavesNoStateToMoveAfterUpdate: a key that spent pro, a
// rule of its own, and moved to free, whose first layer is shared, left
// pro's state where it was; a Reset drops it, so that, in process as in
// Redis, a check back on pro starts fresh, and after an Update that
// replaces both plans the key's settlement on free finds the same state in
// both (not pro's spent state in one and none in the other).
func TestPlansResetLeavesNoStateToMoveAfterUpdate(t *testing.T) {
	tb := func(c int64, name string) ratelimit.Rule {
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: c, Per: time.Second}, Burst: c, Name: name}
	}
	all := func(string) string { return "all" }
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Layers: []ratelimit.Layer{{Rule: tb(2, "free-all"), Key: all}, {Rule: tb(1, "free-own"), Shadow: true}}},
		"pro":  {Rule: tb(1, "pro")},
	}}
	local, remote, _ := twinPlans(t, set)
	check := func(key, plan string, cost ratelimit.Units) ratelimit.Decision {
		t.Helper()
		ctx := ratelimit.ContextWithPlan(context.Background(), plan)
		want, err := local.CheckContext(ctx, key, cost)
		require.NoError(t, err)
		got, err := remote.CheckContext(ctx, key, cost)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s on %s", key, plan)
		return got
	}
	require.True(t, check("a2", "pro", ratelimit.Unit).Allowed)
	require.True(t, check("a2", "free", ratelimit.Unit).Allowed, "pro's state stays in pro")
	local.Reset("a2")
	require.NoError(t, remote.Reset("a2"))
	require.True(t, check("a1", "free", ratelimit.Unit).Allowed)
	// A key new to free, refused by its shared layer: a record in process,
	// none in Redis, where the refusal writes nothing.
	require.False(t, check("a2", "free", 2*ratelimit.Unit).Allowed)
	assert.True(t, check("a2", "pro", ratelimit.Unit).Allowed, "reset: pro starts fresh")
	set = ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Layers: []ratelimit.Layer{{Rule: tb(1, "free-own2")}, {Rule: tb(1, "free-all2"), Key: all, Shadow: true}}},
		"pro":  {Layers: []ratelimit.Layer{{Rule: tb(1, "pro-all2"), Key: all}, {Rule: tb(1, "pro-all3"), Key: all}}},
	}}
	require.NoError(t, local.Update(set, ratelimit.MigrateProportional))
	require.NoError(t, remote.Update(set, ratelimit.MigrateProportional))
	local.Clock().(*ratelimit.ManualClock).Advance(1)
	want, wx, err := local.Settle("a2", ratelimit.Unit, ratelimit.Unit, unixNow)
	require.NoError(t, err)
	got, gx, err := remote.Settle("a2", ratelimit.Unit, ratelimit.Unit, unixNow)
	require.NoError(t, err)
	assert.Equal(t, want, got, "settle on free")
	assert.Equal(t, wx, gx)
	st := remote.Stats()
	assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
}

// twinCheck returns a check of key on a plan, in process and in Redis,
// that requires both to decide alike.
func twinCheck(t *testing.T, local *ratelimit.Plans, remote *Plans, on map[string]string, key string) func(plan string) ratelimit.Decision {
	return func(plan string) ratelimit.Decision {
		t.Helper()
		on[key] = plan
		want, err := local.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		got, err := remote.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, want, got, "on %s", plan)
		return got
	}
}
