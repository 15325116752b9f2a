package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// drillPlans is a rule set whose plans' first checks of a fresh key leave
// Remaining 2 on free and 9 on pro.
var drillPlans = ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
	"free": {Rule: drillRule},
	"pro":  {Layers: []ratelimit.Layer{{Rule: ratelimit.GCRA{Rate: ratelimit.Every(year), Burst: 10}}, {Rule: ratelimit.SlidingLog{Limit: 100, Window: time.Hour}}}},
}}

// TestPlansFailurePolicies: with Redis stopped, a Plans answers by its
// failure policy (fail open as a fresh key, fail closed, or a local
// in-process Plans), its circuit opens, and once Redis is back (a new
// process, which has lost the scripts and the keys) it decides again,
// moves included.
func TestPlansFailurePolicies(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.MaxRetries = -1
		o.ReadTimeout = 2 * time.Second
	})
	defer rdb.Close()
	plan := "free"
	planOf := func(string) string { return plan }
	local, err := ratelimit.NewPlans(drillPlans, planOf)
	require.NoError(t, err)
	opts := []Option{WithTimeout(drillTimeout), WithCircuit(3, 500*time.Millisecond)}
	open, err := NewPlans(rdb, drillPlans, planOf, append(opts, WithPrefix("open:"))...)
	require.NoError(t, err)
	closed, err := NewPlans(rdb, drillPlans, planOf, append(opts, WithPrefix("closed:"), WithFailureMode(FailClosed))...)
	require.NoError(t, err)
	fallback, err := NewPlans(rdb, drillPlans, planOf, append(opts, WithPrefix("fallback:"), WithFallback(local))...)
	require.NoError(t, err)
	all := []*Plans{open, closed, fallback}
	for _, p := range all {
		d, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.Equal(t, int64(2), d.Remaining)
	}
	require.NoError(t, srv.Kill())
	for i := range 6 {
		d, err := open.Check("k", ratelimit.Unit)
		require.ErrorIs(t, err, ErrUnavailable)
		require.ErrorIs(t, err, ratelimit.ErrDegraded)
		assert.True(t, d.Allowed, "fail open admits")
		assert.Equal(t, int64(2), d.Remaining, "as a fresh key would")
		if i >= 3 {
			assert.ErrorIs(t, err, ErrCircuitOpen)
		}
		d, err = closed.Check("k", ratelimit.Unit)
		require.ErrorIs(t, err, ErrUnavailable)
		assert.False(t, d.Allowed, "fail closed refuses")
		assert.Positive(t, d.RetryAfter)
		d, err = fallback.Check("k", ratelimit.Unit)
		require.ErrorIs(t, err, ErrUnavailable)
		assert.Equal(t, i < 3, d.Allowed, "the local plans' burst of 3, check %d", i)
	}
	assert.Equal(t, uint64(3), open.Stats().CircuitRefusals)
	require.NoError(t, srv.Restart())
	plan = "pro"
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range all {
		for tries := int64(0); ; tries++ {
			d, err := p.Check("k2", ratelimit.Unit)
			if err == nil {
				// A check that timed out may have run all the same.
				assert.LessOrEqual(t, d.Remaining, int64(9))
				assert.GreaterOrEqual(t, d.Remaining, 9-tries)
				break
			}
			require.ErrorIs(t, err, ErrUnavailable)
			require.True(t, time.Now().Before(deadline), "checks did not resume: %v", err)
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A key checked on free, then on pro: a move after the restart (with
	// a deadline a loaded machine cannot miss).
	patient, err := NewPlans(rdb, drillPlans, planOf, WithPrefix("open:"), WithTimeout(5*time.Second))
	require.NoError(t, err)
	plan = "free"
	_, err = patient.Check("m", ratelimit.Unit)
	require.NoError(t, err)
	plan = "pro"
	d, err := patient.Check("m", ratelimit.Unit)
	require.NoError(t, err)
	// 1 of 3 spent is 4 of 10, but free would be whole in a year, and pro
	// refills 4 in four: 1 in use, full again in that year.
	assert.Equal(t, int64(10-1-1), d.Remaining)
	assert.Equal(t, uint64(1), patient.Stats().Moves)
}

// TestPlansServerTime: without a client clock the server's TIME decides,
// moves included.
func TestPlansServerTime(t *testing.T) {
	rdb := needRedis(t)
	plan := "free"
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(4), Burst: 4}},
		"pro":  {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerHour(40), Burst: 40}},
	}}
	p, err := NewPlans(rdb, set, func(string) string { return plan }, WithPrefix(testPrefix()), WithTimeout(5*time.Second))
	require.NoError(t, err)
	for range 3 {
		_, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	plan = "pro"
	d, err := p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, int64(40-30-1), d.Remaining, "3 of 4 spent is 30 of 40")
	assert.InDelta(t, time.Now().UnixNano(), int64(d.At), float64(time.Minute), "the server's Unix time")
}

// TestClusterPlans: on a Cluster of three masters, each key's record and
// its plans' keys (layers included) share one slot, keys spread over
// every master, and moves between plans and an Update give the in-process
// Plans' Decisions.
func TestClusterPlans(t *testing.T) {
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Minute}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(10), Burst: 10}},
			{Rule: ratelimit.SlidingCounter{Limit: 50, Window: time.Hour}, Shadow: true},
		}},
	}}
	cl, rdb, clk, on, local, p := clusterPlans(t, set)
	const keys = 24
	masters := map[string]bool{}
	for i := range keys {
		key := fmt.Sprintf("user-%d", i)
		slot := cl.Slot(t, p.RecordKey(key))
		for _, plan := range []string{"free", "pro"} {
			for _, k := range p.Keys(plan, key) {
				require.Equal(t, slot, cl.Slot(t, k), "key %s of plan %s", k, plan)
			}
		}
		masters[cl.Owner(t, slot).Addr()] = true
	}
	require.Len(t, masters, 3, "keys on every master")
	upgraded := set
	upgraded.Plans = map[string]ratelimit.Plan{"free": set.Plans["free"], "pro": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(20), Burst: 20}}}
	ctx := context.Background()
	for step := range 10 {
		if step == 6 {
			require.NoError(t, local.Update(upgraded, ratelimit.MigrateAdditive))
			require.NoError(t, p.Update(upgraded, ratelimit.MigrateAdditive))
		}
		for i := range keys {
			key := fmt.Sprintf("user-%d", i)
			if (i+step)%3 == 0 {
				on[key] = map[string]string{"free": "pro", "pro": "free", "": "pro"}[on[key]]
			}
			want, err := local.CheckContext(ctx, key, ratelimit.Unit)
			require.NoError(t, err)
			got, err := p.CheckContext(ctx, key, ratelimit.Unit)
			require.NoError(t, err)
			require.Equal(t, want, got, "step %d key %s", step, key)
		}
		clk.Advance(7 * time.Second)
	}
	st := p.Stats()
	assert.Positive(t, st.Moves)
	assert.Zero(t, st.Failures+st.InvalidStates+st.Mismatches)

	// A record that names a key of another slot (another key's) is a
	// corrupted record: refused, never the failure policy's admission.
	other := p.Keys("pro", "user-1")[0]
	proJSON := p.gen.Load().plans["pro"].json
	require.NoError(t, rdb.Set(ctx, p.RecordKey("user-0"), other+" "+other+"\n"+proJSON+"\n", time.Hour).Err())
	on["user-0"] = "free"
	d, err := p.Check("user-0", ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidState)
	assert.False(t, d.Allowed)
}

// TestClusterPlansOps: on a Cluster of three masters, a Plans' Peek,
// Refund, Settle, Reset and CheckWithin, on keys whose plan changes
// between them (so that each may move the key first), give the in-process
// Plans' Decisions and amounts. A plan of layers has a layer per customer
// (WithHashTag puts a customer's keys, its records and its layer's key in
// one slot), and the leaky bucket plans make CheckWithin's cap matter.
func TestClusterPlansOps(t *testing.T) {
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(2), Capacity: 4, Name: "free"}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 6, Name: "pro"}},
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(20), Burst: 20, Name: "customer"}, Key: firstField},
		}},
		"team": {Rule: ratelimit.SlidingCounter{Limit: 5, Window: time.Second, Name: "team"}},
	}}
	next := map[string]string{"": "pro", "free": "pro", "pro": "team", "team": "free"}
	cl, _, clk, on, local, p := clusterPlans(t, set, WithHashTag(firstField))
	var keys []string
	masters := map[string]bool{}
	for c := range 12 {
		for u := range 2 {
			key := fmt.Sprintf("c%d u%d", c, u)
			keys = append(keys, key)
			slot := cl.Slot(t, p.RecordKey(key))
			for _, plan := range []string{"free", "pro", "team"} {
				for _, k := range p.Keys(plan, key) {
					require.Equal(t, slot, cl.Slot(t, k), "key %s of plan %s", k, plan)
				}
			}
			masters[cl.Owner(t, slot).Addr()] = true
		}
	}
	require.Len(t, masters, 3, "keys on every master")
	caps := []time.Duration{0, 300 * time.Millisecond, time.Second, 2 * time.Second}
	ats := map[string]time.Duration{}
	ops := map[string]int{}
	for step := range 16 {
		for i, key := range keys {
			if (i+step)%4 == 0 {
				on[key] = next[on[key]]
			}
			cost := ratelimit.Unit * ratelimit.Units(1+i%2)
			at := ats[key]
			// same requires the Redis Plans' Decision of an operation to be
			// the in-process one, and notes a check's admission.
			same := func(op string, want, got ratelimit.Decision, werr, gerr error) {
				require.NoError(t, werr)
				require.NoError(t, gerr)
				require.Equal(t, want, got, "step %d key %s: %s", step, key, op)
				if want.Allowed && op != "peek" {
					ats[key] = want.At
				}
				ops[op]++
			}
			switch op := (i*7 + step) % 6; {
			case op == 0:
				want, werr := local.Check(key, cost)
				got, gerr := p.Check(key, cost)
				same("check", want, got, werr, gerr)
			case op == 1 || op == 5 && step%3 != 0:
				maxDelay := caps[(i+step)%len(caps)]
				want, werr := local.CheckWithin(key, cost, maxDelay)
				got, gerr := p.CheckWithin(key, cost, maxDelay)
				same("within", want, got, werr, gerr)
			case op == 2:
				want, werr := local.Peek(key, cost)
				got, gerr := p.Peek(key, cost)
				same("peek", want, got, werr, gerr)
			case op == 3:
				want, werr := local.Refund(key, cost, at)
				got, gerr := p.Refund(key, cost, at)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				require.Equal(t, want, got, "step %d key %s: refund", step, key)
				ops["refund"]++
			case op == 4:
				want, wx, werr := local.Settle(key, ratelimit.Unit, cost+ratelimit.Unit/2, at)
				got, gx, gerr := p.Settle(key, ratelimit.Unit, cost+ratelimit.Unit/2, at)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				require.Equal(t, want, got, "step %d key %s: settle", step, key)
				require.Equal(t, wx, gx, "step %d key %s: settled", step, key)
				ops["settle"]++
			default:
				local.Reset(key)
				require.NoError(t, p.Reset(key), "step %d key %s: reset", step, key)
				ops["reset"]++
			}
		}
		clk.Advance(time.Duration(step%4) * 137 * time.Millisecond)
	}
	t.Logf("operations: %v", ops)
	st := p.Stats()
	assert.Positive(t, st.Moves)
	assert.Zero(t, st.Failures+st.InvalidStates+st.Mismatches)
}

// clusterPlans starts a Cluster of three masters and returns it, a client
// of it, and the in-process and the Redis Plans of set (with opts, and
// no deny cache) on one ManualClock at unixNow, each key on the plan on
// names.
func clusterPlans(t *testing.T, set ratelimit.PlanSet, opts ...Option) (*redistest.Cluster, redis.UniversalClient, *ratelimit.ManualClock, map[string]string, *ratelimit.Plans, *Plans) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	clk := ratelimit.NewManualClock(unixNow)
	on := map[string]string{}
	planOf := func(key string) string { return on[key] }
	local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
	require.NoError(t, err)
	opts = append([]Option{WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5 * time.Second), WithDenyCache(0)}, opts...)
	p, err := NewPlans(rdb, set, planOf, opts...)
	require.NoError(t, err)
	return cl, rdb, clk, on, local, p
}
