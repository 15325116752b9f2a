package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestDenyCacheSavesRoundTrips: a key hammered at 100 times its limit from
// one process reaches Redis only for what it is admitted and once per
// retry period for what it is refused, and every refusal answered locally
// is one Redis gives at the same instant, with a RetryAfter never shorter
// (see requireCachedRefusal).
func TestDenyCacheSavesRoundTrips(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"fixed window":    ratelimit.FixedWindow{Limit: 10, Window: time.Second},
		"token bucket":    ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 10},
		"sliding log":     ratelimit.SlidingLog{Limit: 10, Window: time.Second},
		"sliding counter": ratelimit.SlidingCounter{Limit: 10, Window: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			prefix := testPrefix()
			// A generous timeout: the race detector on a shared machine is slow.
			cached, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
			require.NoError(t, err)
			// The same keys, without a cache: what Redis itself answers.
			plain, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithDenyCache(0), WithTimeout(5*time.Second))
			require.NoError(t, err)
			const requests = 3000 // 1,000 a second for 3 s: 100 times the limit
			admitted := hammer(t, clk, false, cached, plain, "hammer", requests, requireCachedRefusal)
			refused := requests - admitted
			local := int(cached.Stats().LocalDenials)
			t.Logf("%d requests: %d admitted, %d refused, %d of them locally: %d round trips", requests, admitted, refused, local, requests-local)
			roundTrips := requests - local
			periods := 3 // the retry periods in 3 s of refusals, at most one a window or refill
			assert.LessOrEqual(t, roundTrips, admitted+periods*(10+1),
				"admitted %d, refused %d, of which %d locally", admitted, refused, local)
			assert.Greater(t, local, requests*9/10, "most refusals are answered locally")
		})
	}
}

// hammer checks key through cached requests times, a millisecond apart on
// clk, and holds each refusal the deny cache answers to what plain (the
// same keys without a cache) answers just after, by allowed; it returns
// how many requests were admitted. On the server's clock (serverClock:
// the stores have no client clock) Redis's time has moved on by then, and
// the request may even pass: the cached refusal's At is never later, and
// if Redis refuses too, the instant it says to come back at never earlier.
func hammer(t *testing.T, clk *ratelimit.ManualClock, serverClock bool, cached, plain cachedLimiter, key string, requests int,
	allowed func(t interface {
		require.TestingT
		Helper()
	}, want, got ratelimit.Decision, msgAndArgs ...any)) int {
	t.Helper()
	admitted := 0
	for i := range requests {
		before := cached.Stats().LocalDenials
		d, err := cached.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		if cached.Stats().LocalDenials > before {
			// Answered without Redis: Redis refuses too.
			want, err := plain.Peek(key, ratelimit.Unit)
			require.NoError(t, err)
			switch {
			case !serverClock:
				allowed(t, want, d, "request %d at %v", i, clk.Now())
			case want.Allowed:
				require.LessOrEqual(t, d.At, want.At, "request %d", i)
			default:
				require.LessOrEqual(t, d.At, want.At, "request %d", i)
				require.GreaterOrEqual(t, d.At+d.RetryAfter, want.At+want.RetryAfter, "request %d", i)
			}
		}
		clk.Advance(time.Millisecond)
	}
	return admitted
}

// TestDenyCacheOnServerTime: on the server's clock too, a key far over its
// limit stops costing round trips.
func TestDenyCacheOnServerTime(t *testing.T) {
	rdb := needRedis(t)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 5, Window: 100 * year}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	for range 50 {
		_, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	assert.Equal(t, uint64(50-5-1), s.Stats().LocalDenials, "5 admitted and 1 refused by Redis")
}

func TestDenyCacheOff(t *testing.T) {
	rdb := needRedis(t)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 1, Window: 100 * year}, WithPrefix(testPrefix()), WithDenyCache(0))
	require.NoError(t, err)
	for range 5 {
		_, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	assert.Zero(t, s.Stats().LocalDenials)
}

// TestDenyCacheDropOutdatesInFlightRefusals: a refusal carried back by a
// check sent before a refund or reset dropped its key is not cached, since
// Redis may have refused before the refund; one sent after is.
func TestDenyCacheDropOutdatesInFlightRefusals(t *testing.T) {
	c := newDenyCache(10)
	sent := c.generation()
	c.remember("k", [][]byte{[]byte("5 0 3000")}, 5, time.Now(), time.Now(), sent)
	require.Equal(t, int64(5), c.floor("k"))
	inFlight := c.generation()
	c.drop("k")
	assert.Zero(t, c.floor("k"), "drop kept the entry")
	c.remember("k", [][]byte{[]byte("5 0 3000")}, 5, time.Now(), time.Now(), inFlight)
	assert.Zero(t, c.floor("k"), "a refusal from before the drop was cached")
	c.remember("k", [][]byte{[]byte("6 0 3000")}, 6, time.Now(), time.Now(), c.generation())
	assert.Equal(t, int64(6), c.floor("k"), "a refusal from after the drop was not cached")
}

// TestDenyCacheFloor: with a client clock, a refusal the deny cache
// answered at an instant is one Redis would have recorded as the key's
// latest: when the clock then steps back, a check sent to Redis, a peek
// and a reset all go on from that instant, as they would had Redis made
// the refusal itself, never from the earlier reading.
func TestDenyCacheFloor(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5} // a unit per 100 ms
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	t0 := unixNow
	for _, op := range []string{"check", "peek", "reset"} {
		clk := ratelimit.NewManualClock(t0)
		s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
		require.NoError(t, err)
		for range 5 {
			_, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
		}
		d, err := s.Check("k", 2*ratelimit.Unit)
		require.NoError(t, err)
		require.False(t, d.Allowed, "refused by Redis at t0")
		clk.Set(t0 + 150*time.Millisecond)
		local := s.Stats().LocalDenials
		d, err = s.Check("k", 2*ratelimit.Unit)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.Equal(t, local+1, s.Stats().LocalDenials, "refused by the cache at t0 + 150 ms")
		floor := t0 + 150*time.Millisecond

		clk.Set(t0 + 50*time.Millisecond) // the clock steps back
		state, err := rdb.Get(ctx, s.Key("k")).Result()
		require.NoError(t, err)
		switch op {
		case "check":
			// The cached state admits one unit at its instant: the check
			// goes to Redis, which decides at that instant too.
			want, _, err := m.Step([]byte(state), floor, ratelimit.Unit, true)
			require.NoError(t, err)
			require.True(t, want.Allowed)
			d, err = s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, want, d)
		case "peek":
			want, _, err := m.Step([]byte(state), floor, ratelimit.Unit, false)
			require.NoError(t, err)
			d, err = s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, want, d)
		case "reset":
			require.NoError(t, s.Reset("k"))
			got, err := rdb.Get(ctx, s.Key("k")).Result()
			require.NoError(t, err)
			assert.Equal(t, i64(int64(floor)), got, "the reset kept the key's clamp on time, but not the cache's")
		}
	}
}
