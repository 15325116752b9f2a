package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/redisstore"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// redisAddr is the loopback address of the redis-server TestMain started.
var redisAddr string

func TestMain(m *testing.M) {
	if redistest.Disabled() {
		os.Exit(m.Run()) // every test skips
	}
	r, err := redistest.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "these tests need redis-server (or %s=1 to skip them): %v\n", redistest.NoRedisEnv, err)
		os.Exit(1)
	}
	redisAddr = r.Addr()
	code := m.Run()
	if err := r.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

func needRedis(t *testing.T) {
	t.Helper()
	if redisAddr == "" {
		t.Skipf("%s=1: no redis-server", redistest.NoRedisEnv)
	}
}

var prefixes atomic.Int64

// replicas starts n instances of the API, each with its own Redis client as
// separate processes would have, sharing one prefix and one client clock
// (Unix time, stopped, so that nothing comes back during the test). The
// timeout is long so that a loaded machine cannot turn a check into the
// failure policy's answer.
func replicas(t *testing.T, n int) []string {
	t.Helper()
	return replicasWith(t, n, defaultConfig())
}

// replicasWith is replicas with the configuration cfg.
func replicasWith(t *testing.T, n int, cfg config) []string {
	t.Helper()
	clk := ratelimit.NewManualClock(time.Duration(time.Now().UnixNano()))
	prefix := fmt.Sprintf("demo%d:", prefixes.Add(1))
	var urls []string
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		h, err := routes(slog.New(slog.NewTextHandler(io.Discard, nil)), rdb, cfg, redisstore.WithClock(clk), redisstore.WithPrefix(prefix), redisstore.WithTimeout(10*time.Second))
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}

// admitted sends count requests, spread round robin over urls, and counts
// the 200s; every other answer must be a 429.
func admitted(t *testing.T, urls []string, method, path, apiKey string, count int) int {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	ok := 0
	for i := range count {
		req, err := http.NewRequest(method, urls[i%len(urls)]+path, nil)
		require.NoError(t, err)
		if apiKey != "" {
			req.Header.Set("X-API-Key", apiKey)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		default:
			t.Fatalf("%s %s: status %d", method, path, resp.StatusCode)
		}
	}
	return ok
}

// TestReplicasShareLimits: three replicas, each with its own client and
// store, admit together exactly what one admits alone, on every route.
func TestReplicasShareLimits(t *testing.T) {
	needRedis(t)
	tests := []struct {
		name, method, path, apiKey string
		requests, want             int
	}{
		{"quote per API key", "GET", "/quote", "key-1", 45, 20},
		{"quote per address", "GET", "/quote", "", 45, 20},
		{"batches of 10 units", "POST", "/labels:batch", "key-2", 9, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alone := admitted(t, replicas(t, 1), tc.method, tc.path, tc.apiKey, tc.requests)
			together := admitted(t, replicas(t, 3), tc.method, tc.path, tc.apiKey, tc.requests)
			assert.Equal(t, tc.want, alone, "one replica alone")
			assert.Equal(t, alone, together, "three replicas together")
		})
	}
}

// TestInProcessReplicasDoNot is the contrast: three replicas with the same
// limit kept in process each grant the whole burst, three times what one
// grants.
func TestInProcessReplicasDoNot(t *testing.T) {
	var urls []string
	for range 3 {
		store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.Every(time.Hour), Burst: 20, Name: "api"})
		require.NoError(t, err)
		h := httplimit.Middleware(store, httplimit.WithKey(httplimit.HeaderKey("X-API-Key", httplimit.ClientIP{}.Key)))(http.HandlerFunc(quote))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	assert.Equal(t, 60, admitted(t, urls, "GET", "/quote", "key-1", 90))
}

// TestRun starts the server on the test's Redis with -addr and -redis, sends
// a request, and shuts it down.
func TestRun(t *testing.T) {
	needRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis", redisAddr}, io.Discard, func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not start")
	}
	// The server's checks have the default 100 ms deadline: on a loaded
	// machine one may miss it and be served by the failure policy, without
	// the limit's fields, so a few requests are allowed before one shows them.
	client := &http.Client{Timeout: 5 * time.Second}
	var policy string
	for range 10 {
		req, err := http.NewRequest("GET", base+"/quote", nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", "run-"+strconv.FormatInt(time.Now().UnixNano(), 10))
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		if policy = resp.Header.Get("RateLimit-Policy"); policy != "" {
			break
		}
	}
	assert.Contains(t, policy, `"api";q=20`)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("server did not stop")
	}
}

// TestRunWithoutRedis: a Redis that does not answer is an error at start.
func TestRunWithoutRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	l.Close()
	err = run(context.Background(), []string{"-addr", "127.0.0.1:0", "-redis", dead}, io.Discard, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redis at "+dead)
}

// TestFailurePolicies: with Redis down, each -failure answers as its
// policy's Decision says, and DecidedBy names it; /login fails closed
// whatever -failure says.
func TestFailurePolicies(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	l.Close()
	tests := []struct {
		failure string
		by      string
		want    []int // statuses of 25 requests to /quote with one key
	}{
		{"open", "fail-open", repeat(http.StatusOK, 25)},
		{"closed", "fail-closed", repeat(http.StatusTooManyRequests, 25)},
		{"fallback", "fallback", nil}, // checked below: a local bucket's
	}
	for _, tc := range tests {
		t.Run(tc.failure, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: dead, ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { rdb.Close() })
			cfg := defaultConfig()
			cfg.failure, cfg.decidedBy = tc.failure, true
			h, err := routes(slog.New(slog.NewTextHandler(io.Discard, nil)), rdb, cfg, redisstore.WithTimeout(time.Second))
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			var got []int
			start := time.Now()
			for range 25 {
				code, by := send(t, "GET", srv.URL+"/quote", "key-1")
				got = append(got, code)
				assert.Equal(t, tc.by, by)
			}
			if tc.want != nil {
				assert.Equal(t, tc.want, got)
			} else {
				// The local bucket: 20 at once, then 10 a second.
				ok := 0
				for _, c := range got {
					if c == http.StatusOK {
						ok++
					}
				}
				assert.Equal(t, repeat(http.StatusOK, 20), got[:20])
				assert.LessOrEqual(t, ok, 20+int(10*time.Since(start)/time.Second))
			}
			code, by := send(t, "POST", srv.URL+"/login", "")
			assert.Equal(t, http.StatusTooManyRequests, code, "/login fails closed")
			assert.Equal(t, "fail-closed", by)
		})
	}
}

func repeat(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// send sends one request and returns its status and DecidedBy.
func send(t *testing.T, method, url, apiKey string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if apiKey != "" {
		req.Header.Set("X-API-Key", apiKey)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(DecidedBy)
}
