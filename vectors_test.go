package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// ms is the unit most vectors are written in.
const ms = time.Millisecond

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
