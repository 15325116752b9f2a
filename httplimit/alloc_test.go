package httplimit_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// TestAdmittedAllocs pins the cost of an admitted request to at most one
// allocation, keyed by client address or by a header, once its key has
// been seen: the response fields share one allocation and the key none.
func TestAdmittedAllocs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		key    httplimit.KeyFunc
		remote string
		apiKey string
		want   string // the store's key
	}{
		{name: "IPv4", key: httplimit.ClientIP{}.Key, remote: "192.0.2.7:1234", want: "ip:192.0.2.7"},
		{name: "IPv6", key: httplimit.ClientIP{}.Key, remote: "[2001:db8:1:2:3:4:5:6]:1234", want: "ip:2001:db8:1:2::/64"},
		{name: "IPv4-mapped", key: httplimit.ClientIP{}.Key, remote: "[::ffff:192.0.2.7]:1234", want: "ip:192.0.2.7"},
		{
			name: "short header", key: httplimit.HeaderKey("X-API-Key", nil), remote: "192.0.2.7:1234",
			apiKey: "0123456789abcdef", want: httplimit.SecretKey("0123456789abcdef"),
		},
		{
			name: "long header", key: httplimit.HeaderKey("X-API-Key", nil), remote: "192.0.2.7:1234",
			apiKey: "sk_live_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
			want:   httplimit.SecretKey("sk_live_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1_000_000, Name: "api-v1"})
			require.NoError(t, err)
			h := httplimit.Middleware(store, httplimit.WithKey(tc.key))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			if tc.apiKey != "" {
				r.Header.Set("X-API-Key", tc.apiKey)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r) // the key's first request may allocate it
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, 1, store.Len())
			peek, err := store.Peek(tc.want, ratelimit.Unit)
			require.NoError(t, err)
			require.Less(t, peek.Remaining, int64(1_000_000), "the request was not limited by %q", tc.want)

			allocs := testing.AllocsPerRun(200, func() {
				clear(w.Header())
				h.ServeHTTP(w, r)
			})
			assert.LessOrEqual(t, allocs, 1.0)
			assert.Equal(t, 1, store.Len())
			assert.Equal(t, []string{`"api-v1";q=1000000;w=1000000`}, w.Header().Values("RateLimit-Policy"))
			assert.Len(t, w.Header().Values("RateLimit"), 1)
			assert.Regexp(t, `^"api-v1";r=\d+;t=\d+$`, w.Header().Get("RateLimit"))
		})
	}
}

// TestKeysUnderChurn: the keys AddrKey and SecretKey hand out stay right
// when far more distinct keys pass, from many goroutines at once, than
// are kept made for reuse.
func TestKeysUnderChurn(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 2 {
				for i := range 5000 {
					a := netip.AddrFrom4([4]byte{10, byte(g), byte(i >> 8), byte(i)})
					if got, want := httplimit.AddrKey(a, 0), "ip:"+a.String(); got != want {
						t.Errorf("round %d: AddrKey(%v) = %q, want %q", round, a, got, want)
						return
					}
					v := fmt.Sprintf("key-%d-%d", g, i)
					sum := sha256.Sum256([]byte(v))
					if got, want := httplimit.SecretKey(v), "hdr:"+hex.EncodeToString(sum[:16]); got != want {
						t.Errorf("round %d: SecretKey(%q) = %q, want %q", round, v, got, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestFieldsAnyNameLength: the fields are the same bytes whether their
// values fit the one allocation the middleware shares between them or not.
func TestFieldsAnyNameLength(t *testing.T) {
	for _, n := range []int{1, 10, 20, 40, 70, 90, 200} {
		name := strings.Repeat(`a"\`, n)[:n]
		quoted := `"` + strings.NewReplacer(`"`, `\"`, `\`, `\\`).Replace(name) + `"`
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: name},
				ratelimit.WithClock(ratelimit.NewManualClock(0)))
			require.NoError(t, err)
			h := httplimit.Middleware(store)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			require.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, []string{quoted + ";q=20;w=2"}, w.Header().Values("RateLimit-Policy"))
			assert.Equal(t, []string{quoted + ";r=19;t=1"}, w.Header().Values("RateLimit"))
		})
	}
}

// TestNewKeyBytes: a key made for the first time takes no more memory
// than its own bytes (and the size class they round up to), since a store
// keeps it as long as it keeps the key's allowance.
func TestNewKeyBytes(t *testing.T) {
	const n = 50_000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range n {
		// 14 bytes each: "ip:10.x.xx.yy", a fresh address every time.
		_ = httplimit.AddrKey(netip.AddrFrom4([4]byte{10, byte(1 + i/8100), byte(10 + i/90%90), byte(10 + i%90)}), 0)
	}
	runtime.ReadMemStats(&after)
	perKey := float64(after.TotalAlloc-before.TotalAlloc) / n
	// 16 bytes each, and room for what other goroutines of the test
	// binary allocate meanwhile; a key in a 64-byte block would take 64.
	assert.LessOrEqual(t, perKey, 24.0, "bytes allocated per new 14-byte key")
}

// TestDeniedBytes: the default refusal's fields and body, byte for byte,
// for names that need quoting in the message and escaping in JSON.
func TestDeniedBytes(t *testing.T) {
	for _, name := range []string{"", "api", `a"b\c<d>&é`, "tab\there"} {
		t.Run(name, func(t *testing.T) {
			store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerHour(7), Burst: 1, Name: name},
				ratelimit.WithClock(ratelimit.NewManualClock(0)))
			require.NoError(t, err)
			h := httplimit.Middleware(store)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			h.ServeHTTP(httptest.NewRecorder(), r)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			require.Equal(t, http.StatusTooManyRequests, w.Code)

			policy := name
			if policy == "" {
				policy = "default"
			}
			retry := time.Hour / 7
			ms := (retry + time.Millisecond - 1) / time.Millisecond
			body, err := json.Marshal(map[string]any{
				"error": "rate_limited", "policy": policy, "retry_after_ms": ms,
				"message": fmt.Sprintf("too many requests for policy %q: retry in %v", policy, ms*time.Millisecond),
			})
			require.NoError(t, err)
			var order struct {
				Error        string `json:"error"`
				Policy       string `json:"policy"`
				RetryAfterMs int64  `json:"retry_after_ms"`
				Message      string `json:"message"`
			}
			require.NoError(t, json.Unmarshal(body, &order))
			body, err = json.Marshal(order)
			require.NoError(t, err)
			assert.Equal(t, string(body)+"\n", w.Body.String())
			assert.Equal(t, http.Header{
				"Ratelimit-Policy":       w.Header()["Ratelimit-Policy"],
				"Ratelimit":              w.Header()["Ratelimit"],
				"Retry-After":            {"515"},
				"Cache-Control":          {"no-store"},
				"Content-Type":           {"application/json"},
				"X-Content-Type-Options": {"nosniff"},
			}, w.Header())
			assert.Len(t, w.Header()["Ratelimit"], 1)
		})
	}
}

// TestDeniedAllocs pins the allocations of a refusal with the default
// DeniedHandler to at most two, so that a client over its limit stays
// cheap to refuse: its fields, Retry-After and body share one.
func TestDeniedAllocs(t *testing.T) {
	if raceEnabled() {
		t.Skip("the race detector's instrumentation allocates")
	}
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 1, Name: "api"})
	require.NoError(t, err)
	h := httplimit.Middleware(store)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r)
	allocs := testing.AllocsPerRun(200, func() {
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, r)
	})
	require.Equal(t, http.StatusTooManyRequests, w.code)
	assert.LessOrEqual(t, allocs, 2.0)
}

// discardWriter keeps the header map and the status, and drops the body.
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header { return d.h }

func (d *discardWriter) WriteHeader(code int) {
	if d.code == 0 {
		d.code = code
	}
}

func (d *discardWriter) Write(b []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	return len(b), nil
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
