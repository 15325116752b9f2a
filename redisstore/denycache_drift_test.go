package redisstore

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireCachedRefusal requires that got, a refusal the deny cache
// answered, be one Redis's answer want allows: refused by both, at the same
// instant, for the same rule, with a wait and a reset never shorter and a
// Remaining never higher than Redis's.
func requireCachedRefusal(t interface {
	require.TestingT
	Helper()
}, want, got ratelimit.Decision, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, [3]any{want.Limit, want.Policy, want.Window}, [3]any{got.Limit, got.Policy, got.Window}, msgAndArgs...)
	requireCachedCompositeRefusal(t, want, got, msgAndArgs...)
}

// requireCachedCompositeRefusal is requireCachedRefusal for a Composite's
// deny cache: the layer a cached refusal describes is the one that
// refuses on the layers' states as the cache keeps them, and another
// request that spent on a layer's key since (a global layer's, say) may
// have made another layer the one Redis describes. Refused by both at the
// same instant, with a wait and a reset never shorter and a Remaining
// never higher.
func requireCachedCompositeRefusal(t interface {
	require.TestingT
	Helper()
}, want, got ratelimit.Decision, msgAndArgs ...any) {
	t.Helper()
	require.False(t, want.Allowed, msgAndArgs...)
	require.False(t, got.Allowed, msgAndArgs...)
	require.Equal(t, want.At, got.At, msgAndArgs...)
	require.GreaterOrEqual(t, got.RetryAfter, want.RetryAfter, msgAndArgs...)
	require.GreaterOrEqual(t, got.ResetAfter, want.ResetAfter, msgAndArgs...)
	require.LessOrEqual(t, got.Remaining, want.Remaining, msgAndArgs...)
}

// TestDenyCacheOtherSpender: one process checks through its deny cache
// while another spends on the same key, both with costs of several sizes.
// Every refusal the cache answers is one Redis gives at that instant (a
// peek of the same cost, which spends nothing), with a RetryAfter and a
// ResetAfter never shorter and a Remaining never higher, although the
// other process has spent since the cached refusal.
func TestDenyCacheOtherSpender(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":            ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5},
		"token bucket":    ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: time.Second}, Burst: 5},
		"leaky bucket":    ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 5},
		"fixed window":    ratelimit.FixedWindow{Limit: 5, Window: time.Second},
		"sliding counter": ratelimit.SlidingCounter{Limit: 5, Window: time.Second},
		"sliding log":     ratelimit.SlidingLog{Limit: 5, Window: time.Second},
		"sub-window":      ratelimit.SubWindow{Limit: 6, Window: 3 * time.Second, Buckets: 3},
	} {
		clk := ratelimit.NewManualClock(unixNow)
		prefix := testPrefix()
		counted, calls := countedClient(t)
		cached, err := New(counted, rule, WithClock(clk), WithPrefix(prefix))
		require.NoError(t, err)
		other, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithDenyCache(0))
		require.NoError(t, err)
		otherSpender(t, name, clk, cached, other, calls, []string{"k"}, 400, requireCachedRefusal)
	}
}

// cachedLimiter is a Store or a Composite, as the deny cache tests drive
// it.
type cachedLimiter interface {
	Check(key string, cost ratelimit.Units) (ratelimit.Decision, error)
	Peek(key string, cost ratelimit.Units) (ratelimit.Decision, error)
	Stats() Stats
}

// countedClient returns a client of the shared server that counts the
// scripts it sends.
func countedClient(t *testing.T) (*redis.Client, *callCounter) {
	rdb := shared.Client(nil)
	t.Cleanup(func() { rdb.Close() })
	calls := &callCounter{}
	rdb.AddHook(calls)
	return rdb, calls
}

// otherSpender runs steps requests of random costs on keys[0] through
// cached, whose client calls counts, while other, on the same keys without
// a deny cache, spends on every key of keys at random. A refusal the cache
// answers must send no script, refuse, and be one that Redis's answer at
// that instant (other's peek, which spends nothing) allows by allowed; a
// request the cache does not answer sends one script. Some of the cache's
// answers must come after other spent.
func otherSpender(t *testing.T, name string, clk *ratelimit.ManualClock, cached, other cachedLimiter, calls *callCounter, keys []string, steps int,
	allowed func(t interface {
		require.TestingT
		Helper()
	}, want, got ratelimit.Decision, msgAndArgs ...any)) {
	t.Helper()
	r := rand.New(rand.NewPCG(27, 5))
	local, contested, spent := 0, 0, false
	for i := range steps {
		clk.Advance(time.Duration(r.IntN(40)) * time.Millisecond)
		if r.IntN(2) == 0 {
			key := keys[0]
			if len(keys) > 1 {
				key = keys[r.IntN(len(keys))]
			}
			d, err := other.Check(key, ratelimit.Units(1+r.IntN(2500)))
			require.NoError(t, err)
			spent = spent || d.Allowed
		}
		cost := ratelimit.Units(1+r.IntN(4)) * ratelimit.Unit
		before, sent := cached.Stats().LocalDenials, calls.n.Load()
		d, err := cached.Check(keys[0], cost)
		require.NoError(t, err)
		if cached.Stats().LocalDenials == before {
			require.Equal(t, sent+1, calls.n.Load(), "%s: request %d went to Redis once", name, i)
			spent = false // Redis answered: the cache knows what it holds
			continue
		}
		require.Equal(t, sent, calls.n.Load(), "%s: request %d: a refusal from the cache sent a script", name, i)
		require.False(t, d.Allowed, "%s: request %d: the cache admitted", name, i)
		local++
		if spent {
			contested++
		}
		want, err := other.Peek(keys[0], cost)
		require.NoError(t, err)
		allowed(t, want, d, "%s: request %d of %v, the other spent since: %v", name, i, cost, spent)
	}
	t.Logf("%s: %d refusals answered by the cache, %d after the other process spent", name, local, contested)
	assert.NotZero(t, contested, name)
}

// busyScript spins in Redis until its TIME has moved on ARGV[1] µs.
var busyScript = redis.NewScript(`
local t0 = redis.call('TIME')
local s0 = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
repeat
  local t = redis.call('TIME')
  if (tonumber(t[1]) * 1000000 + tonumber(t[2])) - s0 >= tonumber(ARGV[1]) then return 1 end
until false
`)

// TestDenyCacheServerClock: on the server's clock a refusal the cache
// answers is reported from the earliest instant Redis's time can be, so
// that its At never runs ahead of the answer Redis gives after it and its
// RetryAfter counts down to the instant Redis's own refusal named, even
// when the refusal Redis made reached the script 30 ms after it was sent
// (a refusal reported from the latest instant would be 30 ms ahead).
func TestDenyCacheServerClock(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.Every(time.Hour), Burst: 1}
	prefix := testPrefix()
	plain, err := New(rdb, rule, WithPrefix(prefix), WithDenyCache(0), WithTimeout(5*time.Second))
	require.NoError(t, err)
	other := shared.Client(nil)
	defer other.Close()
	hooked := shared.Client(nil)
	defer hooked.Close()
	// Before the first check's script, Redis busies itself for 30 ms on
	// another connection: that check reaches its script long after it was
	// sent, as on a slow network or behind a busy server.
	var busied atomic.Bool
	hooked.AddHook(beforeScript(func(redis.Cmder) {
		if !busied.Swap(true) {
			require.NoError(t, busyScript.Run(ctx, other, nil, 30_000).Err())
		}
	}))
	cached, err := New(hooked, rule, WithPrefix(prefix), WithTimeout(5*time.Second))
	require.NoError(t, err)

	d, err := plain.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	first, err := cached.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, first.Allowed)
	require.Zero(t, cached.Stats().LocalDenials, "Redis refused first")
	admitAt := first.At + first.RetryAfter

	got, err := cached.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, uint64(1), cached.Stats().LocalDenials, "the cache refused next")
	want, err := plain.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, want.Allowed)
	assert.GreaterOrEqual(t, got.At, first.At, "At went back")
	assert.LessOrEqual(t, got.At, want.At, "the cached refusal's At runs ahead of Redis's answer after it")
	assert.Equal(t, admitAt, got.At+got.RetryAfter, "the cached RetryAfter does not count down to Redis's instant")
	assert.Equal(t, admitAt, want.At+want.RetryAfter)
	assert.GreaterOrEqual(t, got.RetryAfter, want.RetryAfter)
	assert.GreaterOrEqual(t, got.ResetAfter, want.ResetAfter)
}
