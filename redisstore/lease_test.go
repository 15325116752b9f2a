package redisstore

import (
	"context"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// callCounter is a client hook that counts the scripts the client sends,
// less the EVALSHAs the server answered NOSCRIPT (go-redis then sends EVAL)
// and the FCALLs it answered without the function (the store then loads
// the library and calls again).
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		name := cmd.Name()
		if (name == "evalsha" || name == "eval" || name == "fcall") && (err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") && !strings.HasPrefix(err.Error(), "ERR Function not found")) {
			c.n.Add(1)
		}
		return err
	}
}

// replica is one process's Store and Leased on a client of its own.
type replica struct {
	rdb   *redis.Client
	calls *callCounter
	s     *Store
	l     *Leased
}

func newReplicas(t testing.TB, n int, rule ratelimit.Rule, lo LeaseOptions, opts ...Option) []replica {
	t.Helper()
	needRedis(t)
	rs := make([]replica, n)
	for i := range rs {
		rdb := shared.Client(nil)
		cc := &callCounter{}
		rdb.AddHook(cc)
		// A generous timeout: the race detector on a shared machine is slow.
		s, err := New(rdb, rule, append([]Option{WithTimeout(5 * time.Second)}, opts...)...)
		require.NoError(t, err)
		l, err := NewLeased(s, lo)
		require.NoError(t, err)
		rs[i] = replica{rdb: rdb, calls: cc, s: s, l: l}
	}
	return rs
}

// closeReplicas closes every replica's Leased and client.
func closeReplicas(rs []replica) {
	for _, r := range rs {
		r.l.Close()
		r.rdb.Close()
	}
}

func TestNewLeasedRefuses(t *testing.T) {
	rdb := needRedis(t)
	gcra := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}
	for _, tc := range []struct {
		name string
		rule ratelimit.Rule
		opts []Option
		lo   LeaseOptions
		want error
	}{
		{"leaky bucket", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 10}, nil, LeaseOptions{Max: 5 * ratelimit.Unit, Hold: time.Second}, ratelimit.ErrInvalidRule},
		{"sliding log", ratelimit.SlidingLog{Limit: 10, Window: time.Second}, nil, LeaseOptions{Max: 5 * ratelimit.Unit, Hold: time.Second}, ratelimit.ErrInvalidRule},
		{"count refused", ratelimit.SlidingCounter{Limit: 10, Window: time.Second, CountRefused: true}, nil, LeaseOptions{Max: 5 * ratelimit.Unit, Hold: time.Second}, ratelimit.ErrInvalidRule},
		{"fallback", gcra, []Option{WithFallback(mustLocal(t, gcra))}, LeaseOptions{Max: 5 * ratelimit.Unit, Hold: time.Second}, ratelimit.ErrInvalidOption},
		{"max zero", gcra, nil, LeaseOptions{Hold: time.Second}, ratelimit.ErrInvalidOption},
		{"max one", gcra, nil, LeaseOptions{Max: 1, Hold: time.Second}, ratelimit.ErrInvalidOption},
		{"max above capacity", gcra, nil, LeaseOptions{Max: 11 * ratelimit.Unit, Hold: time.Second}, ratelimit.ErrInvalidOption},
		{"no hold", gcra, nil, LeaseOptions{Max: 5 * ratelimit.Unit}, ratelimit.ErrInvalidOption},
		{"negative keys", gcra, nil, LeaseOptions{Max: 5 * ratelimit.Unit, Hold: time.Second, Keys: -1}, ratelimit.ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(rdb, tc.rule, tc.opts...)
			require.NoError(t, err)
			_, err = NewLeased(s, tc.lo)
			assert.ErrorIs(t, err, tc.want)
		})
	}
	_, err := NewLeased(nil, LeaseOptions{Max: 2, Hold: time.Second})
	assert.ErrorIs(t, err, ratelimit.ErrInvalidOption)
}

func mustLocal(t *testing.T, rule ratelimit.Rule) *ratelimit.Store {
	st, err := ratelimit.NewStore(rule)
	require.NoError(t, err)
	return st
}

// TestMeterStateNeverLate: the state a bucket lease judges its decay by
// is never fuller than the one Redis wrote, at any later instant, for any
// cost; so a lease never admits what the real state would refuse it.
func TestMeterStateNeverLate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var rule ratelimit.Rule = ratelimit.GCRA{Rate: ratelimit.Rate{Count: drawCount(t, "count"), Per: drawPeriod(t, "per")}, Burst: drawCount(t, "burst")}
		m, err := ratelimit.NewMachine(rule)
		if err != nil {
			t.Skip("rule refused")
		}
		capacity := m.Params().Capacity
		var state []byte
		now := time.Duration(rapid.Int64Range(0, int64(unixNow)).Draw(t, "start"))
		for range rapid.IntRange(0, 5).Draw(t, "before") {
			now += time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "gap"))
			_, state, err = m.Step(state, now, drawCost(t, capacity), true)
			require.NoError(t, err)
		}
		d, real, err := m.Step(state, now, drawCost(t, capacity), true)
		require.NoError(t, err)
		if !d.Allowed {
			return
		}
		synth := meterState(int64(d.At), d.ResetAfter)
		later := d.At + time.Duration(rapid.Int64Range(0, int64(d.ResetAfter)+2).Draw(t, "later"))
		x := drawCost(t, capacity)
		ds, _, err := m.Step(synth, later, x, false)
		require.NoError(t, err, "state %q", synth)
		dr, _, err := m.Step(real, later, x, false)
		require.NoError(t, err)
		if dr.Allowed {
			require.True(t, ds.Allowed, "the synthetic state refills later than Redis's")
		}
	})
}

// admission is one request admitted at an instant.
type admission struct {
	at   int64
	cost int64
}

// checkBound requires that the admissions never exceed what rule allows:
// for a bucket, at most the capacity plus the rate times any span between
// two admissions; for a fixed window, at most the limit in any window; for
// a sliding counter, the estimate never above the limit at any admission;
// for a sub-window, at most the limit in any Buckets consecutive buckets.
// Each is computed directly from the admissions, in exact integers.
func checkBound(t require.TestingT, p ratelimit.Params, adm []admission) {
	slices.SortStableFunc(adm, func(a, b admission) int { return int(min(max(a.at-b.at, -1), 1)) })
	capacity := int64(p.Capacity)
	switch p.Algorithm {
	case "token_bucket", "gcra":
		for i := range adm {
			sum := big.NewInt(0)
			for j := i; j < len(adm); j++ {
				sum.Add(sum, big.NewInt(adm[j].cost))
				// sum * RateNanos <= capacity * RateNanos + RateUnits * span
				lhs := new(big.Int).Mul(sum, new(big.Int).SetUint64(p.RateNanos))
				rhs := new(big.Int).Mul(big.NewInt(capacity), new(big.Int).SetUint64(p.RateNanos))
				rhs.Add(rhs, new(big.Int).Mul(new(big.Int).SetUint64(p.RateUnits), big.NewInt(adm[j].at-adm[i].at)))
				require.True(t, lhs.Cmp(rhs) <= 0, "admitted %d milli-units in [%d, %d]: more than the bucket allows", sum, adm[i].at, adm[j].at)
			}
		}
	case "fixed_window", "sub_window":
		g := p.WindowNanos
		k := int64(1)
		if p.Algorithm == "sub_window" {
			g, k = p.WindowNanos/p.Buckets, p.Buckets
		}
		per := map[int64]int64{}
		for _, a := range adm {
			per[a.at/g] += a.cost
		}
		for j := range per {
			sum := int64(0)
			for i := j - k + 1; i <= j; i++ {
				sum += per[i]
			}
			require.LessOrEqual(t, sum, capacity, "admitted in the %d buckets ending with bucket %d", k, j)
		}
	case "sliding_counter":
		w := p.WindowNanos
		per := map[int64]int64{}
		for _, a := range adm {
			per[a.at/w] += a.cost
			e := a.at % w
			// prev*(W-e)/W + cur <= Limit, times W.
			est := new(big.Int).Mul(big.NewInt(per[a.at/w-1]), big.NewInt(w-e))
			est.Add(est, new(big.Int).Mul(big.NewInt(per[a.at/w]), big.NewInt(w)))
			require.True(t, est.Cmp(new(big.Int).Mul(big.NewInt(capacity), big.NewInt(w))) <= 0, "estimate above the limit at %d", a.at)
		}
	default:
		panic(p.Algorithm)
	}
}

// leaseRule draws a rule that can lease, of everyday sizes.
func leaseRule(t *rapid.T) ratelimit.Rule {
	limit := rapid.Int64Range(1, 40).Draw(t, "limit")
	per := time.Duration(rapid.Int64Range(1, 2000).Draw(t, "per_ms")) * time.Millisecond
	switch rapid.IntRange(0, 4).Draw(t, "algorithm") {
	case 0:
		return ratelimit.GCRA{Rate: ratelimit.Rate{Count: rapid.Int64Range(1, 40).Draw(t, "count"), Per: per}, Burst: limit}
	case 1:
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: rapid.Int64Range(1, 40).Draw(t, "count"), Per: per}, Burst: limit}
	case 2:
		return ratelimit.FixedWindow{Limit: limit, Window: per}
	case 3:
		return ratelimit.SlidingCounter{Limit: limit, Window: per}
	default:
		k := rapid.IntRange(1, 6).Draw(t, "buckets")
		return ratelimit.SubWindow{Limit: limit, Window: per * time.Duration(k), Buckets: k}
	}
}

// TestLeasesNeverExceedTheRule: several replicas, each a Store and a
// Leased on a client of its own, send requests of drawn costs to one key
// at drawn instants; whatever leases they take, hold, use up or give back,
// what they admit together is never more than the rule allows over any
// span (see checkBound).
func TestLeasesNeverExceedTheRule(t *testing.T) {
	needRedis(t)
	var local, takes atomic.Uint64
	t.Cleanup(func() {
		t.Logf("%d requests admitted from %d leases", local.Load(), takes.Load())
		assert.NotZero(t, local.Load(), "no request was admitted from a lease")
	})
	rapid.Check(t, func(rt *rapid.T) {
		rule := leaseRule(rt)
		m, err := ratelimit.NewMachine(rule)
		require.NoError(rt, err)
		p := m.Params()
		clk := ratelimit.NewManualClock(unixNow + time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(rt, "phase")))
		lo := LeaseOptions{
			Max:  ratelimit.Units(rapid.Int64Range(2, int64(p.Capacity)).Draw(rt, "max")),
			Hold: time.Duration(rapid.Int64Range(1, 3000).Draw(rt, "hold_ms")) * time.Millisecond,
		}
		rs := newReplicas(t, rapid.IntRange(1, 4).Draw(rt, "replicas"), rule, lo, WithClock(clk), WithPrefix(testPrefix()))
		defer closeReplicas(rs)
		var adm []admission
		for range rapid.IntRange(1, 150).Draw(rt, "steps") {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(p.Window)/4+1).Draw(rt, "advance")))
			r := rs[rapid.IntRange(0, len(rs)-1).Draw(rt, "replica")]
			c := ratelimit.Units(min(rapid.OneOf(rapid.Just(int64(ratelimit.Unit)), rapid.Int64Range(1, 3000)).Draw(rt, "cost"), int64(p.Capacity)))
			for range rapid.IntRange(1, 20).Draw(rt, "burst") {
				d, err := r.l.Check("hot", c)
				require.NoError(rt, err)
				if d.Allowed {
					adm = append(adm, admission{at: int64(clk.Now()), cost: int64(c)})
				}
			}
			if rapid.IntRange(0, 20).Draw(rt, "close") == 0 {
				require.NoError(rt, r.l.Close())
			}
		}
		for _, r := range rs {
			local.Add(r.l.Stats().LocalAdmits)
			takes.Add(r.l.Stats().Takes)
		}
		checkBound(rt, p, adm)
	})
}

// saturate has every replica, in turn, send requests of one unit until one
// is refused, and returns how many were admitted.
func saturate(t *testing.T, check []func() (bool, error)) int {
	t.Helper()
	admitted := 0
	for _, c := range check {
		for i := 0; ; i++ {
			require.Less(t, i, 100_000, "never refused")
			ok, err := c()
			require.NoError(t, err)
			if !ok {
				break
			}
			admitted++
		}
	}
	return admitted
}

// TestLeasesAdmitNearlyTheRule: replicas that always want more admit
// together, over a run, at least what one in-process limiter under the
// same demand admits, less at most Max for each replica (allowance that
// sits in leases when the run ends), and never more.
func TestLeasesAdmitNearlyTheRule(t *testing.T) {
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":            ratelimit.GCRA{Rate: ratelimit.PerSecond(300), Burst: 100},
		"token bucket":    ratelimit.TokenBucket{Rate: ratelimit.PerSecond(300), Burst: 100},
		"fixed window":    ratelimit.FixedWindow{Limit: 100, Window: time.Second},
		"sliding counter": ratelimit.SlidingCounter{Limit: 100, Window: time.Second},
		"sub-window":      ratelimit.SubWindow{Limit: 100, Window: time.Second, Buckets: 4},
	} {
		t.Run(name, func(t *testing.T) {
			const n, max = 3, 10
			clk := ratelimit.NewManualClock(unixNow)
			rs := newReplicas(t, n, rule, LeaseOptions{Max: max * ratelimit.Unit, Hold: 200 * time.Millisecond}, WithClock(clk), WithPrefix(testPrefix()))
			defer closeReplicas(rs)
			ref, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			var leased []func() (bool, error)
			for _, r := range rs {
				leased = append(leased, func() (bool, error) {
					d, err := r.l.Check("global", ratelimit.Unit)
					return d.Allowed, err
				})
			}
			plain := []func() (bool, error){func() (bool, error) {
				d, err := ref.Check(ratelimit.Unit)
				return d.Allowed, err
			}}
			got, want := 0, 0
			for range 300 {
				clk.Advance(7 * time.Millisecond)
				got += saturate(t, leased)
				want += saturate(t, plain)
			}
			var local uint64
			for _, r := range rs {
				local += r.l.Stats().LocalAdmits
			}
			t.Logf("admitted %d with leases (%d from them), %d in process", got, local, want)
			assert.LessOrEqual(t, got, want)
			assert.GreaterOrEqual(t, got, want-n*max)
			assert.NotZero(t, local)
		})
	}
}

// TestLeaseRoundTrips: a key with steady demand from one or three
// replicas reaches Redis about once per Max admitted, plus twice per lease
// given back, and each client's own count of scripts sent (a hook on the
// client) agrees with its Leased's counts. The bucket is drained first: a
// bucket near full does not lease (see Leased).
func TestLeaseRoundTrips(t *testing.T) {
	for name, rule := range map[string]ratelimit.Rule{
		"fixed window": ratelimit.FixedWindow{Limit: 100_000, Window: time.Minute},
		"gcra":         ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000},
	} {
		for _, n := range []int{1, 3} {
			t.Run(name+"/"+strconv.Itoa(n), func(t *testing.T) {
				const max = 50
				clk := ratelimit.NewManualClock(unixNow)
				// Each replica sees 1,000/n requests a second: a Hold of
				// n x 100 ms fills a lease of Max.
				hold := time.Duration(n) * 100 * time.Millisecond
				rs := newReplicas(t, n, rule, LeaseOptions{Max: max * ratelimit.Unit, Hold: hold}, WithClock(clk), WithPrefix(testPrefix()))
				defer closeReplicas(rs)
				drain, err := New(rs[0].rdb, rule, WithClock(clk), WithPrefix(rs[0].s.o.prefix))
				require.NoError(t, err)
				if _, ok := rule.(ratelimit.GCRA); ok {
					_, err = drain.Check("global", 500*ratelimit.Unit)
					require.NoError(t, err)
					clk.Advance(10 * time.Millisecond)
				}
				var c0 []int64
				for _, r := range rs {
					c0 = append(c0, r.calls.n.Load())
				}
				const requests = 21_000 // 1,000 a second for 21 s
				for i := range requests {
					d, err := rs[i%n].l.Check("global", ratelimit.Unit)
					require.NoError(t, err)
					require.True(t, d.Allowed)
					clk.Advance(time.Millisecond)
				}
				var calls, returns int64
				for i, r := range rs {
					st := r.l.Stats()
					c := r.calls.n.Load() - c0[i]
					t.Logf("replica %d: %d scripts sent: %+v", i, c, st)
					assert.Equal(t, int64(st.Takes+st.TakesRefused+st.Direct+2*st.Returns), c, "every script sent is a take, a direct check or one of the two of a give-back")
					assert.Equal(t, uint64(requests/n), st.LocalAdmits+st.Takes+st.Direct)
					calls += c
					returns += int64(st.Returns)
				}
				// The first periods of Hold find the key cold and grow the
				// lease.
				warmup := int64(n * 100)
				assert.LessOrEqual(t, calls, int64(requests/max)+2*returns+warmup)
			})
		}
	}
}

// TestLeaseDecisionsOnOneReplica: at one instant, with one replica, a
// Leased's Decisions say what the in-process limiter's do (Allowed and
// Remaining exactly, ResetAfter no less), since nothing else spends: the
// lease's accounting loses nothing it knows of.
func TestLeaseDecisionsOnOneReplica(t *testing.T) {
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":            ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 30, Name: "g"},
		"fixed window":    ratelimit.FixedWindow{Limit: 30, Window: time.Minute, Name: "f"},
		"sliding counter": ratelimit.SlidingCounter{Limit: 30, Window: time.Minute},
		"sub-window":      ratelimit.SubWindow{Limit: 30, Window: time.Minute, Buckets: 6},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow + 1234567)
			rs := newReplicas(t, 1, rule, LeaseOptions{Max: 7 * ratelimit.Unit, Hold: time.Second}, WithClock(clk), WithPrefix(testPrefix()))
			defer closeReplicas(rs)
			ref, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			for i := range 40 {
				cost := ratelimit.Unit * ratelimit.Units(1+i%2)
				want, err := ref.Check(cost)
				require.NoError(t, err)
				got, err := rs[0].l.Check("k", cost)
				require.NoError(t, err)
				assert.Equal(t, want.Allowed, got.Allowed, "request %d", i)
				assert.Equal(t, want.Remaining, got.Remaining, "request %d", i)
				assert.GreaterOrEqual(t, got.ResetAfter, want.ResetAfter, "request %d", i)
				assert.Equal(t, want.Limit, got.Limit)
				assert.Equal(t, want.Policy, got.Policy)
				assert.Equal(t, want.Window, got.Window)
				assert.Equal(t, want.At, got.At)
				if !want.Allowed {
					assert.Equal(t, want.RetryAfter, got.RetryAfter, "a refusal is Redis's")
				}
			}
			assert.NotZero(t, rs[0].l.Stats().LocalAdmits)
		})
	}
}

// leaseOf returns the k of key's live lease on l, or 0.
func leaseOf(l *Leased, key string) int64 {
	v, ok := l.keys.Load(key)
	if !ok {
		return 0
	}
	if ls := v.(*leaseKey).cur.Load(); ls != nil {
		return ls.k
	}
	return 0
}

// TestLeaseCloseGivesBack: Close gives every lease's rest back, so that
// Redis then holds exactly what was admitted, as if there had been no
// lease; and checks after Close go to Redis.
func TestLeaseCloseGivesBack(t *testing.T) {
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":         ratelimit.GCRA{Rate: ratelimit.Every(year), Burst: 100},
		"fixed window": ratelimit.FixedWindow{Limit: 100, Window: time.Hour},
		"sub-window":   ratelimit.SubWindow{Limit: 100, Window: time.Hour, Buckets: 4},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			rs := newReplicas(t, 1, rule, LeaseOptions{Max: 30 * ratelimit.Unit, Hold: time.Minute}, WithClock(clk), WithPrefix(testPrefix()))
			defer closeReplicas(rs)
			l := rs[0].l
			for range 17 {
				d, err := l.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			k := leaseOf(l, "k")
			require.NotZero(t, k, "the key holds a lease")
			d, err := rs[0].s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			require.Less(t, d.Remaining, int64(100-17-1), "the lease is spent in Redis")
			require.NoError(t, l.Close())
			d, err = rs[0].s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, int64(100-17-1), d.Remaining, "all but what was admitted is back (Peek counts its own cost)")
			st := l.Stats()
			assert.Equal(t, ratelimit.Units(0), st.Unreturned)
			assert.NotZero(t, st.Returned)
			before := rs[0].calls.n.Load()
			d, err = l.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.Equal(t, before+1, rs[0].calls.n.Load(), "after Close a check goes to Redis")
			assert.Zero(t, leaseOf(l, "k"))
		})
	}
}

// TestLeaseEnds: a lease admits nothing once Hold has passed, and its rest
// goes back to Redis (by its goroutine or by the next check).
func TestLeaseEnds(t *testing.T) {
	clk := ratelimit.NewManualClock(unixNow)
	rule := ratelimit.FixedWindow{Limit: 1000, Window: time.Hour}
	rs := newReplicas(t, 1, rule, LeaseOptions{Max: 50 * ratelimit.Unit, Hold: time.Second}, WithClock(clk), WithPrefix(testPrefix()))
	defer closeReplicas(rs)
	l := rs[0].l
	for range 10 {
		_, err := l.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	k := leaseOf(l, "k")
	require.NotZero(t, k)
	clk.Advance(time.Second + 1)
	local := l.Stats().LocalAdmits
	d, err := l.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Equal(t, local, l.Stats().LocalAdmits, "not admitted from the lease past its end")
	// The old lease's rest is given back by whichever saw it end first;
	// the goroutine's refund is a Redis round trip, waited for here.
	require.Eventually(t, func() bool { return l.Stats().Returns >= 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	d, err = rs[0].s.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, int64(1000-11-1), d.Remaining, "Peek counts its own cost")
}

// TestLeasesConcurrent: goroutines of several replicas share one key's
// leases; at one instant they admit exactly the limit, less at most what
// the leases hold at the end, and never more.
func TestLeasesConcurrent(t *testing.T) {
	const n, goroutines, max, limit = 3, 6, 20, 500
	clk := ratelimit.NewManualClock(unixNow)
	rule := ratelimit.FixedWindow{Limit: limit, Window: time.Hour}
	rs := newReplicas(t, n, rule, LeaseOptions{Max: max * ratelimit.Unit, Hold: time.Hour}, WithClock(clk), WithPrefix(testPrefix()))
	defer closeReplicas(rs)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, r := range rs {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 150 {
					d, err := r.l.Check("global", ratelimit.Unit)
					if !assert.NoError(t, err) {
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	var local uint64
	for _, r := range rs {
		local += r.l.Stats().LocalAdmits
	}
	t.Logf("admitted %d, %d from leases", admitted.Load(), local)
	assert.LessOrEqual(t, admitted.Load(), int64(limit))
	assert.GreaterOrEqual(t, admitted.Load(), int64(limit-n*max))
	assert.NotZero(t, local)
}

// TestLeaseSize: whatever the demand, a lease is between twice the cost of
// the request that took it and Max; a key whose requests come more than
// two periods of Hold apart never leases.
func TestLeaseSize(t *testing.T) {
	needRedis(t)
	rapid.Check(t, func(rt *rapid.T) {
		clk := ratelimit.NewManualClock(unixNow)
		rule := ratelimit.FixedWindow{Limit: 1_000_000, Window: time.Hour}
		max := ratelimit.Units(rapid.Int64Range(2, 100_000).Draw(rt, "max"))
		hold := time.Duration(rapid.Int64Range(1, 1000).Draw(rt, "hold_ms")) * time.Millisecond
		rs := newReplicas(t, 1, rule, LeaseOptions{Max: max, Hold: hold}, WithClock(clk), WithPrefix(testPrefix()))
		defer closeReplicas(rs)
		l := rs[0].l
		cold := rapid.Bool().Draw(rt, "cold")
		for range rapid.IntRange(1, 60).Draw(rt, "requests") {
			gap := time.Duration(rapid.Int64Range(0, int64(hold)).Draw(rt, "gap"))
			if cold {
				gap = 2*hold + gap
			}
			clk.Advance(gap)
			c := ratelimit.Units(rapid.Int64Range(1, 5000).Draw(rt, "cost"))
			takes := l.Stats().Takes
			_, err := l.Check("k", c)
			require.NoError(rt, err)
			if l.Stats().Takes > takes {
				k := leaseOf(l, "k")
				require.LessOrEqual(rt, k, int64(max))
				require.GreaterOrEqual(rt, k, 2*int64(c))
			}
		}
		if cold {
			require.Zero(rt, l.Stats().Takes, "a cold key leased")
		}
	})
}

// TestLeaseWhenRedisFails: a lease taken before Redis went down is still
// spent locally (it was paid for); once it is used up, the store's failure
// policy answers for the request's own cost, with the error; giving back
// at Close fails with the error too, and keeps nothing it could not give.
func TestLeaseWhenRedisFails(t *testing.T) {
	for _, mode := range []FailureMode{FailOpen, FailClosed} {
		t.Run([]string{"fail open", "fail closed"}[mode], func(t *testing.T) {
			srv := drillServer(t)
			rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
			defer rdb.Close()
			clk := ratelimit.NewManualClock(unixNow)
			rule := ratelimit.FixedWindow{Limit: 100, Window: time.Hour}
			s, err := New(rdb, rule, WithClock(clk), WithTimeout(time.Second), WithFailureMode(mode), WithPrefix(testPrefix()))
			require.NoError(t, err)
			l, err := NewLeased(s, LeaseOptions{Max: 10 * ratelimit.Unit, Hold: time.Hour})
			require.NoError(t, err)
			for range 12 {
				for _, key := range []string{"k", "j"} {
					d, err := l.Check(key, ratelimit.Unit)
					require.NoError(t, err)
					require.True(t, d.Allowed)
				}
			}
			ls := leaseOfLease(l, "k")
			require.NotNil(t, ls)
			left := ls.k - ls.used.Load()
			require.Positive(t, left)
			require.NoError(t, srv.Kill())
			for i := int64(0); i < left; i += int64(ratelimit.Unit) {
				d, err := l.Check("k", ratelimit.Unit)
				require.NoError(t, err, "the lease admits without Redis")
				require.True(t, d.Allowed)
			}
			d, err := l.Check("k", ratelimit.Unit)
			require.ErrorIs(t, err, ErrUnavailable)
			assert.Equal(t, mode == FailOpen, d.Allowed, "the failure policy answers")
			if mode == FailOpen {
				assert.Equal(t, int64(99), d.Remaining, "a fresh key's Decision for the request's own cost")
			}
			// "j" still holds what it did not use: giving it back fails.
			js := leaseOfLease(l, "j")
			require.NotNil(t, js)
			jleft := js.k - js.used.Load()
			require.Positive(t, jleft)
			require.ErrorIs(t, l.Close(), ErrUnavailable)
			assert.Equal(t, ratelimit.Units(jleft), l.Stats().Unreturned)
		})
	}
}

// leaseOfLease returns key's live lease on l, or nil.
func leaseOfLease(l *Leased, key string) *lease {
	v, ok := l.keys.Load(key)
	if !ok {
		return nil
	}
	return v.(*leaseKey).cur.Load()
}

// TestBucketLeaseNeverMints: a bucket lease admits, by any instant, at most
// what the bucket as its take left it still lacks then (see covers),
// judged on the state Redis really wrote; and it admits at once what it
// was taken with. No Redis is needed: the lease is built from the Machine.
func TestBucketLeaseNeverMints(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used
	defer rdb.Close()
	var late atomic.Int64 // admissions after the take's instant
	t.Cleanup(func() {
		t.Logf("%d admissions after the take's instant", late.Load())
		assert.NotZero(t, late.Load())
	})
	rapid.Check(t, func(rt *rapid.T) {
		rule := ratelimit.GCRA{Rate: ratelimit.Rate{Count: rapid.Int64Range(1, 1000).Draw(rt, "count"), Per: drawPeriod(rt, "per")}, Burst: rapid.Int64Range(1, 1000).Draw(rt, "burst")}
		clk := ratelimit.NewManualClock(unixNow)
		s, err := New(rdb, rule, WithClock(clk))
		if err != nil {
			rt.Skip("rule refused")
		}
		capacity := int64(s.p.Capacity)
		if capacity < 2 {
			rt.Skip("no lease fits")
		}
		l, err := NewLeased(s, LeaseOptions{Max: ratelimit.Units(capacity), Hold: 100 * year})
		require.NoError(rt, err)
		var state []byte
		if rapid.Bool().Draw(rt, "spent") {
			_, state, err = s.m.Step(nil, unixNow, ratelimit.Units(rapid.Int64Range(1, capacity).Draw(rt, "before")), true)
			require.NoError(rt, err)
		}
		k := rapid.Int64Range(2, capacity).Draw(rt, "k")
		d, real, err := s.m.Step(state, unixNow, ratelimit.Units(k), true)
		require.NoError(rt, err)
		if !d.Allowed {
			return
		}
		at := int64(d.At)
		ls := &lease{k: k, d: d, at: at, end: at + int64(100*year), state: meterState(at, d.ResetAfter)}
		used := int64(0)
		for range rapid.IntRange(1, 30).Draw(rt, "requests") {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(d.ResetAfter)/4+1).Draw(rt, "advance")))
			c := rapid.Int64Range(1, k).Draw(rt, "cost")
			got, ok := l.admit(ls, c)
			if !ok {
				continue
			}
			used += c
			if clk.Now() > d.At {
				late.Add(1)
			}
			require.Equal(rt, used, ls.used.Load())
			require.LessOrEqual(rt, used, k)
			require.True(rt, got.Allowed)
			// Lacking at least used: the real bucket cannot admit
			// capacity - used + 1 (it holds less than that, to within one
			// milli-unit).
			if x := capacity - used + 1; x <= capacity {
				dr, _, err := s.m.Step(real, clk.Now(), ratelimit.Units(x), false)
				require.NoError(rt, err)
				require.False(rt, dr.Allowed, "the lease admitted %d by %v, more than the bucket lacks", used, clk.Now()-time.Duration(at))
			}
		}
	})
	// At the take's own instant the whole lease admits.
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 10}, WithClock(clk))
	require.NoError(t, err)
	l, err := NewLeased(s, LeaseOptions{Max: 10 * ratelimit.Unit, Hold: time.Hour})
	require.NoError(t, err)
	d, _, err := s.m.Step(nil, unixNow, 10*ratelimit.Unit, true)
	require.NoError(t, err)
	ls := &lease{k: int64(10 * ratelimit.Unit), d: d, at: int64(d.At), end: int64(d.At) + int64(time.Hour), state: meterState(int64(d.At), d.ResetAfter)}
	for range 10 {
		_, ok := l.admit(ls, int64(ratelimit.Unit))
		require.True(t, ok)
	}
	_, ok := l.admit(ls, 1)
	require.False(t, ok, "a lease admits no more than it holds")
}

// TestLeaseServerClock: on the server's clock (no client clock) leases
// work the same: one replica's goroutines are all admitted below the
// limit, mostly from leases, then Close gives back every unused unit, and
// the next requests take exactly the rest. The observer hears of every
// request once.
func TestLeaseServerClock(t *testing.T) {
	needRedis(t)
	var obs counting
	rule := ratelimit.FixedWindow{Limit: 300, Window: 100 * year}
	rs := newReplicas(t, 1, rule, LeaseOptions{Max: 20 * ratelimit.Unit, Hold: time.Hour}, WithPrefix(testPrefix()), WithObserver(&obs))
	defer closeReplicas(rs)
	l := rs[0].l
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				d, err := l.Check("k", ratelimit.Unit)
				if assert.NoError(t, err) && d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	st := l.Stats()
	t.Logf("admitted %d: %+v", admitted.Load(), st)
	assert.Equal(t, int64(240), admitted.Load(), "below the limit, all are admitted")
	assert.Greater(t, st.LocalAdmits, uint64(120))
	assert.Equal(t, 240, obs.outcomes[ratelimit.OutcomeAllowed], "one outcome per request")
	require.NoError(t, l.Close())
	d, err := rs[0].s.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, int64(300-240-1), d.Remaining, "Close gave back what was not admitted (Peek counts its own cost)")
	d, err = rs[0].s.Check("k", 60*ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the rest is all there")
}

// TestLeaseKeysBounded: a Leased tracks at most Keys keys; a key that
// finds no room goes to Redis alone, and idle keys make room again.
func TestLeaseKeysBounded(t *testing.T) {
	clk := ratelimit.NewManualClock(unixNow)
	rule := ratelimit.FixedWindow{Limit: 1000, Window: 100 * year}
	rs := newReplicas(t, 1, rule, LeaseOptions{Max: 10 * ratelimit.Unit, Hold: time.Second, Keys: 2}, WithClock(clk), WithPrefix(testPrefix()))
	defer closeReplicas(rs)
	l := rs[0].l
	hammer := func(key string) {
		for range 10 {
			d, err := l.Check(key, ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
	}
	hammer("a")
	hammer("b")
	hammer("c")
	assert.Equal(t, 2, l.Stats().Keys)
	assert.NotZero(t, leaseOf(l, "a"))
	assert.NotZero(t, leaseOf(l, "b"))
	assert.Zero(t, leaseOf(l, "c"), "no room: checked alone")
	// Two periods later "a" and "b" are idle, their leases ended: once each
	// lease's end is asleep on the clock, or the clock would move first.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 2))
	clk.Advance(3 * time.Second)
	require.Eventually(t, func() bool { return leaseOf(l, "a") == 0 && leaseOf(l, "b") == 0 }, 5*time.Second, time.Millisecond)
	hammer("c")
	assert.NotZero(t, leaseOf(l, "c"), "an idle key made room")
	assert.LessOrEqual(t, l.Stats().Keys, 2)
}

// TestSlidingCounterLeaseGivesBackNextWindow: a sliding counter's lease
// ended in the window after the one it was spent in still gives its rest
// back (the previous window's count weighs on the estimate there, and the
// refund lightens it, as ratelimit.Store.Refund does); only two windows on
// is there nothing to give back, and no round trip is made for it.
func TestSlidingCounterLeaseGivesBackNextWindow(t *testing.T) {
	rule := ratelimit.SlidingCounter{Limit: 100, Window: time.Minute}
	for _, windows := range []int{1, 2} {
		clk := ratelimit.NewManualClock(unixNow)
		rs := newReplicas(t, 1, rule, LeaseOptions{Max: 30 * ratelimit.Unit, Hold: time.Hour}, WithClock(clk), WithPrefix(testPrefix()))
		l := rs[0].l
		for range 10 {
			d, err := l.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		ls := leaseOfLease(l, "k")
		require.NotNil(t, ls, "the key holds a lease")
		rest := ratelimit.Units(ls.k - ls.used.Load())
		require.NotZero(t, rest)
		clk.Advance(time.Duration(windows) * time.Minute)
		before := rs[0].calls.n.Load()
		require.NoError(t, l.Close())
		st := l.Stats()
		if windows == 1 {
			assert.NotZero(t, st.Returned, "the rest of a lease spent in the previous window was written off")
			assert.Equal(t, before+1, rs[0].calls.n.Load(), "the give-back is one script")
		} else {
			assert.Zero(t, st.Returned)
			assert.Equal(t, before, rs[0].calls.n.Load(), "a give-back that returns nothing was sent")
		}
		assert.Equal(t, rest, st.Returned+st.Unreturned, "%d windows on", windows)
		closeReplicas(rs)
	}
}
