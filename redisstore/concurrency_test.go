package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hundredRules are one rule of each algorithm with a capacity of 100 and a
// rate or window so long that nothing comes back during a test (window
// boundaries, multiples of 100 years from the Unix epoch, are decades away).
func hundredRules() []ratelimit.Rule {
	slow := ratelimit.Every(year) // 100 units take 100 years to come back
	return []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: slow, Burst: 100},
		ratelimit.GCRA{Rate: slow, Burst: 100},
		ratelimit.LeakyBucket{Rate: slow, Capacity: 100},
		ratelimit.FixedWindow{Limit: 100, Window: 100 * year},
		ratelimit.SlidingLog{Limit: 100, Window: 100 * year},
		ratelimit.SlidingCounter{Limit: 100, Window: 100 * year},
	}
}

// TestConcurrentChecksAdmitExactlyTheLimit sends 1,000 checks on one key
// from 16 goroutines over 4 separate clients, on the server's clock.
func TestConcurrentChecksAdmitExactlyTheLimit(t *testing.T) {
	needRedis(t)
	clients := make([]*redis.Client, 4)
	for i := range clients {
		clients[i] = shared.Client(nil)
		defer clients[i].Close()
	}
	for _, rule := range hundredRules() {
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		t.Run(m.Params().Algorithm, func(t *testing.T) {
			prefix := testPrefix()
			stores := make([]*Store, len(clients))
			for i, c := range clients {
				s, err := New(c, rule, WithPrefix(prefix), WithTimeout(10*time.Second))
				require.NoError(t, err)
				stores[i] = s
			}
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[g%len(stores)]
					for range 1000 / 16 {
						d, err := s.CheckContext(context.Background(), "hot", ratelimit.Unit)
						if !assert.NoError(t, err) {
							return
						}
						if d.Allowed {
							admitted.Add(1)
						} else {
							denied.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			// 16 * 62 = 992 checks, then 8 more to make 1,000.
			for range 1000 - 16*(1000/16) {
				d, err := stores[0].Check("hot", ratelimit.Unit)
				require.NoError(t, err)
				if d.Allowed {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
			assert.Equal(t, int64(100), admitted.Load())
			assert.Equal(t, int64(900), denied.Load())
		})
	}
}

// TestServerTime checks on the server's clock: a burst is admitted up to the
// limit, and the instants the script reports are Unix nanoseconds.
func TestServerTime(t *testing.T) {
	rdb := needRedis(t)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 3, Window: 100 * year}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	for i := range 4 {
		d, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, i < 3, d.Allowed, "check %d", i)
	}
	state, err := rdb.Get(context.Background(), s.Key("k")).Result()
	require.NoError(t, err)
	var last, win, count int64
	_, err = fmtSscan(state, &last, &win, &count)
	require.NoError(t, err)
	assert.InDelta(t, time.Now().UnixNano(), last, float64(10*time.Second))
	assert.Equal(t, int64(3000), count)
	ttl, err := rdb.PTTL(context.Background(), s.Key("k")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "the state has an expiry")
}
