package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterMasterLost kills one of three masters (SIGKILL; no replica
// takes over) and checks keys on it and on the live masters, both before
// and after the live masters mark it failed. For keys on the lost master
// each failure policy does what it says: fail open gives a fresh key's
// Decision, fail closed refuses, a fallback decides locally; keys on the
// live masters are decided by Redis as before, so none that is spent is
// admitted; and no check outlasts its deadline (the drill's 50 ms for the
// lost master's keys, a second for the live masters').
//
// The circuit breaker is set never to open here, so that every check of
// the lost master's keys asks the policies after waiting out its deadline
// (TestClusterCircuitPerMaster drills the circuit).
//
// A spent key's refusal is not retried against Redis when the deny cache
// holds it, so the drill turns the cache off to ask the policies.
func TestClusterMasterLost(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.MaxRetries = -1 })
	clk := ratelimit.NewManualClock(unixNow)
	// No deny cache either: it would answer the spent keys without a
	// round trip, as Redis would, and the policies would not be asked.
	noCircuit := func(o *options) { WithCircuit(1<<30, time.Second)(o); WithDenyCache(0)(o) }
	open, err := New(rdb, drillRule, WithPrefix("open:"), WithClock(clk), WithTimeout(drillTimeout), noCircuit)
	require.NoError(t, err)
	closed, err := New(rdb, drillRule, WithPrefix("closed:"), WithClock(clk), WithTimeout(drillTimeout), noCircuit, WithFailureMode(FailClosed))
	require.NoError(t, err)
	local, err := ratelimit.NewStore(drillRule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	twin, err := ratelimit.NewStore(drillRule, ratelimit.WithClock(clk)) // what local should answer
	require.NoError(t, err)
	fallback, err := New(rdb, drillRule, WithPrefix("fallback:"), WithClock(clk), WithTimeout(drillTimeout), noCircuit, WithFallback(local))
	require.NoError(t, err)
	stores := map[string]*Store{"open": open, "closed": closed, "fallback": fallback}

	victim := cl.Nodes[2]
	// Keys on the victim and on the live masters, for each store (their
	// Redis keys differ by prefix, so by slot).
	dead, live := map[string][]string{}, map[string][]string{}
	for name, s := range stores {
		for i := 0; len(dead[name]) < 4 || len(live[name]) < 8; i++ {
			key := fmt.Sprintf("k%d", i)
			if cl.Owner(t, cl.Slot(t, s.Key(key))) == victim {
				if len(dead[name]) < 4 {
					dead[name] = append(dead[name], key)
				}
			} else if len(live[name]) < 8 {
				live[name] = append(live[name], key)
			}
		}
	}
	// Spend every key's burst while all masters are up.
	for name, s := range stores {
		for _, key := range append(append([]string{}, dead[name]...), live[name]...) {
			for i := range 4 {
				d, err := setupCheck(t, key, s.CheckContext)
				require.NoError(t, err)
				require.Equal(t, i < 3, d.Allowed, "%s %s check %d", name, key, i)
			}
		}
	}
	fresh := func() ratelimit.Decision {
		l, err := ratelimit.New(drillRule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		d, err := l.Check(ratelimit.Unit)
		require.NoError(t, err)
		return d
	}

	require.NoError(t, victim.Kill())
	round := func(when string) {
		clk.Advance(time.Second)
		for name, s := range stores {
			for _, key := range live[name] {
				d, err := liveCheck(t, key, s.CheckContext)
				require.NoError(t, err, "%s: %s key %s on a live master", when, name, key)
				require.False(t, d.Allowed, "%s: %s admitted spent key %s on a live master", when, name, key)
			}
			for _, key := range dead[name] {
				d, err := timed(t, s, key)
				require.ErrorIs(t, err, ErrUnavailable, "%s: %s key %s on the lost master", when, name, key)
				switch name {
				case "open":
					require.Equal(t, fresh(), d, "%s: fail open is not a fresh key's Decision", when)
				case "closed":
					require.False(t, d.Allowed, "%s: fail closed admitted", when)
				case "fallback":
					w, werr := twin.Check(key, ratelimit.Unit)
					require.NoError(t, werr)
					require.Equal(t, w, d, "%s: fallback is not the local limiter's Decision", when)
				}
			}
		}
	}
	for i := range 3 {
		round(fmt.Sprintf("round %d before the failure is noticed", i))
	}
	// Wait, with a deadline, until a live master marks the victim failed,
	// then check again.
	c := cl.Nodes[0].Client(nil)
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nodes, err := c.ClusterNodes(context.Background()).Result()
		require.NoError(t, err)
		if marked(nodes, victim.Addr()) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the victim was never marked failed:\n%s", nodes)
		time.Sleep(50 * time.Millisecond) // polling a real server's view
	}
	for i := range 4 {
		round(fmt.Sprintf("round %d after the failure is noticed", i))
	}
	for name, s := range stores {
		st := s.Stats()
		assert.Zero(t, st.Mismatches+st.InvalidStates, name)
		assert.Equal(t, uint64(7*len(dead[name])), st.Failures, "%s: failures", name)
		assert.Zero(t, st.CircuitRefusals, name)
	}
}

// marked reports whether CLUSTER NODES output flags the node at addr as
// failed.
func marked(nodes, addr string) bool {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[1], addr+"@") && strings.Contains(f[2], "fail") && !strings.Contains(f[2], "fail?") {
			return true
		}
	}
	return false
}

// TestClusterCircuitPerMaster: the circuit breaker counts failures per
// master, so failures on a lost master's keys open it for that master's
// keys only (answered by the failure policy without waiting on Redis),
// while the keys of the live masters go on being decided by Redis: a spent
// key there is still refused, never admitted as fail open would.
func TestClusterCircuitPerMaster(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.MaxRetries = -1 })
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, drillRule, WithPrefix(testPrefix()), WithClock(clk), WithTimeout(drillTimeout),
		WithCircuit(3, time.Hour), WithDenyCache(0))
	require.NoError(t, err)
	victim := cl.Nodes[2]
	var dead []string
	liveKeys := map[*redistest.Server]string{}
	for i := 0; len(dead) < 4 || len(liveKeys) < 2; i++ {
		key := fmt.Sprintf("k%d", i)
		switch owner := cl.Owner(t, cl.Slot(t, s.Key(key))); {
		case owner == victim:
			dead = append(dead, key)
		case liveKeys[owner] == "":
			liveKeys[owner] = key
		}
	}
	for _, key := range liveKeys {
		for range 3 {
			_, err := setupCheck(t, key, s.CheckContext)
			require.NoError(t, err)
		}
		d, err := setupCheck(t, key, s.CheckContext)
		require.NoError(t, err)
		require.False(t, d.Allowed, "spent")
	}

	require.NoError(t, victim.Kill())
	for _, key := range dead[:3] {
		_, err := timed(t, s, key)
		require.ErrorIs(t, err, ErrUnavailable)
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
	// The lost master's circuit is open: its keys get the failure policy
	// at once, a fresh key's Decision for fail open.
	for _, key := range dead {
		start := time.Now()
		d, err := s.Check(key, ratelimit.Unit)
		require.ErrorIs(t, err, ErrCircuitOpen, "the lost master's key %s", key)
		require.True(t, d.Allowed, "fail open answers a fresh key's Decision")
		assert.Less(t, time.Since(start), drillTimeout/2, "an open circuit waited on Redis")
		_, err = s.Refund(key, ratelimit.Unit, d.At)
		require.ErrorIs(t, err, ErrCircuitOpen, "a refund of the lost master's key")
	}
	// The live masters' keys are still Redis's to decide.
	for owner, key := range liveKeys {
		for range 3 {
			d, err := liveCheck(t, key, s.CheckContext)
			require.NoError(t, err, "key %s on live master %s", key, owner.Addr())
			require.False(t, d.Allowed, "spent key %s on a live master admitted", key)
			p, err := s.Peek(key, ratelimit.Unit)
			require.NoError(t, err)
			require.False(t, p.Allowed)
		}
	}
	assert.Equal(t, uint64(len(dead)), s.Stats().CircuitRefusals)
}

// TestClusterFullCoverage pins Redis's default, cluster-require-full-
// coverage yes: once the live masters mark a lost master failed they
// refuse every key (CLUSTERDOWN, which go-redis retries until the
// deadline), so every check gets the failure policy's answer, within its
// deadline.
func TestClusterFullCoverage(t *testing.T) {
	cl := startClusterCoverage(t, true)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.MaxRetries = -1 })
	s, err := New(rdb, drillRule, WithPrefix(testPrefix()), WithTimeout(drillTimeout),
		WithFailureMode(FailClosed), WithCircuit(1<<30, time.Second), WithDenyCache(0))
	require.NoError(t, err)
	victim := cl.Nodes[2]
	liveKey := ""
	for i := 0; liveKey == ""; i++ {
		if key := fmt.Sprintf("k%d", i); cl.Owner(t, cl.Slot(t, s.Key(key))) != victim {
			liveKey = key
		}
	}
	d, err := setupCheck(t, liveKey, s.CheckContext)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	require.NoError(t, victim.Kill())
	c := cl.Nodes[0].Client(nil)
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.ClusterInfo(context.Background()).Result()
		require.NoError(t, err)
		if strings.Contains(info, "cluster_state:fail") {
			break
		}
		require.True(t, time.Now().Before(deadline), "the cluster never failed:\n%s", info)
		time.Sleep(50 * time.Millisecond) // polling a real server's view
	}
	d, err = timed(t, s, liveKey)
	require.ErrorIs(t, err, ErrUnavailable, "a live master's key")
	require.False(t, d.Allowed, "fail closed")
}

// TestClusterCompositeMasterLost is TestClusterMasterLost for a Composite
// of a per-customer and a per-customer-and-route layer under one hash tag:
// requests whose tag is on the lost master get the failure policy's answer
// (fail open: the Decision on fresh keys; fail closed: a refusal), those
// on the live masters are decided by Redis, and no check outlasts its
// deadline.
func TestClusterCompositeMasterLost(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.MaxRetries = -1 })
	clk := ratelimit.NewManualClock(unixNow)
	customer := ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.Every(year), Burst: 3, Name: "customer"}, Key: firstField}
	route := ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 2, Window: year, Name: "route"}}
	layers := []Layer{{Layer: customer}, {Layer: route}}
	// No deny cache: the requests on the lost master were refused in the
	// setup, and the cache would go on refusing them without Redis.
	opts := []Option{WithHashTag(firstField), WithClock(clk), WithTimeout(drillTimeout), WithDenyCache(0)}
	open, err := NewComposite(rdb, layers, append(opts, WithPrefix(testPrefix()))...)
	require.NoError(t, err)
	closed, err := NewComposite(rdb, layers, append(opts, WithPrefix(testPrefix()), WithFailureMode(FailClosed))...)
	require.NoError(t, err)
	comps := map[string]*Composite{"open": open, "closed": closed}
	check := func(c *Composite, req string) (ratelimit.Decision, error) {
		start := time.Now()
		d, err := c.Check(req, ratelimit.Unit)
		assert.Less(t, time.Since(start), drillTimeout+slack, "a check waited past its deadline")
		return d, err
	}

	victim := cl.Nodes[2]
	dead, live := map[string][]string{}, map[string][]string{}
	for name, c := range comps {
		for i := 0; len(dead[name]) < 3 || len(live[name]) < 6; i++ {
			req := fmt.Sprintf("c%d /r", i)
			if cl.Owner(t, cl.Slot(t, c.Key(0, req))) == victim {
				if len(dead[name]) < 3 {
					dead[name] = append(dead[name], req)
				}
			} else if len(live[name]) < 6 {
				live[name] = append(live[name], req)
			}
		}
		for _, req := range append(append([]string{}, dead[name]...), live[name]...) {
			for i := range 3 {
				d, err := setupCheck(t, req, c.CheckContext)
				require.NoError(t, err)
				require.Equal(t, i < 2, d.Allowed, "%s %s check %d", name, req, i)
			}
		}
	}
	fresh := func() ratelimit.Decision {
		l, err := ratelimit.Compose([]ratelimit.Layer{customer, route}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		d, err := l.Check("x /r", ratelimit.Unit)
		require.NoError(t, err)
		return d
	}

	require.NoError(t, victim.Kill())
	for round := range 5 {
		clk.Advance(time.Second)
		for name, c := range comps {
			for _, req := range live[name] {
				d, err := liveCheck(t, req, c.CheckContext)
				require.NoError(t, err, "round %d: %s %s on a live master", round, name, req)
				require.False(t, d.Allowed, "round %d: %s admitted spent %s on a live master", round, name, req)
			}
			for _, req := range dead[name] {
				d, err := check(c, req)
				require.ErrorIs(t, err, ErrUnavailable, "round %d: %s %s on the lost master", round, name, req)
				if name == "open" {
					require.Equal(t, fresh(), d, "round %d: fail open is not the Decision on fresh keys", round)
				} else {
					require.False(t, d.Allowed, "round %d: fail closed admitted", round)
				}
			}
		}
	}
}

// liveMargin is the deadline of checks on the live masters in the drills:
// long enough that a loaded machine (three servers and the race detector
// on two cores, the client reloading the cluster's layout) does not turn a
// check Redis would decide into the failure policy's answer.
const liveMargin = time.Second

// liveCheck runs one check of key on a live master with a deadline of
// liveMargin, and requires that it end by then.
func liveCheck(t *testing.T, key string, check func(context.Context, string, ratelimit.Units) (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), liveMargin)
	defer cancel()
	start := time.Now()
	d, err := check(ctx, key, ratelimit.Unit)
	assert.Less(t, time.Since(start), liveMargin+slack, "a check waited past its deadline")
	return d, err
}
