package ratelimit_test

import (
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// TestBucketVectors plays the token bucket's vectors from the design
// against the token bucket and against GCRA, whose decisions equal it.
func TestBucketVectors(t *testing.T) {
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
}

func TestTokenBucketAdmitsAtMostBurstPlusRate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r, c := drawValidBucket(t)
		rc := ruleCase{scale: r.Per, capMilli: c * 1000}
		trace := drawTrace(t, rc)
		_, _, ds := replay(t, ratelimit.TokenBucket{Rate: r, Burst: c}, trace)
		// For every interval [t_i, t_j] between admissions: admitted cost
		// <= Burst + Rate x (t_j - t_i), i.e. admitted*Per <= Burst*Per +
		// Count*1000*(t_j-t_i), exactly.
		for i := range trace {
			var sum int64
			for j := i; j < len(trace); j++ {
				if !ds[j].Allowed {
					continue
				}
				sum += int64(trace[j].cost)
				lhs := new(big.Int).Mul(big.NewInt(sum), big.NewInt(int64(r.Per)))
				rhs := new(big.Int).Mul(big.NewInt(c*1000), big.NewInt(int64(r.Per)))
				rhs.Add(rhs, new(big.Int).Mul(big.NewInt(r.Count*1000), big.NewInt(int64(trace[j].at-trace[i].at))))
				require.LessOrEqual(t, lhs.Cmp(rhs), 0, "admitted %d milli-units in [%v, %v]", sum, trace[i].at, trace[j].at)
			}
		}
	})
}
