package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/require"
)

// TestPlansLeakyWaitSpendsNothingPastDeadline: a Plans' Wait on a plan with
// a leaky bucket, of one rule or a layer of several, whose Delay would not
// end before its deadline gives up at once and spends nothing, whether the
// queue has room now (the request would be admitted with too long a Delay)
// or only after a RetryAfter that itself fits the deadline, as in process.
func TestPlansLeakyWaitSpendsNothingPastDeadline(t *testing.T) {
	rdb := needRedis(t)
	leaky := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5}
	set := ratelimit.PlanSet{Default: "one", Plans: map[string]ratelimit.Plan{
		"one": {Rule: leaky},
		"layers": {Layers: []ratelimit.Layer{
			{Rule: leaky},
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100}, Key: func(string) string { return "all" }},
		}},
	}}
	for _, plan := range []string{"one", "layers"} {
		for _, queued := range []ratelimit.Units{3 * ratelimit.Unit, 5 * ratelimit.Unit} {
			clk := ratelimit.NewManualClock(unixNow)
			planOf := func(string) string { return plan }
			local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
			require.NoError(t, err)
			remote, err := NewPlans(rdb, set, planOf, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
			require.NoError(t, err)
			for _, lim := range []ratelimit.KeyedLimiter{remote, local} {
				d, err := lim.Check("k", queued)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			// Admitted now with a Delay of 3 s, or after a RetryAfter of
			// 1 s with a Delay of 4 s: neither fits a deadline 2 s away.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			want, werr := local.Wait(ctx, "k", ratelimit.Unit)
			got, gerr := remote.Wait(ctx, "k", ratelimit.Unit)
			cancel()
			require.ErrorIs(t, werr, ratelimit.ErrWouldExceedDeadline)
			require.ErrorIs(t, gerr, ratelimit.ErrWouldExceedDeadline, "plan %s, queued %d", plan, queued)
			require.Less(t, time.Since(start), time.Second, "Wait slept towards a deadline it could not meet")
			require.Equal(t, want, got, "plan %s, queued %d", plan, queued)
			// Nothing was spent: the next check is decided as in process.
			want, err = local.Check("k", 2*ratelimit.Unit)
			require.NoError(t, err)
			got, err = remote.Check("k", 2*ratelimit.Unit)
			require.NoError(t, err)
			require.Equal(t, want, got, "plan %s, queued %d", plan, queued)
		}
	}
}
