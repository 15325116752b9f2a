package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// planRules numbers the rules drawPlanRule draws, so that no two are alike:
// a plan's keys are named by its rule, and a rule that came back after an
// Update would find its old keys where the in-process Plans builds a new
// store. An unnamed rule is drawn once: one drawn again is named.
var (
	planRules int
	unnamed   = map[string]bool{}
)

// drawPlanRule draws a rule of any algorithm with a small capacity and a
// window of seconds to minutes, so that traces refuse, cross windows and
// move keys that are partly spent.
func drawPlanRule(t *rapid.T, label string) ratelimit.Rule {
	planRules++
	name := "r" + strconv.Itoa(planRules)
	unnamedDrawn := rapid.Bool().Draw(t, label+"unnamed")
	c := rapid.Int64Range(1, 6).Draw(t, label+"capacity")
	w := time.Duration(rapid.SampledFrom([]int{1, 2, 3, 10, 60}).Draw(t, label+"seconds")) * time.Second
	r := ratelimit.Rate{Count: c, Per: w}
	var build func(name string) ratelimit.Rule
	switch rapid.IntRange(0, 6).Draw(t, label+"algorithm") {
	case 0:
		build = func(name string) ratelimit.Rule { return ratelimit.TokenBucket{Rate: r, Burst: c, Name: name} }
	case 1:
		build = func(name string) ratelimit.Rule { return ratelimit.GCRA{Rate: r, Burst: c, Name: name} }
	case 2:
		build = func(name string) ratelimit.Rule { return ratelimit.LeakyBucket{Rate: r, Capacity: c, Name: name} }
	case 3:
		build = func(name string) ratelimit.Rule { return ratelimit.FixedWindow{Limit: c, Window: w, Name: name} }
	case 4:
		build = func(name string) ratelimit.Rule { return ratelimit.SlidingLog{Limit: c, Window: w, Name: name} }
	case 5:
		refused := rapid.Bool().Draw(t, label+"refused")
		build = func(name string) ratelimit.Rule {
			return ratelimit.SlidingCounter{Limit: c, Window: w, Name: name, CountRefused: refused}
		}
	default:
		k := rapid.SampledFrom([]int{1, 2, 5}).Draw(t, label+"buckets")
		build = func(name string) ratelimit.Rule {
			return ratelimit.SubWindow{Limit: c, Window: w, Buckets: k, Name: name}
		}
	}
	if u := build(""); unnamedDrawn && !unnamed[fmt.Sprintf("%T%+v", u, u)] {
		unnamed[fmt.Sprintf("%T%+v", u, u)] = true
		return u // the plan's name then stands in for its name
	}
	return build(name)
}

// drawPlan draws a plan of one rule or of two layers (the second a shadow
// at times), each layer keyed by the key itself, by a constant (a global
// limit) or by the key's first letter (a customer's limit, shared by its
// keys).
func drawPlan(t *rapid.T, label string) ratelimit.Plan {
	if rapid.IntRange(0, 3).Draw(t, label+"layers") > 0 {
		return ratelimit.Plan{Rule: drawPlanRule(t, label)}
	}
	return ratelimit.Plan{Layers: []ratelimit.Layer{
		{Rule: drawPlanRule(t, label+"0"), Key: drawLayerKey(t, label+"0")},
		{Rule: drawPlanRule(t, label+"1"), Key: drawLayerKey(t, label+"1"), Shadow: rapid.IntRange(0, 3).Draw(t, label+"shadow") == 0},
	}}
}

// drawLayerKey draws a layer's Key: nil (the key itself), a constant, or
// the key's first letter.
func drawLayerKey(t *rapid.T, label string) func(string) string {
	switch rapid.IntRange(0, 3).Draw(t, label+"key") {
	case 0:
		return func(string) string { return "all" }
	case 1:
		return func(key string) string { return key[:1] }
	}
	return nil
}

var planNames = []string{"free", "pro", "team"}

// drawPlanSet draws a set of two or three plans, each kept from old (if
// any) or drawn anew; shared notes the places of the layers with a Key of
// every plan drawn (see unshare).
func drawPlanSet(t *rapid.T, old *ratelimit.PlanSet, shared map[string]map[int]bool) ratelimit.PlanSet {
	n := rapid.IntRange(2, 3).Draw(t, "plans")
	set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{}, Default: "free",
		OnMove: ratelimit.Migration(rapid.IntRange(0, 2).Draw(t, "onMove"))}
	for _, name := range planNames[:n] {
		if old != nil {
			if pl, ok := old.Plans[name]; ok && rapid.Bool().Draw(t, name+"kept") {
				set.Plans[name] = pl
				continue
			}
		}
		pl := drawPlan(t, name)
		unshare(shared, name, pl)
		set.Plans[name] = pl
	}
	return set
}

// unshare makes a layer of pl that has a Key where an earlier plan of the
// same name had one a layer of the key's own, and notes where pl's layers
// with a Key are. An Update that changes a shared layer's rule moves the
// state it shares when a key whose record names the replaced plan is
// checked first, and an in-process Plans' records and Redis's can name
// different plans then (see [ratelimit.Migration]): the traces leave that
// out.
func unshare(shared map[string]map[int]bool, name string, pl ratelimit.Plan) {
	if shared[name] == nil {
		shared[name] = map[int]bool{}
	}
	for i := range pl.Layers {
		if shared[name][i] {
			pl.Layers[i].Key = nil
		} else if pl.Layers[i].Key != nil {
			shared[name][i] = true
		}
	}
}

// TestPlansSameDecisionsAsInProcess: Plans in Redis gives the in-process
// Plans' Decisions, field for field, on the same traces at the same
// instants (a client clock): random plan sets of every algorithm and of
// layers (keyed by the key, by a constant or by a customer's part of the
// key), keys checked on the plan their plan function names or a context
// names, checks with a cap on the Delay (CheckWithin), checks that list
// every layer's Decision (CheckLayers), plans switched,
// and Updates of random policies that keep some plans and replace others.
func TestPlansSameDecisionsAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		clk := ratelimit.NewManualClock(unixNow + time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "start")))
		on := map[string]string{}
		planOf := func(key string) string { return on[key] }
		shared := map[string]map[int]bool{}
		set := drawPlanSet(t, nil, shared)
		local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
		require.NoError(t, err)
		remote, err := NewPlans(rdb, set, planOf, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second), WithDenyCache(0))
		require.NoError(t, err)
		keys := []string{"a1", "a2", "b1"}
		ats := map[string][]time.Duration{}
		// sameErr requires Redis's error to be the in-process one: none,
		// or the same cost error.
		sameErr := func(i int, werr, gerr error) {
			if werr == nil {
				require.NoError(t, gerr, "step %d", i)
				return
			}
			for _, e := range []error{ratelimit.ErrInvalidCost, ratelimit.ErrCostExceedsCapacity} {
				if errors.Is(werr, e) {
					require.ErrorIs(t, gerr, e, "step %d", i)
					return
				}
			}
			t.Fatalf("step %d: in process %v", i, werr)
		}
		// sameCheck requires Redis's check (what, of key) to be the
		// in-process one, notes an admission's instant, and reports
		// whether there was a Decision (a cost error has none).
		sameCheck := func(i int, key, what string, want, got ratelimit.Decision, werr, gerr error) bool {
			if werr != nil {
				require.ErrorIs(t, gerr, ratelimit.ErrCostExceedsCapacity, "step %d", i)
				return false
			}
			require.NoError(t, gerr, "step %d", i)
			require.Equal(t, want, got, "step %d: %s at %v", i, what, clk.Now()-unixNow)
			if want.Allowed {
				ats[key] = append(ats[key], want.At)
			}
			return true
		}
		// drawCtx draws a context that at times names a plan.
		drawCtx := func() context.Context {
			if rapid.IntRange(0, 4).Draw(t, "named") == 0 {
				return ratelimit.ContextWithPlan(context.Background(), rapid.SampledFrom(planNames).Draw(t, "ctxPlan"))
			}
			return context.Background()
		}
		for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 18).Draw(t, "action") {
			case 18:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := ratelimit.Units(rapid.Int64Range(1, 3).Draw(t, "units")) * ratelimit.Unit
				maxDelay := rapid.SampledFrom([]time.Duration{0, 0, -1, time.Millisecond, 10 * time.Second}).Draw(t, "layersMaxDelay")
				ctx := drawCtx()
				want, wl, werr := local.CheckLayers(ctx, key, cost, maxDelay, nil)
				got, gl, gerr := remote.CheckLayers(ctx, key, cost, maxDelay, nil)
				what := fmt.Sprintf("layers %v: key %s cost %d", maxDelay, key, cost)
				if sameCheck(i, key, what, want, got, werr, gerr) {
					require.Equal(t, wl, gl, "step %d: the layers' Decisions", i)
				}
			case 16, 17:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := ratelimit.Units(rapid.Int64Range(1, 3).Draw(t, "units")) * ratelimit.Unit
				maxDelay := rapid.OneOf(
					rapid.SampledFrom([]time.Duration{-1, 0, 1, time.Millisecond, time.Second, 10 * time.Second, time.Minute}),
					rapid.Map(rapid.Int64Range(0, int64(2*time.Minute)), func(v int64) time.Duration { return time.Duration(v) }),
				).Draw(t, "maxDelay")
				want, werr := local.CheckWithin(key, cost, maxDelay)
				got, gerr := remote.CheckWithin(key, cost, maxDelay)
				sameCheck(i, key, fmt.Sprintf("within %v: key %s cost %d", maxDelay, key, cost), want, got, werr, gerr)
			case 10:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := ratelimit.Units(rapid.Int64Range(0, 3).Draw(t, "units")) * ratelimit.Unit
				want, werr := local.Peek(key, cost)
				got, gerr := remote.Peek(key, cost)
				sameErr(i, werr, gerr)
				require.Equal(t, want, got, "step %d: peek %s cost %d at %v", i, key, cost, clk.Now()-unixNow)
			case 11, 12:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := ratelimit.Units(rapid.Int64Range(-1, 4000).Draw(t, "refund"))
				at := drawAt(t, ats[key])
				want, werr := local.Refund(key, cost, at)
				got, gerr := remote.Refund(key, cost, at)
				sameErr(i, werr, gerr)
				require.Equal(t, want, got, "step %d: refund %s %d at %v", i, key, cost, at-unixNow)
			case 13, 14:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				charged := ratelimit.Units(rapid.Int64Range(0, 3).Draw(t, "charged")) * ratelimit.Unit
				actual := ratelimit.Units(rapid.Int64Range(-1, 8000).Draw(t, "actual"))
				at := drawAt(t, ats[key])
				want, wx, werr := local.Settle(key, charged, actual, at)
				got, gx, gerr := remote.Settle(key, charged, actual, at)
				sameErr(i, werr, gerr)
				require.Equal(t, want, got, "step %d: settle %s %d %d at %v", i, key, charged, actual, at-unixNow)
				require.Equal(t, wx, gx, "step %d: settled", i)
			case 15:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				local.Reset(key)
				require.NoError(t, remote.Reset(key), "step %d", i)
			case 0, 1:
				clk.Advance(time.Duration(rapid.Int64Range(0, int64(5*time.Second)).Draw(t, "advance")))
			case 2:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				on[key] = rapid.SampledFrom(append(planNames, "none")).Draw(t, "plan")
			case 3:
				if rapid.IntRange(0, 2).Draw(t, "update") == 0 {
					set = drawPlanSet(t, &set, shared)
					m := ratelimit.Migration(rapid.IntRange(0, 3).Draw(t, "policy"))
					require.NoError(t, local.Update(set, m))
					require.NoError(t, remote.Update(set, m))
				}
			default:
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := ratelimit.Units(rapid.Int64Range(1, 3).Draw(t, "units")) * ratelimit.Unit
				ctx := drawCtx()
				want, werr := local.CheckContext(ctx, key, cost)
				got, gerr := remote.CheckContext(ctx, key, cost)
				sameCheck(i, key, fmt.Sprintf("key %s cost %d", key, cost), want, got, werr, gerr)
			}
		}
		st := remote.Stats()
		assert.Zero(t, st.InvalidStates+st.Mismatches+st.Failures)
	})
}

// countCalls counts the commands a client sends (a script call is one).
type countCalls struct{ n int }

func (c *countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n++
		return next(ctx, cmd)
	}
}
func (c *countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n += len(cmds)
		return next(ctx, cmds)
	}
}

// TestPlansRoundTrips: a key new to Redis and a key its plan holds are
// checked in one script call; a key that moves, in two.
func TestPlansRoundTrips(t *testing.T) {
	needRedis(t)
	rdb := shared.Client(nil)
	defer rdb.Close()
	calls := &countCalls{}
	rdb.AddHook(calls)
	clk := ratelimit.NewManualClock(unixNow)
	plan := "free"
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(10), Burst: 10}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Minute}},
			{Rule: ratelimit.SlidingLog{Limit: 1000, Window: time.Hour}},
		}},
	}}
	p, err := NewPlans(rdb, set, func(string) string { return plan }, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	check := func() int {
		// Load the script first, so that EVALSHA's NOSCRIPT fallback is
		// not counted.
		calls.n = 0
		d, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		return calls.n
	}
	check()
	_, err = p.Check("warm", ratelimit.Unit)
	require.NoError(t, err)
	require.NoError(t, rdb.Del(context.Background(), p.RecordKey("k"), p.Keys("free", "k")[0]).Err())
	assert.Equal(t, 1, check(), "a new key")
	assert.Equal(t, 1, check(), "a held key")
	plan = "pro"
	assert.Equal(t, 2, check(), "a key that moves")
	assert.Equal(t, 1, check(), "a held key of layers")
	assert.Equal(t, uint64(1), p.Stats().Moves)
}

// TestPlansRecordAndKeys: a key's record names its plan's keys and rules;
// they share the record's hash tag; a move deletes the old key and
// carries the spent allowance over.
func TestPlansRecordAndKeys(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	plan := "free"
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 4, Window: time.Hour}},
		"pro":  {Rule: ratelimit.FixedWindow{Limit: 40, Window: time.Hour}},
	}}
	p, err := NewPlans(rdb, set, func(string) string { return plan }, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	for range 3 {
		_, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	free, pro := p.Keys("free", "k")[0], p.Keys("pro", "k")[0]
	rec := p.RecordKey("k")
	tag := rec[len(rec)-34:]
	assert.Equal(t, tag, free[len(free)-34:], "one hash tag")
	got, err := rdb.Get(ctx, rec).Result()
	require.NoError(t, err)
	assert.Equal(t, free+"\n"+p.gen.Load().plans["free"].json+"\n", got)
	ttl, err := rdb.PTTL(ctx, rec).Result()
	require.NoError(t, err)
	stTTL, err := rdb.PTTL(ctx, free).Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ttl, stTTL, "the record outlives the state")
	plan = "pro"
	d, err := p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, int64(40-30-1), d.Remaining, "3 of 4 spent is 30 of 40")
	assert.Zero(t, rdb.Exists(ctx, free).Val(), "the move took the old state")
	assert.Equal(t, int64(1), rdb.Exists(ctx, pro).Val())
	got, err = rdb.Get(ctx, rec).Result()
	require.NoError(t, err)
	assert.Regexp(t, "^"+pro+"\n.*\n0 [0-9]+ [0-9]+ 30000 30000 0 0$", got, "the record carries the move")
}

// TestPlansRollingReload: two replicas on two clients, one on the old rule
// set and one updated to the new, check one key in turn. Each check moves
// the key between the rule sets, and each gets the Decision of an
// in-process Plans that is updated back and forth between the two sets
// as the checks alternate: no flip hands the key a fresh allowance.
func TestPlansRollingReload(t *testing.T) {
	needRedis(t)
	for _, m := range []ratelimit.Migration{ratelimit.MigrateProportional, ratelimit.MigrateAdditive, ratelimit.MigrateAsIs} {
		t.Run(m.String(), func(t *testing.T) {
			c1, c2 := shared.Client(nil), shared.Client(nil)
			defer c1.Close()
			defer c2.Close()
			clk := ratelimit.NewManualClock(unixNow)
			old := ratelimit.PlanSet{Default: "pro", Plans: map[string]ratelimit.Plan{
				"pro": {Rule: ratelimit.SlidingLog{Limit: 10, Window: time.Minute}},
			}}
			upgraded := ratelimit.PlanSet{Default: "pro", Plans: map[string]ratelimit.Plan{
				"pro": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(20), Burst: 20}},
			}}
			prefix := testPrefix()
			r1, err := NewPlans(c1, old, nil, WithClock(clk), WithPrefix(prefix), WithTimeout(10*time.Second), WithDenyCache(0))
			require.NoError(t, err)
			r2, err := NewPlans(c2, old, nil, WithClock(clk), WithPrefix(prefix), WithTimeout(10*time.Second), WithDenyCache(0))
			require.NoError(t, err)
			require.NoError(t, r2.Update(upgraded, m))
			local, err := ratelimit.NewPlans(old, nil, ratelimit.WithClock(clk))
			require.NoError(t, err)
			onNew, admitted := false, 0
			for i := range 120 {
				toNew := i%3 != 0 // two of three checks reach the upgraded replica
				if toNew != onNew {
					next, policy := old, m // r1 moves a key back by the policy it was moved in with
					if toNew {
						next, policy = upgraded, m
					}
					require.NoError(t, local.Update(next, policy))
					onNew = toNew
				}
				r := r1
				if toNew {
					r = r2
				}
				want, err := local.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				got, err := r.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, want, got, "check %d", i)
				if got.Allowed {
					admitted++
				}
				clk.Advance(time.Second)
			}
			// 120 s: at most the more generous rule's 20 + 40, plus one
			// capacity.
			assert.LessOrEqual(t, admitted, 20+40+20)
			assert.Greater(t, r1.Stats().Moves+r2.Stats().Moves, uint64(70))
		})
	}
}

// TestPlansConcurrentMoves: checks from three clients on one key, each on
// a random one of two plans of the same capacity (at one instant, a move
// keeps what is spent exactly), admit the capacity and not one more.
func TestPlansConcurrentMoves(t *testing.T) {
	needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	set := ratelimit.PlanSet{Default: "a", Plans: map[string]ratelimit.Plan{
		"a": {Rule: ratelimit.FixedWindow{Limit: 30, Window: time.Hour}},
		"b": {Rule: ratelimit.SlidingLog{Limit: 30, Window: time.Hour}},
		"c": {Layers: []ratelimit.Layer{{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(30), Burst: 30}}, {Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Hour}}}},
	}}
	prefix := testPrefix()
	var replicas []*Plans
	for range 3 {
		c := shared.Client(nil)
		defer c.Close()
		p, err := NewPlans(c, set, nil, WithClock(clk), WithPrefix(prefix), WithTimeout(10*time.Second))
		require.NoError(t, err)
		replicas = append(replicas, p)
	}
	type result struct {
		allowed bool
		err     error
	}
	results := make(chan result, 300)
	for w := range 12 {
		go func() {
			for j := range 25 {
				plan := []string{"a", "b", "c"}[(w+j)%3]
				ctx := ratelimit.ContextWithPlan(context.Background(), plan)
				d, err := replicas[w%3].CheckContext(ctx, "k", ratelimit.Unit)
				results <- result{d.Allowed, err}
			}
		}()
	}
	admitted := 0
	timeout := time.After(60 * time.Second)
	for range 300 {
		select {
		case r := <-results:
			require.NoError(t, r.err)
			if r.allowed {
				admitted++
			}
		case <-timeout:
			t.Fatal("checks did not finish")
		}
	}
	assert.Equal(t, 30, admitted)
	var moves, conflicts uint64
	for _, p := range replicas {
		moves += p.Stats().Moves
		conflicts += p.Stats().Conflicts
	}
	assert.Positive(t, moves)
	t.Logf("moves %d, conflicts %d", moves, conflicts)
}

// TestPlansCorruptRecord: a record that is not well formed, names keys of
// no plan, carries a move no rule could have made, or is of another type,
// refuses the check with ErrInvalidState, whatever the failure mode, and
// is left as it was.
func TestPlansCorruptRecord(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(10), Burst: 10}},
		"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}},
	}}
	for _, mode := range []FailureMode{FailOpen, FailClosed} {
		prefix := testPrefix()
		p, err := NewPlans(rdb, set, nil, WithClock(clk), WithPrefix(prefix), WithTimeout(10*time.Second), WithFailureMode(mode))
		require.NoError(t, err)
		pro := p.Keys("pro", "k")[0]
		proJSON := p.gen.Load().plans["pro"].json
		for i, rec := range []string{
			"garbage",
			"\n\n",
			" " + pro + "\n" + proJSON + "\n",
			pro + "  " + pro + "\n" + proJSON + "\n",
			"otherprefix:P1:{x}\n" + proJSON + "\n",
			pro + "\n{not json\n",
			pro + "\n" + `{"plan":"pro","rules":[{"algorithm":"gcra","rate":"0/s","burst":1}]}` + "\n",
			pro + "\n" + `{"plan":"pro","rules":[]}` + "\n",
			pro + "\n" + proJSON,
			pro + "\n" + proJSON + "\n1 2 3",
			pro + "\n" + proJSON + "\n5 4 1000 1000",
			pro + "\n" + proJSON + "\n1 99999999999999999999 1000 1000",
			pro + "\n" + proJSON + "\n1 9 1000 200000000",
			pro + " " + pro + "\n" + proJSON + "\n",
		} {
			key := fmt.Sprint("k", i)
			rk := p.RecordKey(key)
			proKey := p.Keys("pro", key)[0]
			rec = strings.ReplaceAll(rec, pro, proKey)
			require.NoError(t, rdb.Set(ctx, rk, rec, time.Hour).Err())
			require.NoError(t, rdb.Set(ctx, proKey, fmt.Sprint(int64(unixNow), " ", int64(unixNow)+int64(time.Minute), " 0"), time.Hour).Err())
			d, err := p.Check(key, ratelimit.Unit)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "record %q", rec)
			assert.False(t, d.Allowed, "record %q admitted", rec)
			got, _ := rdb.Get(ctx, rk).Result()
			assert.Equal(t, rec, got, "the record was written over")
		}
		// A record, or a state it names, of another type.
		require.NoError(t, rdb.HSet(ctx, p.RecordKey("h"), "x", "1").Err())
		_, err = p.Check("h", ratelimit.Unit)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidState)
		proH := p.Keys("pro", "h2")[0]
		require.NoError(t, rdb.Set(ctx, p.RecordKey("h2"), proH+"\n"+proJSON+"\n", time.Hour).Err())
		require.NoError(t, rdb.LPush(ctx, proH, "x").Err())
		_, err = p.Check("h2", ratelimit.Unit)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidState)
		// A well-formed record of another plan moves as it should.
		require.NoError(t, rdb.Set(ctx, p.RecordKey("ok"), p.Keys("pro", "ok")[0]+"\n"+proJSON+"\n", time.Hour).Err())
		d, err := p.Check("ok", ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		st := p.Stats()
		assert.Zero(t, st.Failures)
		assert.Positive(t, st.InvalidStates)
	}
}

// TestPlansDenyCache: a plan of one rule repeats a refusal Redis made
// without a round trip, as a Store's deny cache does; a key that moves to
// another plan is asked of Redis.
func TestPlansDenyCache(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	plan := "free"
	set := ratelimit.PlanSet{Default: "free", OnMove: ratelimit.MigrateAdditive, Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(2), Burst: 2}},
		"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(20), Burst: 20}},
	}}
	p, err := NewPlans(rdb, set, func(string) string { return plan }, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	for i := range 5 {
		d, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, i < 2, d.Allowed)
	}
	assert.Equal(t, uint64(2), p.Stats().LocalDenials, "the refusals after the first")
	// A Wait's checks go to Redis, as Store.Wait's do.
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := p.Wait(short, "k", ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
	assert.False(t, d.Allowed)
	assert.Equal(t, uint64(2), p.Stats().LocalDenials, "Wait did not ask the deny cache")
	plan = "pro"
	d, err = p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "2 spent of 2 is 2 of 20: pro has room")
	assert.Equal(t, uint64(1), p.Stats().Moves)
}

// TestPlansWait: Wait sleeps out RetryAfter on the client clock and is
// admitted once the clock gets there; a waiter asleep when an Update
// changes the rules wakes and asks again under the new ones.
func TestPlansWait(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	set := func(burst int64) ratelimit.PlanSet {
		return ratelimit.PlanSet{Default: "free", OnMove: ratelimit.MigrateAdditive, Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: burst}},
		}}
	}
	p, err := NewPlans(rdb, set(1), nil, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
	require.NoError(t, err)
	d, err := p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	done := make(chan ratelimit.Decision, 1)
	go func() {
		d, err := p.Wait(ctx, "k", ratelimit.Unit)
		assert.NoError(t, err)
		done <- d
	}()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(time.Second)
	select {
	case d = <-done:
		assert.True(t, d.Allowed)
	case <-ctx.Done():
		t.Fatal("the waiter was not admitted")
	}

	go func() {
		d, err := p.Wait(ctx, "k", ratelimit.Unit)
		assert.NoError(t, err)
		done <- d
	}()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	// One spent of a burst of 2 leaves room: the waiter need not sleep on.
	require.NoError(t, p.Update(set(2), ratelimit.MigrateAdditive))
	select {
	case d = <-done:
		assert.True(t, d.Allowed)
		assert.Equal(t, unixNow+time.Second, d.At, "admitted without the clock moving")
	case <-ctx.Done():
		t.Fatal("the waiter slept through the Update")
	}

	short, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	d, err = p.Wait(short, "k", ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "as Store.Wait gives up")
	assert.False(t, d.Allowed)
}
