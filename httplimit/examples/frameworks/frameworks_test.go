package frameworks_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/httplimit/examples/frameworks"
)

// TestFrameworks sends real requests over loopback through each router: a
// Composite of two layers admits two, with both layers in the fields, and
// refuses the third with 429, before the route's handler.
func TestFrameworks(t *testing.T) {
	for _, fw := range []struct {
		name   string
		router func(func(http.Handler) http.Handler) http.Handler
	}{
		{"chi", frameworks.Chi},
		{"gin", frameworks.GinRouter},
		{"echo", frameworks.Echo},
	} {
		t.Run(fw.name, func(t *testing.T) {
			lim, err := ratelimit.Compose([]ratelimit.Layer{
				{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 2, Name: "burst"}},
				{Rule: ratelimit.FixedWindow{Limit: 100, Window: 24 * time.Hour, Name: "daily"}},
			})
			require.NoError(t, err)
			calls := 0
			count := func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++; next.ServeHTTP(w, r) })
			}
			mw := func(next http.Handler) http.Handler { return httplimit.Middleware(lim)(count(next)) }
			srv := httptest.NewServer(fw.router(mw))
			t.Cleanup(srv.Close)
			client := &http.Client{Timeout: 5 * time.Second}
			get := func() (*http.Response, string) {
				t.Helper()
				resp, err := client.Get(srv.URL + "/hello")
				require.NoError(t, err)
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp, string(body)
			}
			for i := range 2 {
				resp, body := get()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, "hello", body)
				assert.Equal(t, `"burst";q=2;w=7200, "daily";q=100;w=86400`, resp.Header.Get("RateLimit-Policy"))
				assert.Regexp(t, `^"burst";r=`+[]string{"1", "0"}[i]+`;t=\d+, "daily";r=`+[]string{"99", "98"}[i]+`;t=\d+$`,
					resp.Header.Get("RateLimit"))
			}
			resp, body := get()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "3600", resp.Header.Get("Retry-After"))
			assert.Contains(t, body, `"error":"rate_limited","policy":"burst"`)
			assert.Equal(t, 2, calls, "the refused request never reached the route")
		})
	}
}
