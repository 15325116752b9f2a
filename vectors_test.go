package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// burst is a group of identical requests sent at one instant.
type burst struct {
	at      time.Duration
	n       int
	cost    ratelimit.Units
	allowed int // how many of the n must be admitted (the first ones)
}

// runBursts plays bursts against a fresh limiter and returns every decision.
func runBursts(t *testing.T, rule ratelimit.Rule, bursts []burst) []ratelimit.Decision {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	var all []ratelimit.Decision
	for _, b := range bursts {
		clk.Set(b.at)
		cost := b.cost
		if cost == 0 {
			cost = ratelimit.Unit
		}
		allowed := 0
		for i := 0; i < b.n; i++ {
			d, err := lim.Check(cost)
			require.NoError(t, err)
			if d.Allowed {
				assert.Equal(t, i, allowed, "at %v: request %d admitted after a denial", b.at, i)
				allowed++
			}
			all = append(all, d)
		}
		assert.Equal(t, b.allowed, allowed, "at %v: admitted", b.at)
	}
	return all
}

func TestBucketVectors(t *testing.T) {
	ms := time.Millisecond
	for _, kind := range []string{"TokenBucket", "GCRA"} {
		bucket := func(r ratelimit.Rate, b int64) ratelimit.Rule {
			if kind == "GCRA" {
				return ratelimit.GCRA{Rate: r, Burst: b}
			}
			return ratelimit.TokenBucket{Rate: r, Burst: b}
		}
		t.Run(kind, func(t *testing.T) {
			t.Run("10/s burst 20: 25, then 8 at 0.5 s, then 1 at 2.5 s", func(t *testing.T) {
				ds := runBursts(t, bucket(ratelimit.PerSecond(10), 20), []burst{
					{at: 0, n: 25, allowed: 20},
					{at: 500 * ms, n: 8, allowed: 5},
					{at: 2500 * ms, n: 1, allowed: 1},
				})
				last := ds[len(ds)-1]
				assert.Equal(t, int64(19), last.Remaining)
				assert.Equal(t, int64(20), last.Limit)
				assert.Equal(t, 100*ms, last.ResetAfter)
			})
			t.Run("5/s burst 10: 14 at 0, then every 100 ms", func(t *testing.T) {
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(bucket(ratelimit.PerSecond(5), 10), ratelimit.WithClock(clk))
				require.NoError(t, err)
				var d ratelimit.Decision
				admitted := 0
				for i := 0; i < 14; i++ {
					d, err = lim.Check(ratelimit.Unit)
					require.NoError(t, err)
					if d.Allowed {
						admitted++
					}
				}
				assert.Equal(t, 10, admitted)
				assert.False(t, d.Allowed)
				assert.Equal(t, 200*ms, d.RetryAfter)
				for at := 100 * ms; at <= 1000*ms; at += 100 * ms {
					clk.Set(at)
					d, err = lim.Check(ratelimit.Unit)
					require.NoError(t, err)
					assert.Equal(t, at%(200*ms) == 0, d.Allowed, "at %v", at)
				}
			})
			t.Run("burst 4, 1/s: weighted costs", func(t *testing.T) {
				runBursts(t, bucket(ratelimit.PerSecond(1), 4), []burst{
					{at: 0, n: 1, cost: 4 * ratelimit.Unit, allowed: 1},
					{at: 1500 * ms, n: 1, cost: 2 * ratelimit.Unit, allowed: 0},
					{at: 2000 * ms, n: 1, cost: 2 * ratelimit.Unit, allowed: 1},
				})
			})
		})
	}
	t.Run("GCRA 10/s burst 20: 21st RetryAfter 100 ms", func(t *testing.T) {
		ds := runBursts(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, []burst{{at: 0, n: 21, allowed: 20}})
		assert.Equal(t, 100*ms, ds[20].RetryAfter)
	})
}

func TestLeakyBucketVectors(t *testing.T) {
	ms := time.Millisecond
	t.Run("5/s capacity 10: 14 at once, one more at 1 s", func(t *testing.T) {
		ds := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10}, []burst{
			{at: 0, n: 14, allowed: 10},
			{at: 1000 * ms, n: 1, allowed: 1},
		})
		for i := 0; i < 10; i++ {
			assert.Equal(t, time.Duration(i)*200*ms, ds[i].Delay, "request %d", i+1)
		}
		for i := 10; i < 14; i++ {
			assert.Zero(t, ds[i].Delay, "a denied request has no Delay")
		}
		assert.Equal(t, 1000*ms, ds[14].Delay, "goes on at 2000 ms")
	})
	t.Run("NGINX rate=10r/s burst=20 is capacity 21", func(t *testing.T) {
		ds := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 21}, []burst{{at: 0, n: 25, allowed: 21}})
		for i := 0; i < 21; i++ {
			assert.Equal(t, time.Duration(i)*100*ms, ds[i].Delay, "request %d", i+1)
		}
	})
}

func TestSameTrafficAgainstEveryAlgorithm(t *testing.T) {
	// 200 requests, 10 a second from 50 s to 70 s, against 100 per minute.
	minute := time.Minute
	for _, tc := range []struct {
		name string
		rule ratelimit.Rule
		want int
	}{
		{"fixed window", ratelimit.FixedWindow{Limit: 100, Window: minute}, 200},
		{"sliding log", ratelimit.SlidingLog{Limit: 100, Window: minute}, 100},
		{"sliding counter", ratelimit.SlidingCounter{Limit: 100, Window: minute}, 116},
		{"token bucket", ratelimit.TokenBucket{Rate: ratelimit.PerMinute(100), Burst: 100}, 133},
		{"GCRA", ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}, 133},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			admitted := 0
			for i := 0; i < 200; i++ {
				clk.Set(50*time.Second + time.Duration(i)*100*time.Millisecond)
				d, err := lim.Check(ratelimit.Unit)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			assert.Equal(t, tc.want, admitted)
		})
	}
}
