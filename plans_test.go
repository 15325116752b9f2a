package ratelimit_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// slow is a rate slow enough that nothing refills during a test.
var slow = ratelimit.Rate{Count: 1, Per: 1000 * time.Hour}

// keyPlans maps keys to plan names for a test's plan function.
type keyPlans struct {
	mu sync.Mutex
	m  map[string]string
}

func (k *keyPlans) set(key, plan string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]string{}
	}
	k.m[key] = plan
}

func (k *keyPlans) of(key string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[key]
}

// TestPlanMovesKeepWhatThePolicySays: a free key (burst 20) with 5 left
// moves to pro (burst 200, refilling ten times as fast, so that both refill
// in the same time) and back, under each policy. No policy holds the key
// past the instant free would have made it whole again: as-is, which would
// keep 195 of 200 in use, keeps what pro refills by then, 150.
func TestPlanMovesKeepWhatThePolicySays(t *testing.T) {
	for _, c := range []struct {
		policy     ratelimit.Migration
		pro, again int64 // Remaining on pro, then back on free
	}{
		// 15 of 20 spent, then a milli-unit on each plan: what is left,
		// in whole units, rounded down.
		{ratelimit.MigrateProportional, 49, 4}, // 150.001 of 200; back, ceil(15.0001) + 0.001 of 20
		{ratelimit.MigrateAsIs, 49, 4},         // 195 of 200, refilled to 150 by when free is full, then 150.001; back, 4.999 left, less 0.001
		{ratelimit.MigrateAdditive, 184, 4},    // 15.001 of 200; back, 15.001 of 20, less 0.001
		{ratelimit.MigrateReset, 199, 19},      // fresh each time
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			var kp keyPlans
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{
				Plans: map[string]ratelimit.Plan{
					"free": {Rule: ratelimit.TokenBucket{Rate: slow, Burst: 20, Name: "free"}},
					"pro":  {Rule: ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 10, Per: slow.Per}, Burst: 200, Name: "pro"}},
				},
				Default: "free",
				OnMove:  c.policy,
			}, kp.of, ratelimit.WithClock(clk))
			require.NoError(t, err)
			d, err := p.Check("k", 15*ratelimit.Unit)
			require.NoError(t, err)
			require.Equal(t, int64(5), d.Remaining)
			kp.set("k", "pro")
			d, err = p.Check("k", ratelimit.Unit/1000) // one milli-unit: see what is left
			require.NoError(t, err)
			assert.Equal(t, "pro", d.Policy)
			assert.Equal(t, c.pro, d.Remaining, "on pro")
			kp.set("k", "free")
			d, err = p.Check("k", ratelimit.Unit/1000)
			require.NoError(t, err)
			assert.Equal(t, "free", d.Policy)
			assert.Equal(t, c.again, d.Remaining, "back on free")
			// The key is held in one place.
			st := p.Stats()
			assert.Equal(t, 1, st["free"][0].Keys+st["pro"][0].Keys)
		})
	}
}

// TestPlansUpdateMigratesLazily: an Update changes one plan's rule; its
// keys keep what the policy says on their next check, and the other plan's
// keys keep their state exactly.
func TestPlansUpdateMigratesLazily(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	var kp keyPlans
	kp.set("p", "pro")
	set := ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.FixedWindow{Limit: 20, Window: time.Hour, Name: "free"}},
			"pro":  {Rule: ratelimit.SlidingLog{Limit: 200, Window: time.Hour, Name: "pro"}},
		},
		Default: "free",
	}
	p, err := ratelimit.NewPlans(set, kp.of, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for range 15 {
		_, err := p.Check("f", ratelimit.Unit)
		require.NoError(t, err)
	}
	for i := range 3 {
		clk.Advance(time.Minute)
		_, err := p.Check("p", ratelimit.Units(i+1)*ratelimit.Unit)
		require.NoError(t, err)
	}
	set.Plans["free"] = ratelimit.Plan{Rule: ratelimit.FixedWindow{Limit: 40, Window: time.Hour, Name: "free2"}}
	require.NoError(t, p.Update(set, ratelimit.MigrateProportional))
	assert.Equal(t, "free2", p.Set().Plans["free"].Rule.(ratelimit.FixedWindow).Name)

	d, err := p.Check("f", ratelimit.Unit/1000)
	require.NoError(t, err)
	assert.Equal(t, "free2", d.Policy)
	assert.Equal(t, int64(40-30-1), d.Remaining, "15 of 20 spent is 30 of 40")
	// The sliding log kept its entries: the first (1 unit at 1 min) leaves
	// the window at 61 min, not an hour from now.
	clk.Set(61 * time.Minute)
	d, err = p.Check("p", 195*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "1 + 2 + 3 spent, the first expired: 5 spent, 195 left")
	assert.Equal(t, int64(0), d.Remaining)

	// A set that does not validate is refused whole.
	bad := set
	bad.Plans = map[string]ratelimit.Plan{"free": {Rule: ratelimit.GCRA{}}, "pro": set.Plans["pro"]}
	require.ErrorIs(t, p.Update(bad, ratelimit.MigrateProportional), ratelimit.ErrInvalidRule)
	assert.Equal(t, "free2", p.Set().Plans["free"].Rule.(ratelimit.FixedWindow).Name)
	require.ErrorIs(t, p.Update(ratelimit.PlanSet{Plans: set.Plans, Default: "gold"}, 0), ratelimit.ErrInvalidRule)
	require.ErrorIs(t, p.Update(set, ratelimit.Migration(9)), ratelimit.ErrInvalidOption)
}

// planModel is the reference for TestPlansMatchModel: per plan, its rule
// and a version that every rule change bumps; per key, the plan and version
// its state belongs to and a model of that state. A key that moves with
// something spent is converted as Migration describes, which the model does
// not follow: from then on only what describes its rule is compared (the
// properties of moves, in plans_migrate_test.go, hold those keys to their
// bounds).
type planModel struct {
	rules    map[string]limitCase
	versions map[string]int
	// replacedBy[plan][v] is the policy of the update that replaced
	// version v of plan's rule.
	replacedBy map[string]map[int]ratelimit.Migration
	keys       map[string]*keyModel
	onMove     ratelimit.Migration
}

type keyModel struct {
	plan    string
	version int
	lc      limitCase
	m       refmodel.Migrator
	moved   bool // moved with something spent: compared by rule only
}

// step returns the Decision the model expects, and whether it is exact.
func (pm *planModel) step(key, plan string, now, cost int64) (ratelimit.Decision, bool) {
	lc := pm.rules[plan]
	km := pm.keys[key]
	switch {
	case km == nil:
		km = &keyModel{plan: plan, version: pm.versions[plan], lc: lc, m: lc.newModel().(refmodel.Migrator)}
		pm.keys[key] = km
	case km.plan != plan || km.version != pm.versions[plan]:
		policy := pm.onMove
		if km.plan == plan {
			policy = pm.replacedBy[plan][km.version]
		}
		spent := km.m.Spent(now)
		to := lc.capMilli
		var carried int64
		switch policy {
		case ratelimit.MigrateProportional:
			carried = (spent*to + km.lc.capMilli - 1) / km.lc.capMilli
		case ratelimit.MigrateAsIs:
			if spent > 0 { // a fresh key stays fresh
				carried = to - min(km.lc.capMilli-spent, to)
			}
		case ratelimit.MigrateAdditive:
			carried = min(spent, to)
		}
		m := lc.newModel().(refmodel.Migrator)
		m.SetSpent(now, carried)
		*km = keyModel{plan: plan, version: pm.versions[plan], lc: lc, m: m, moved: km.moved || spent > 0 && policy != ratelimit.MigrateReset}
	}
	d := lc.want(km.m.Step(now, cost))
	if d.Policy == "" {
		d.Policy = plan // an unnamed rule's Decision names the plan
	}
	return d, !km.moved
}

// TestPlansMatchModel: random traces of checks, plan moves and rule
// changes at random instants, for all seven algorithms mixed, against a
// reference model that applies each migration policy exactly.
func TestPlansMatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c"}[:rapid.IntRange(1, 3).Draw(t, "plans")]
		drawPlan := func() limitCase {
			// Capacities up to 1000 units keep proportional products exact
			// in int64 in the model.
			return drawLimitCase(t, rapid.SampledFrom(testedAlgorithms).Draw(t, "algorithm"))
		}
		pm := &planModel{
			rules: map[string]limitCase{}, versions: map[string]int{},
			replacedBy: map[string]map[int]ratelimit.Migration{}, keys: map[string]*keyModel{},
			onMove: ratelimit.Migration(rapid.IntRange(0, 3).Draw(t, "onMove")),
		}
		set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{}, Default: names[0], OnMove: pm.onMove}
		for _, n := range names {
			pm.rules[n] = drawPlan()
			set.Plans[n] = ratelimit.Plan{Rule: pm.rules[n].rule}
			pm.replacedBy[n] = map[int]ratelimit.Migration{}
		}
		var kp keyPlans
		clk := ratelimit.NewManualClock(0)
		p, err := ratelimit.NewPlans(set, kp.of, ratelimit.WithClock(clk))
		require.NoError(t, err)
		keys := []string{"k1", "k2", "k3"}
		for i, n := 0, rapid.IntRange(1, 60).Draw(t, "ops"); i < n; i++ {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0: // a key moves
				kp.set(rapid.SampledFrom(keys).Draw(t, "moving"), rapid.SampledFrom(names).Draw(t, "to"))
			case 1: // a plan's rule changes
				n := rapid.SampledFrom(names).Draw(t, "changed")
				m := ratelimit.Migration(rapid.IntRange(0, 3).Draw(t, "policy"))
				lc := drawPlan()
				set.Plans[n] = ratelimit.Plan{Rule: lc.rule}
				require.NoError(t, p.Update(set, m))
				if lc.rule != pm.rules[n].rule { // an unchanged rule keeps its store
					pm.replacedBy[n][pm.versions[n]] = m
					pm.versions[n]++
				}
				pm.rules[n] = lc
			default:
				clk.Advance(time.Duration(rapid.Int64Range(0, int64(pm.rules[names[0]].scale)).Draw(t, "gap")))
				key := rapid.SampledFrom(keys).Draw(t, "key")
				plan := kp.of(key)
				if _, ok := pm.rules[plan]; !ok {
					plan = names[0]
				}
				cost := drawCostWithin(t, pm.rules[plan].capMilli, "cost")
				want, exact := pm.step(key, plan, int64(clk.Now()), int64(cost))
				got, err := p.Check(key, cost)
				require.NoError(t, err)
				if !exact {
					want = ratelimit.Decision{Policy: want.Policy, Limit: want.Limit, Window: want.Window}
					got = ratelimit.Decision{Policy: got.Policy, Limit: got.Limit, Window: got.Window}
				}
				require.Equal(t, want, got, "op %d: %q on %q cost %d at %d", i, key, plan, cost, clk.Now())
			}
		}
	})
}

// TestPlansConcurrentUpdates: checks on 1,000 goroutines while another
// goroutine changes the rules 60 times. Every Decision is one rule's, and
// no key is admitted more than the larger rule allows: with policies that
// never give back what was spent, each rule's bound holds across the
// changes.
//
// The changes are fewer than the replaced plans a rule set keeps (64): a
// key last checked under a plan replaced longer ago than that starts
// fresh, as Plans says.
func TestPlansConcurrentUpdates(t *testing.T) {
	ten := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"p": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 10, Window: 1000 * time.Hour, Name: "ten"}},
			{Rule: ratelimit.GCRA{Rate: slow, Burst: 1000, Name: "ten-global"}, Key: func(string) string { return "all" }},
		}},
	}, Default: "p"}
	twenty := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"p": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 20, Window: 1000 * time.Hour, Name: "twenty"}},
			{Rule: ratelimit.GCRA{Rate: slow, Burst: 1000, Name: "twenty-global"}, Key: func(string) string { return "all" }},
		}},
	}, Default: "p"}
	clk := ratelimit.NewManualClock(0)
	p, err := ratelimit.NewPlans(ten, nil, ratelimit.WithClock(clk))
	require.NoError(t, err)
	keys := []string{"a", "b", "c", "d", "e"}
	var admitted [5]atomic.Int64
	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			i := g % len(keys)
			d, err := p.Check(keys[i], ratelimit.Unit)
			if !assert.NoError(t, err) {
				return
			}
			switch d.Policy {
			case "ten", "ten-global":
				assert.Contains(t, []int64{10, 1000}, d.Limit)
			case "twenty", "twenty-global":
				assert.Contains(t, []int64{20, 1000}, d.Limit)
			default:
				t.Errorf("policy %q", d.Policy)
			}
			if d.Allowed {
				admitted[i].Add(1)
				total.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		for i := range 60 {
			// Proportional and as-is never give back what a key has
			// spent, so over any number of changes a key is admitted at
			// most the larger limit. (Additive keeps the units spent
			// capped at the new capacity: a move down to 10 and back up
			// to 20 gives back what the cap cut off, as it says.)
			set, m := twenty, ratelimit.MigrateAsIs
			if i%2 == 1 {
				set, m = ten, ratelimit.MigrateProportional
			}
			assert.NoError(t, p.Update(set, m))
		}
	}()
	close(start)
	wg.Wait()
	for i := range admitted {
		assert.LessOrEqual(t, admitted[i].Load(), int64(20), "key %q", keys[i])
	}
	assert.LessOrEqual(t, total.Load(), int64(1000))
}

// TestPlansWaitRetimes: a waiter asleep under a slow rule wakes when an
// Update brings a faster one, and is admitted at the instant the new rule
// allows, not at its stale RetryAfter.
func TestPlansWaitRetimes(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"p": {Rule: ratelimit.GCRA{Rate: ratelimit.Every(time.Hour), Burst: 1}},
	}, Default: "p"}
	p, err := ratelimit.NewPlans(set, nil, ratelimit.WithClock(clk))
	require.NoError(t, err)
	_, err = p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan ratelimit.Decision, 1)
	go func() {
		// No deadline: the wait is an hour of virtual time.
		d, err := p.Wait(context.Background(), "k", ratelimit.Unit)
		assert.NoError(t, err)
		done <- d
	}()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1), "waiting for the waiter to sleep")
	at, _ := clk.NextWake()
	require.Equal(t, time.Hour, at)
	// One per second now, additive: the 1 unit spent stays spent, and
	// refills in a second.
	set.Plans["p"] = ratelimit.Plan{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}}
	require.NoError(t, p.Update(set, ratelimit.MigrateAdditive))
	require.NoError(t, waitUntil(ctx, func() bool { at, ok := clk.NextWake(); return ok && at == time.Second }),
		"waiting for the waiter to retime to 1s")
	clk.Set(time.Second)
	select {
	case d := <-done:
		assert.True(t, d.Allowed)
	case <-ctx.Done():
		t.Fatal("the waiter was not admitted at 1s")
	}
}

// waitUntil polls cond (real time, briefly) until it holds or ctx ends.
func waitUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// TestContextWithPlan: a context can name the plan, over the plan function.
func TestContextWithPlan(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour}},
			"pro":  {Rule: ratelimit.FixedWindow{Limit: 10, Window: time.Hour}},
		},
		Default: "free",
	}, func(string) string { return "free" }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := p.CheckContext(ratelimit.ContextWithPlan(context.Background(), "pro"), "k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, "pro", d.Policy)
	assert.Equal(t, int64(9), d.Remaining)
	d, err = p.CheckContext(ratelimit.ContextWithPlan(context.Background(), "gold"), "j", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, "free", d.Policy, "an unknown plan is the default")
	d, err = p.CheckContext(context.Background(), "k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, "free", d.Policy, "the plan function's plan")
	assert.False(t, d.Allowed, "9 of 10 spent on pro is 1 of 1 on free")
}

// BenchmarkPlansCheck compares a check through Plans (two plans, the key
// already on its plan) with the same check on a Store, and the first check
// of a new key, which looks for it in the other plan's store.
func BenchmarkPlansCheck(b *testing.B) {
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000_000), Burst: 1_000_000}
	set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"free": {Rule: rule},
		"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000_000), Burst: 2_000_000}},
	}, Default: "free"}
	b.Run("Store", func(b *testing.B) {
		s, err := ratelimit.NewStore(rule)
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = s.Check("k", ratelimit.Unit)
		}
	})
	b.Run("Plans", func(b *testing.B) {
		p, err := ratelimit.NewPlans(set, func(string) string { return "free" })
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = p.Check("k", ratelimit.Unit)
		}
	})
	b.Run("Plans/new-keys", func(b *testing.B) {
		p, err := ratelimit.NewPlans(set, func(string) string { return "free" }, ratelimit.WithMaxKeys(1<<16))
		require.NoError(b, err)
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "key-" + string(rune('a'+i%26)) + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_, _ = p.Check(keys[i&(len(keys)-1)], ratelimit.Unit)
			i++
		}
	})
}

// TestPlansNewKeyAllocatesNothing: the first check of a key on a rule set
// of several plans, which looks for the key in the other plans' stores
// before adding it to its own, allocates nothing, as a store's does (each
// new key would otherwise give the garbage collector work, and the checks
// of a flood of new keys its pauses).
func TestPlansNewKeyAllocatesNothing(t *testing.T) {
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}
	set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"free": {Rule: rule},
		"paid": {Layers: []ratelimit.Layer{{Rule: rule}, {Rule: rule, Key: func(k string) string { return k[1:] }}}},
		"team": {Rule: rule},
	}, Default: "free"}
	p, err := ratelimit.NewPlans(set, func(k string) string { return k[:4] }, ratelimit.WithMaxKeys(10_000), ratelimit.WithPreallocation())
	require.NoError(t, err)
	for _, plan := range []string{"free", "paid", "team"} {
		keys := make([]string, 200)
		for i := range keys {
			keys[i] = plan + strconv.Itoa(i)
		}
		i := 0
		allocs := testing.AllocsPerRun(len(keys)-1, func() {
			if _, err := p.Check(keys[i], ratelimit.Unit); err != nil {
				t.Fatalf("check of a new key %q: %v", keys[i], err)
			}
			i++
		})
		assert.Zero(t, allocs, "allocations per new key on plan %s", plan)
	}
}
