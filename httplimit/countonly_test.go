package httplimit_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// failedLogins counts 401 and 403 responses only.
func failedLogins(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}

// statusHandler answers with the status the request asks for in its
// X-Status header, or writes "ok" if it asks for none.
var statusHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if s := r.Header.Get("X-Status"); s != "" {
		code, _ := strconv.Atoi(s)
		w.WriteHeader(code)
		return
	}
	_, _ = w.Write([]byte("ok"))
})

// post sends a request from addr asking for status (0: none) and
// returns the response.
func post(h http.Handler, addr string, status int) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/login", nil)
	r.RemoteAddr = addr
	if status != 0 {
		r.Header.Set("X-Status", strconv.Itoa(status))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestCountOnly(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store := newKeyed(t, ratelimit.SlidingLog{Limit: 3, Window: time.Minute, Name: "login"}, clk)
	h := httplimit.Middleware(store, httplimit.WithCountOnly(failedLogins))(statusHandler)
	const addr = "192.0.2.1:1234"

	for i := range 20 { // successes never count
		w := post(h, addr, 0)
		require.Equal(t, http.StatusOK, w.Code, "success %d", i)
		assert.Equal(t, `"login";r=2;t=60`, w.Header().Get("RateLimit"), "the fields tell what was admitted")
		require.Equal(t, http.StatusNoContent, post(h, addr, http.StatusNoContent).Code)
		require.Equal(t, http.StatusInternalServerError, post(h, addr, http.StatusInternalServerError).Code)
	}
	clk.Advance(time.Second)
	require.Equal(t, http.StatusUnauthorized, post(h, addr, http.StatusUnauthorized).Code)
	clk.Advance(time.Second)
	require.Equal(t, http.StatusForbidden, post(h, addr, http.StatusForbidden).Code)
	require.Equal(t, http.StatusUnauthorized, post(h, addr, http.StatusUnauthorized).Code)
	w := post(h, addr, 0)
	require.Equal(t, http.StatusTooManyRequests, w.Code, "three failures: even a right password waits")
	assert.Equal(t, "59", w.Header().Get("Retry-After"))
	d, err := store.Peek("ip:192.0.2.1", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 59*time.Second, d.RetryAfter, "exactly when the first failure leaves the window")
	assert.Equal(t, http.StatusOK, post(h, "192.0.2.2:1", 0).Code, "another address")

	clk.Advance(59 * time.Second)
	assert.Equal(t, http.StatusOK, post(h, addr, 0).Code)
	assert.Equal(t, http.StatusUnauthorized, post(h, addr, http.StatusUnauthorized).Code)
	assert.Equal(t, http.StatusTooManyRequests, post(h, addr, 0).Code)
}

// TestCountOnlyStatus checks which status a response is judged by.
func TestCountOnlyStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(w http.ResponseWriter)
		status  int
	}{
		{"nothing written", func(http.ResponseWriter) {}, 200},
		{"a body only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, 200},
		{"a status", func(w http.ResponseWriter) { w.WriteHeader(401) }, 401},
		{"the first status", func(w http.ResponseWriter) { w.WriteHeader(401); w.WriteHeader(200) }, 401},
		{"informational first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(403) }, 403},
		{"switching protocols is final", func(w http.ResponseWriter) { w.WriteHeader(101) }, 101},
		{"a body, then a status", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")); w.WriteHeader(401) }, 200},
		{"a flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.WriteHeader(401) }, 200},
		{"a flush by the controller", func(w http.ResponseWriter) {
			_ = http.NewResponseController(w).Flush()
			w.WriteHeader(401)
		}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []int
			store := newKeyed(t, ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, ratelimit.NewManualClock(0))
			h := httplimit.Middleware(store, httplimit.WithCountOnly(func(status int) bool {
				seen = append(seen, status)
				return true
			}))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { tc.handler(w) }))
			post(h, "192.0.2.1:1", 0)
			assert.Equal(t, []int{tc.status}, seen)
		})
	}
}

// TestCountOnlyWriterFeatures checks that a handler behind WithCountOnly
// still reaches what its ResponseWriter offers, on a real server: flushing,
// deadlines through http.ResponseController, and hijacking, which counts.
func TestCountOnlyWriterFeatures(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store := newKeyed(t, ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, clk)
	never := func(int) bool { return false }
	mw := httplimit.Middleware(store, httplimit.WithCountOnly(never))
	mux := http.NewServeMux()
	mux.Handle("/stream", mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "second\n")
		if err := rc.Flush(); err != nil {
			t.Error(err)
		}
	})))
	mux.Handle("/hijack", mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		_ = rw.Flush()
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 3 { // each is given back: a limit of 1 admits them one after another
		resp, err := http.Get(srv.URL + "/stream")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		assert.Equal(t, "first\nsecond\n", string(body))
	}

	resp, err := http.Get(srv.URL + "/hijack")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "hi", string(body))
	// The hijacked request stays counted, whatever its handler wrote.
	resp, err = http.Get(srv.URL + "/stream")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

	// A writer without Flush or Hijack: the handler gets errors, not
	// panics, and nothing counts that should not.
	h := httplimit.Middleware(newKeyed(t, ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, clk),
		httplimit.WithCountOnly(never))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _, err := w.(http.Hijacker).Hijack()
		assert.ErrorIs(t, err, http.ErrNotSupported)
		w.(http.Flusher).Flush()
		w.WriteHeader(http.StatusAccepted)
	}))
	for range 3 {
		w := &plainWriter{header: http.Header{}}
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusAccepted, w.status)
	}
}

// plainWriter is a ResponseWriter with nothing but the three methods.
type plainWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (p *plainWriter) Header() http.Header { return p.header }
func (p *plainWriter) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

func (p *plainWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return p.body.Write(b)
}

// TestCountOnlyConcurrent sends 1,000 requests at once at a limit of 10,
// none of which counts: at no instant are more than 10 admitted and not
// yet given back, counted inside the handler.
func TestCountOnlyConcurrent(t *testing.T) {
	const limit, requests = 10, 1000
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprintf("handlers held %v", hold), func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			store := newKeyed(t, ratelimit.SlidingLog{Limit: limit, Window: time.Minute}, clk)
			var inside, most atomic.Int64
			release := make(chan struct{})
			h := httplimit.Middleware(store, httplimit.WithCountOnly(failedLogins))(http.HandlerFunc(
				func(w http.ResponseWriter, _ *http.Request) {
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					if hold {
						<-release
					} else {
						runtime.Gosched() // let others in meanwhile
					}
					// Counted out before the handler returns, so before its
					// cost is given back: the count never exceeds what is spent.
					inside.Add(-1)
					w.WriteHeader(http.StatusOK)
				}))
			codes := make(chan int, requests)
			for range requests {
				go func() { codes <- post(h, "192.0.2.1:1", 0).Code }()
			}
			next := func() int {
				select {
				case c := <-codes:
					return c
				case <-time.After(testWait):
					t.Fatal("no response")
					return 0
				}
			}
			admitted := 0
			if hold {
				// The first 10 admitted hold their cost until released, so
				// every other request is refused meanwhile.
				for range requests - limit {
					require.Equal(t, http.StatusTooManyRequests, next())
				}
				assert.Equal(t, int64(limit), inside.Load())
				close(release)
				for range limit {
					require.Equal(t, http.StatusOK, next())
				}
				admitted = limit
			} else {
				for range requests {
					if c := next(); c == http.StatusOK {
						admitted++
					} else {
						require.Equal(t, http.StatusTooManyRequests, c)
					}
				}
			}
			assert.LessOrEqual(t, most.Load(), int64(limit))
			assert.GreaterOrEqual(t, admitted, limit)
			t.Logf("%d of %d admitted, at most %d at once", admitted, requests, most.Load())
			d, err := store.Peek("ip:192.0.2.1", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, int64(limit-1), d.Remaining, "every cost was given back")
		})
	}
}

// TestCountOnlyShadow checks that in shadow mode the limiter is given back
// what it spent, as if it enforced, and nothing for a request it would have
// refused (it spent nothing on it).
func TestCountOnlyShadow(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store := newKeyed(t, ratelimit.SlidingLog{Limit: 2, Window: time.Minute}, clk)
	h := httplimit.Middleware(store, httplimit.WithShadowMode(nil), httplimit.WithCountOnly(failedLogins))(statusHandler)
	const addr = "192.0.2.1:1"
	peek := func() ratelimit.Decision {
		d, err := store.Peek("ip:192.0.2.1", ratelimit.Unit)
		require.NoError(t, err)
		return d
	}
	assert.Equal(t, http.StatusOK, post(h, addr, 0).Code)
	assert.Equal(t, int64(1), peek().Remaining, "given back")
	assert.Equal(t, http.StatusUnauthorized, post(h, addr, http.StatusUnauthorized).Code)
	assert.Equal(t, http.StatusUnauthorized, post(h, addr, http.StatusUnauthorized).Code)
	assert.Equal(t, time.Minute, peek().RetryAfter, "two failures spent both")
	// Would be refused: admitted, and nothing is given back, as nothing was
	// spent (a refund at this same instant would take one of the failures).
	assert.Equal(t, http.StatusOK, post(h, addr, 0).Code)
	d := peek()
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Minute, d.RetryAfter)
}

// TestCountOnlyWithoutRefund checks that a limiter that cannot give back
// is said to be so when the middleware is built, and that every admitted
// request then counts.
func TestCountOnlyWithoutRefund(t *testing.T) {
	var logs syncBuffer
	clk := ratelimit.NewManualClock(0)
	lim := checkOnly{newKeyed(t, ratelimit.SlidingLog{Limit: 2, Window: time.Minute}, clk)}
	h := httplimit.Middleware(lim, httplimit.WithCountOnly(failedLogins),
		httplimit.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))(statusHandler)
	lines := logs.lines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "ERROR", lines[0]["level"])
	assert.Contains(t, lines[0]["msg"], "WithCountOnly needs a limiter with a Refund method")
	assert.Equal(t, "httplimit_test.checkOnly", lines[0]["limiter"])
	assert.Equal(t, http.StatusOK, post(h, "192.0.2.1:1", 0).Code)
	assert.Equal(t, http.StatusOK, post(h, "192.0.2.1:1", 0).Code)
	assert.Equal(t, http.StatusTooManyRequests, post(h, "192.0.2.1:1", 0).Code)
}

// TestCountOnlyNil checks that WithCountOnly(nil) counts every request.
func TestCountOnlyNil(t *testing.T) {
	store := newKeyed(t, ratelimit.SlidingLog{Limit: 1, Window: time.Minute}, ratelimit.NewManualClock(0))
	h := httplimit.Middleware(store, httplimit.WithCountOnly(nil))(statusHandler)
	assert.Equal(t, http.StatusOK, post(h, "192.0.2.1:1", 0).Code)
	assert.Equal(t, http.StatusTooManyRequests, post(h, "192.0.2.1:1", 0).Code)
}

// BenchmarkCountOnly measures an admitted request whose response does not
// count: the check, the wrapped writer and the refund.
func BenchmarkCountOnly(b *testing.B) {
	store, err := ratelimit.NewStore(ratelimit.SlidingLog{Limit: 1_000_000, Window: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	h := httplimit.Middleware(store, httplimit.WithCountOnly(failedLogins))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
	if w.Code != http.StatusOK {
		b.Fatalf("status %d", w.Code)
	}
}
