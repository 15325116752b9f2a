package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// newKeyed returns a store for rule on clk.
func newKeyed(t testing.TB, rule ratelimit.Rule, clk ratelimit.Clock) *ratelimit.Store {
	t.Helper()
	s, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	return s
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the JSON log records written so far.
func (s *syncBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

// fixture is a limited handler on virtual time.
type fixture struct {
	t     testing.TB
	clk   *ratelimit.ManualClock
	logs  *syncBuffer
	calls atomic.Int64
	h     http.Handler
}

// newFixture limits a handler that answers 200 "ok" by rule, in a store on
// a ManualClock at 0. Leaky-bucket waits are on that clock: a request that
// waits blocks until the test moves the clock (see start).
func newFixture(t testing.TB, rule ratelimit.Rule, opts ...httplimit.Option) *fixture {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	return newFixtureFor(t, clk, newKeyed(t, rule, clk), opts...)
}

// newFixtureFor is newFixture for a limiter built on clk.
func newFixtureFor(t testing.TB, clk *ratelimit.ManualClock, lim ratelimit.KeyedLimiter, opts ...httplimit.Option) *fixture {
	t.Helper()
	f := &fixture{t: t, clk: clk, logs: &syncBuffer{}}
	base := []httplimit.Option{httplimit.WithLogger(slog.New(slog.NewJSONHandler(f.logs, nil)))}
	mw := httplimit.Middleware(lim, append(base, opts...)...)
	f.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	return f
}

// testWait bounds every wait in these tests, so that a broken one fails
// rather than hangs.
const testWait = 10 * time.Second

// start sends a GET from 192.0.2.1 (httptest's default peer), changed by
// mods, on a goroutine of its own, and returns where its response will
// arrive: a request that waits for its turn only answers once the clock
// has moved far enough.
func (f *fixture) start(mods ...func(*http.Request)) <-chan *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	for _, m := range mods {
		m(r)
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		done <- w
	}()
	return done
}

// do sends a request as start does and returns its response, failing the
// test if it does not come (a request waiting for a clock nobody moves).
func (f *fixture) do(mods ...func(*http.Request)) *httptest.ResponseRecorder {
	f.t.Helper()
	return f.await(f.start(mods...))
}

// await returns the response that arrives on done.
func (f *fixture) await(done <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	f.t.Helper()
	select {
	case w := <-done:
		return w
	case <-time.After(testWait):
		f.t.Fatal("no response")
		return nil
	}
}

// sleepers waits until n requests are asleep on the clock.
func (f *fixture) sleepers(n int) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	require.NoError(f.t, f.clk.BlockUntilSleepers(ctx, n), "waiting for %d sleepers", n)
}

// assertPending checks that no response has arrived on done yet.
func (f *fixture) assertPending(done <-chan *httptest.ResponseRecorder, msg string) {
	f.t.Helper()
	select {
	case w := <-done:
		f.t.Errorf("%s: answered %d before its turn", msg, w.Code)
	default:
	}
}

func from(remote string) func(*http.Request) {
	return func(r *http.Request) { r.RemoteAddr = remote }
}

func header(name, value string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Add(name, value) }
}

func withContext(ctx context.Context) func(*http.Request) {
	return func(r *http.Request) { *r = *r.WithContext(ctx) }
}

// jsonBody decodes a response body into a generic map.
func jsonBody(t testing.TB, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &m), w.Body.String())
	return m
}
