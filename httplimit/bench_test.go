package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// BenchmarkMiddleware measures an admitted request through the middleware
// (keying by client address, the check, the response fields) to a handler
// that does nothing.
func BenchmarkMiddleware(b *testing.B) {
	for _, bc := range []struct {
		name string
		key  httplimit.KeyFunc
		hdr  string
		opts []httplimit.Option
	}{
		{"ClientIP", httplimit.ClientIP{}.Key, "", nil},
		{"HeaderKey", httplimit.HeaderKey("X-API-Key", nil), "0123456789abcdef", nil},
		{"ShadowMode", httplimit.ClientIP{}.Key, "", []httplimit.Option{httplimit.WithShadowMode(nil)}},
		{"MaxDelay", httplimit.ClientIP{}.Key, "", []httplimit.Option{httplimit.WithMaxDelay(time.Second)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000_000), Burst: 1_000_000})
			if err != nil {
				b.Fatal(err)
			}
			h := httplimit.Middleware(store, append(bc.opts, httplimit.WithKey(bc.key))...)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if bc.hdr != "" {
				r.Header.Set("X-API-Key", bc.hdr)
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				h.ServeHTTP(w, r)
			}
			if w.Code != http.StatusOK {
				b.Fatalf("status %d", w.Code)
			}
		})
	}
}
