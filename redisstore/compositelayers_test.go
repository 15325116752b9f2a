package redisstore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/redis/go-redis/v9"
)

// TestCompositeCheckLayersAsInProcess: the Redis Composite's CheckLayers
// gives the in-process Composite's combined Decision and every enforced
// layer's Decision, field for field, on one ManualClock, for layers of
// every algorithm, enforced or shadow, keyed globally, per customer or per
// whole key, with and without a cap on a leaky bucket's Delay.
func TestCompositeCheckLayersAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rapid.Check(t, func(t *rapid.T) {
		local, clk, want, got := drawComposites(t, rdb, drawRule)
		capacity := ratelimit.Units(1 << 62)
		for _, l := range local {
			m, _ := ratelimit.NewMachine(l.Rule)
			capacity = min(capacity, m.Params().Capacity)
		}
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			clk.Advance(rapid.SampledFrom([]time.Duration{0, 0, 1, time.Millisecond, time.Second, time.Hour}).Draw(t, "advance"))
			key := rapid.SampledFrom([]string{"x 1", "x 2", "y 1"}).Draw(t, "key")
			cost := drawCost(t, capacity)
			maxDelay := rapid.SampledFrom([]time.Duration{0, 0, time.Millisecond, 10 * time.Second}).Draw(t, "maxDelay")
			wd, wl, werr := want.CheckLayers(ctx, key, cost, maxDelay, nil)
			before := got.Stats().LocalDenials
			gd, gl, gerr := got.CheckLayers(ctx, key, cost, maxDelay, nil)
			require.NoError(t, werr)
			require.NoError(t, gerr)
			if got.Stats().LocalDenials > before {
				// The deny cache refused: it lists no layer.
				requireCachedCompositeRefusal(t, wd, gd, "check %d, key %q, cost %d", step, key, cost)
				require.Empty(t, gl)
				continue
			}
			if wd != gd {
				t.Fatalf("check %d, key %q, cost %d:\n in-process %+v\n redis      %+v", step, key, cost, wd, gd)
			}
			require.Equal(t, wl, gl, "check %d, key %q, cost %d: the layers' Decisions", step, key, cost)
		}
	})
}

// drawComposites draws one to three layers, each of a rule drawn by
// rule, keyed globally, per customer or per whole key, enforced or (one
// in four) shadow, and returns them with a ManualClock at unixNow and the
// in-process and Redis Composites of those layers on it.
func drawComposites(t *rapid.T, rdb redis.UniversalClient, rule func(*rapid.T) ratelimit.Rule) ([]ratelimit.Layer, *ratelimit.ManualClock, *ratelimit.Composite, *Composite) {
	keyFns := []func(string) string{func(string) string { return "all" }, firstField, nil}
	local := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) ratelimit.Layer {
		return ratelimit.Layer{Rule: rule(t), Key: keyFns[rapid.IntRange(0, 2).Draw(t, "key")], Shadow: rapid.IntRange(0, 3).Draw(t, "shadow") == 0}
	}), 1, 3).Draw(t, "layers")
	remote := make([]Layer, len(local))
	for i, l := range local {
		remote[i] = Layer{Layer: l}
	}
	clk := ratelimit.NewManualClock(unixNow)
	want, err := ratelimit.Compose(local, ratelimit.WithClock(clk))
	require.NoError(t, err)
	got, err := NewComposite(rdb, remote, WithClock(clk), WithPrefix(testPrefix()), WithHashTag(firstField),
		WithExpiryMargin(time.Hour), WithTimeout(5*time.Second))
	require.NoError(t, err)
	return local, clk, want, got
}

// TestRedisCompositeFieldsListEveryLayer: httplimit's middleware over a
// Redis Composite lists every enforced layer in its RateLimit-Policy and
// RateLimit fields, as it does over the in-process Composite.
func TestRedisCompositeFieldsListEveryLayer(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	c, err := NewComposite(rdb, []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10, Name: "burst"}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Hour, Name: "hourly"}}},
	}, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	h := httplimit.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	policy := rec.Header().Get("RateLimit-Policy")
	assert.True(t, strings.Contains(policy, `"burst"`) && strings.Contains(policy, `"hourly"`), "RateLimit-Policy: %s", policy)
	limit := rec.Header().Get("RateLimit")
	assert.Equal(t, 2, strings.Count(limit, ";r="), "RateLimit: %s", limit)
}

// TestCompositeCheckLayersEndedContext: a context that has ended refuses
// at once, with its error, admitting nothing and listing no layer.
func TestCompositeCheckLayersEndedContext(t *testing.T) {
	rdb := needRedis(t)
	c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}}}}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, layers, err := c.CheckLayers(ctx, "k", ratelimit.Unit, 0, nil)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, d.Allowed)
	assert.Empty(t, layers)
}
