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
	clk    *ratelimit.ManualClock
	logs   *syncBuffer
	calls  atomic.Int64
	sleeps []time.Duration
	h      http.Handler
}

// newFixture limits a handler that answers 200 "ok" by rule on a
// ManualClock at 0. Waits are recorded and take no virtual time unless opts
// replace the sleep.
func newFixture(t testing.TB, rule ratelimit.Rule, opts ...httplimit.Option) *fixture {
	t.Helper()
	f := &fixture{clk: ratelimit.NewManualClock(0), logs: &syncBuffer{}}
	base := []httplimit.Option{
		httplimit.WithLogger(slog.New(slog.NewJSONHandler(f.logs, nil))),
		httplimit.WithSleep(func(ctx context.Context, d time.Duration) error {
			f.sleeps = append(f.sleeps, d)
			return ctx.Err()
		}),
	}
	mw := httplimit.Middleware(newKeyed(t, rule, f.clk), append(base, opts...)...)
	f.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	return f
}

// do sends a GET from 192.0.2.1 (httptest's default peer), changed by mods.
func (f *fixture) do(mods ...func(*http.Request)) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	for _, m := range mods {
		m(r)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
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
