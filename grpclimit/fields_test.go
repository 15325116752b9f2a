package grpclimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// The metadata fields carry what httplimit's RateLimit-Policy and RateLimit
// fields carry for the same rule, trace and instants.
func TestFieldsMatchHTTP(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "tb"},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 5},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 2, Name: `a "quoted" name`},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1000), Capacity: 3, Name: "leaky"},
		ratelimit.LeakyBucket{Rate: ratelimit.Every(2 * time.Second), Capacity: 3, Name: "slow"},
		ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second, Name: "log"},
		ratelimit.FixedWindow{Limit: 3, Window: 1500 * time.Millisecond, Name: "fw"},
	}
	for _, rule := range rules {
		hstore, hclk := newStore(t, rule)
		gstore, gclk := newStore(t, rule)
		h := httplimit.Middleware(hstore, httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil }))(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		cc, _ := serve(t, limited(gstore, byAPIKey))
		ctx := testCtx(t)
		for i := range 8 {
			at := time.Duration(i) * 300 * time.Millisecond
			hclk.Set(at)
			gclk.Set(at)
			// Both may be queued by a leaky bucket: run them, and move each
			// clock to its sleeper's instant until both have answered.
			rec := httptest.NewRecorder()
			hdone, gdone := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(hdone)
				h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil))
			}()
			var md metadata.MD
			var err error
			go func() { defer close(gdone); _, md, err = say(ctx, cc, "k") }()
			drain(t, ctx, hclk, hdone)
			drain(t, ctx, gclk, gdone)
			if rec.Code == http.StatusOK {
				require.NoError(t, err, "%T #%d", rule, i)
			} else {
				require.Equal(t, http.StatusTooManyRequests, rec.Code)
				require.Error(t, err)
			}
			assert.Equal(t, rec.Header().Values("RateLimit-Policy"), md.Get(grpclimit.PolicyField), "%T #%d", rule, i)
			assert.Equal(t, rec.Header().Values("RateLimit"), md.Get(grpclimit.LimitField), "%T #%d", rule, i)
		}
	}
}

// TestFieldsMatchHTTPComposite: a composite lists every enforced layer in
// the metadata, as httplimit does in its fields.
func TestFieldsMatchHTTPComposite(t *testing.T) {
	layers := []ratelimit.Layer{
		{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 2, Name: "burst"}},
		{Rule: ratelimit.FixedWindow{Limit: 5, Window: time.Hour, Name: "hourly"}},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "trial"}, Shadow: true},
	}
	hclk, gclk := ratelimit.NewManualClock(0), ratelimit.NewManualClock(0)
	hlim, err := ratelimit.Compose(layers, ratelimit.WithClock(hclk))
	require.NoError(t, err)
	glim, err := ratelimit.Compose(layers, ratelimit.WithClock(gclk))
	require.NoError(t, err)
	h := httplimit.Middleware(hlim, httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil }))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	cc, _ := serve(t, limited(glim, byAPIKey))
	ctx := testCtx(t)
	for i := range 4 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil))
		_, md, err := say(ctx, cc, "k")
		assert.Equal(t, rec.Code == http.StatusOK, err == nil, "#%d", i)
		assert.Equal(t, rec.Header().Values("RateLimit-Policy"), md.Get(grpclimit.PolicyField), "#%d", i)
		assert.Equal(t, rec.Header().Values("RateLimit"), md.Get(grpclimit.LimitField), "#%d", i)
		assert.Equal(t, []string{`"burst";q=2;w=1, "hourly";q=5;w=3600`}, md.Get(grpclimit.PolicyField), "#%d", i)
	}
}

// drain waits for done, moving clk to each sleeper's instant meanwhile.
func drain(t *testing.T, ctx context.Context, clk *ratelimit.ManualClock, done chan struct{}) {
	t.Helper()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			t.Fatal("the request never ended")
		default:
		}
		if at, ok := clk.NextWake(); ok {
			clk.Set(at)
		}
		runtime.Gosched()
	}
}
