package ratelimit_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// shardClock reads clk raised to the latest instant a shard has decided
// at: the time a Store of one shard decides at, as its doc states. A
// single-key limiter on it decides as that Store does for its key.
type shardClock struct {
	clk  *ratelimit.ManualClock
	last *atomic.Int64
}

func (c shardClock) Now() time.Duration {
	return max(c.clk.Now(), time.Duration(c.last.Load()))
}

// TestStoreClampsPerShard: after the clock steps back, a Store of one
// shard decides a key at the latest instant the shard has decided at,
// later than a single-key limiter decides the same key, which clamps to
// its own latest instant (as redisstore does).
func TestStoreClampsPerShard(t *testing.T) {
	const s = time.Second
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}
	clk := ratelimit.NewManualClock(10 * s)
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithShards(1))
	require.NoError(t, err)
	alone, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := store.Check("a", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	clk.Set(9 * s) // the clock steps back 1 s
	d, err = store.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 10*s, d.At, "b's first check, at its shard's latest instant")
	da, err := alone.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 9*s, da.At, "alone, at the clock's reading")

	clk.Set(9*s + s/2)
	d, err = store.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Decision{Limit: 1, RetryAfter: s, ResetAfter: s, At: 10 * s, Window: s}, d)
	da, err = alone.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Decision{Limit: 1, RetryAfter: s / 2, ResetAfter: s / 2, At: 9*s + s/2, Window: s}, da)
}

// TestStoreClampsPerShardDifferential: on traces whose clock steps back,
// a Store of one shard decides every key exactly as a single-key limiter
// of the key whose clock is raised to the latest instant the store has
// decided at, for every algorithm.
func TestStoreClampsPerShardDifferential(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				lc := drawLimitCase(t, a)
				clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, int64(lc.scale)*4).Draw(t, "start")))
				store, err := ratelimit.NewStore(lc.rule, ratelimit.WithClock(clk), ratelimit.WithShards(1))
				require.NoError(t, err)
				var last atomic.Int64
				keys := []string{"a", "b", "c"}
				alone := make(map[string]ratelimit.Limiter, len(keys))
				for _, k := range keys {
					alone[k], err = ratelimit.New(lc.rule, ratelimit.WithClock(shardClock{clk, &last}))
					require.NoError(t, err)
				}
				backs := 0
				for i, n := 0, rapid.IntRange(1, 50).Draw(t, "steps"); i < n; i++ {
					step := time.Duration(rapid.Int64Range(0, int64(lc.scale)).Draw(t, "step"))
					if rapid.IntRange(0, 3).Draw(t, "back") == 0 {
						clk.Set(max(clk.Now()-step, 0))
						backs++
					} else {
						clk.Advance(step / time.Duration(rapid.SampledFrom([]int64{1, 8, 64}).Draw(t, "shrink")))
					}
					k := rapid.SampledFrom(keys).Draw(t, "key")
					cost := drawCostWithin(t, lc.capMilli, "cost")
					want, werr := alone[k].Check(cost)
					got, gerr := store.Check(k, cost)
					require.Equal(t, werr, gerr)
					require.Equal(t, want, got, "step %d, key %s at %v", i, k, clk.Now())
					last.Store(max(last.Load(), int64(got.At)))
				}
				t.Logf("%d steps back", backs)
			})
		})
	}
}
