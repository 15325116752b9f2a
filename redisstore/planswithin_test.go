package redisstore

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
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
			requireWaitGivesUp(t, local, remote, fmt.Sprintf("plan %s, queued %d", plan, queued))
		}
	}
}

// TestRedisPlansFieldsListEveryLayer: httplimit's middleware over a Redis
// Plans lists every enforced layer of the key's plan in its
// RateLimit-Policy and RateLimit fields, as it does over the in-process
// Plans, with the same values, for a plan of layers and a plan of one
// rule.
func TestRedisPlansFieldsListEveryLayer(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(5), Burst: 5}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10, Name: "burst"}},
			{Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Hour, Name: "hourly"}},
			{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "shadow"}, Shadow: true},
		}},
	}}
	planOf := func(key string) string { return key }
	local, err := ratelimit.NewPlans(set, planOf, ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
	require.NoError(t, err)
	remote, err := NewPlans(rdb, set, planOf, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
	require.NoError(t, err)
	byPlan := httplimit.WithKey(func(r *http.Request) (string, error) { return r.URL.Query().Get("plan"), nil })
	serve := func(lim ratelimit.KeyedLimiter, plan string) http.Header {
		h := httplimit.Middleware(lim, byPlan, httplimit.WithLogger(nil))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/?plan="+plan, nil))
		require.Equal(t, http.StatusOK, rec.Code)
		return rec.Header()
	}
	for range 2 {
		for _, plan := range []string{"pro", "free"} {
			want, got := serve(local, plan), serve(remote, plan)
			require.Equal(t, want.Values("RateLimit-Policy"), got.Values("RateLimit-Policy"), "plan %s", plan)
			require.Equal(t, want.Values("RateLimit"), got.Values("RateLimit"), "plan %s", plan)
			if plan == "pro" {
				policy, limit := got.Get("RateLimit-Policy"), got.Get("RateLimit")
				assert.True(t, strings.Contains(policy, `"burst"`) && strings.Contains(policy, `"hourly"`), "RateLimit-Policy: %s", policy)
				assert.Equal(t, 2, strings.Count(limit, ";r="), "RateLimit: %s", limit)
			}
		}
		clk.Advance(time.Second / 3)
	}
}
