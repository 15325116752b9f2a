package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// serve runs h on a real listener on 127.0.0.1 until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
		select {
		case err := <-done:
			assert.ErrorIs(t, err, http.ErrServerClosed)
		case <-ctx.Done():
			t.Error("the server never stopped")
		}
	})
	return "http://" + ln.Addr().String()
}

// TestEndToEnd sends real requests over TCP, on the system clock, to a
// limit too slow to refill during the test.
func TestEndToEnd(t *testing.T) {
	logs := &syncBuffer{}
	var calls atomic.Int64
	lim := newKeyed(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 3, Name: "e2e"}, ratelimit.SystemClock())
	mw := httplimit.Middleware(lim,
		httplimit.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))),
		httplimit.WithKey(httplimit.HeaderKey("X-API-Key", httplimit.ClientIP{}.Key)))
	url := serve(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, "hello")
	})))
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(apiKey string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, url+"/hello", nil)
		require.NoError(t, err)
		if apiKey != "" {
			req.Header.Set("X-API-Key", apiKey)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}

	for i := 0; i < 3; i++ {
		resp := get("")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, "hello", string(body))
		assert.Equal(t, `"e2e";q=3;w=10800`, resp.Header.Get("RateLimit-Policy"))
		assert.True(t, strings.HasPrefix(resp.Header.Get("RateLimit"), `"e2e";r=`+itoa(2-i)+";t="),
			resp.Header.Get("RateLimit"))
	}
	resp := get("")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	// Less than an hour's wait has passed since the third request spent the
	// last unit: the exact wait is just under 3600 s and rounds up to it.
	assert.Equal(t, "3600", resp.Header.Get("Retry-After"))
	var body struct {
		Error        string `json:"error"`
		Policy       string `json:"policy"`
		RetryAfterMs int64  `json:"retry_after_ms"`
		Message      string `json:"message"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "rate_limited", body.Error)
	assert.Equal(t, "e2e", body.Policy)
	assert.InDelta(t, 3_600_000, body.RetryAfterMs, 60_000)
	assert.NotEmpty(t, body.Message)

	assert.Equal(t, http.StatusOK, get("my-key").StatusCode, "an API key has its own allowance")
	assert.EqualValues(t, 4, calls.Load())
	lines := logs.lines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "ip:127.0.0.1", lines[0]["key"])
}

// TestEndToEndAbandonedWait queues a request behind an hour-long leaky
// bucket and lets the client give up: the server stops waiting with it.
func TestEndToEndAbandonedWait(t *testing.T) {
	logs := &syncBuffer{}
	var calls atomic.Int64
	lim := newKeyed(t, ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 2}, ratelimit.SystemClock())
	mw := httplimit.Middleware(lim, httplimit.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	url := serve(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })))

	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	_, err = client.Do(req)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "wait abandoned") },
		5*time.Second, 10*time.Millisecond, "the server notices the client leaving")
	assert.EqualValues(t, 1, calls.Load())
}
