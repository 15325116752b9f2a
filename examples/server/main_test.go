package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// server is a run of the server on 127.0.0.1:0.
type server struct {
	t      *testing.T
	base   string // http://host:port
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

// start runs the server with args, on a free loopback port, and waits until
// it accepts connections. The test stops it with stop, or at its end.
func start(t *testing.T, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{t: t, logs: &syncBuffer{}, cancel: cancel, done: make(chan error, 1)}
	t.Cleanup(cancel)
	addrs := make(chan net.Addr, 1)
	args = append([]string{"-addr", "127.0.0.1:0"}, args...)
	go func() { s.done <- run(ctx, args, s.logs, func(a net.Addr) { addrs <- a }) }()
	select {
	case a := <-addrs:
		s.base = "http://" + a.String()
	case err := <-s.done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not start")
	}
	return s
}

// stop shuts the server down and checks that it stopped cleanly.
func (s *server) stop() {
	s.t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		require.NoError(s.t, err)
	case <-time.After(15 * time.Second):
		s.t.Fatal("server did not shut down")
	}
}

// TestRun starts the server on 127.0.0.1:0, sends it real requests and
// shuts it down.
func TestRun(t *testing.T) {
	srv := start(t)
	base, logs := srv.base, srv.logs

	client := &http.Client{Timeout: 5 * time.Second}
	send := func(method, path, apiKey string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		require.NoError(t, err)
		if apiKey != "" {
			req.Header.Set("X-API-Key", apiKey)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp
	}

	// / lists the routes and their limits, unlimited.
	for i := 0; i < 30; i++ {
		resp, err := client.Get(base + "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var list struct {
			Routes []struct{ Route, Limit string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		require.NoError(t, resp.Body.Close())
		require.Len(t, list.Routes, 5)
		assert.Equal(t, "GET /quote", list.Routes[0].Route)
		assert.Contains(t, list.Routes[0].Limit, `free (default) {"name":"api","algorithm":"token_bucket","rate":"10/s","burst":20}`)
		assert.Equal(t, "POST /login", list.Routes[2].Route)
		assert.Contains(t, list.Routes[2].Limit,
			`"login": failed logins only, sliding log, 5 per 1m0s, per client address; 5 failures within 1m0s lock the address out for 15m0s`)
		assert.Equal(t, "GET /", list.Routes[3].Route)
		assert.Equal(t, "GET /work", list.Routes[4].Route)
	}
	assert.Equal(t, http.StatusNotFound, send(http.MethodGet, "/nope", "").StatusCode)

	resp := send(http.MethodGet, "/quote", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `"api";q=20;w=2`, resp.Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"api";r=19;t=1`, resp.Header.Get("RateLimit"))

	// The batch route spends 10 of the same per-key bucket: two fit in a
	// burst of 20, and the third needs a second of refill.
	start := time.Now()
	assert.Equal(t, http.StatusOK, send(http.MethodPost, "/labels:batch", "k1").StatusCode)
	resp = send(http.MethodPost, "/labels:batch", "k1")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `"api";r=0;t=2`, resp.Header.Get("RateLimit"))
	resp = send(http.MethodPost, "/labels:batch", "k1")
	if time.Since(start) < 900*time.Millisecond {
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	}
	assert.Equal(t, http.StatusOK, send(http.MethodPost, "/labels:batch", "k2").StatusCode, "another key")
	assert.Equal(t, http.StatusMethodNotAllowed, send(http.MethodGet, "/labels:batch", "").StatusCode)

	// A login without the password fails; five lock the address out.
	for i := 0; i < 5; i++ {
		resp := send(http.MethodPost, "/login", "")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "attempt %d", i+1)
		assert.Equal(t, `"login";q=5;w=60`, resp.Header.Get("RateLimit-Policy"))
	}
	req, err := http.NewRequest(http.MethodPost, base+"/login", nil)
	require.NoError(t, err)
	resp, err = client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.True(t, retry >= 895 && retry <= 900, "Retry-After %d", retry)
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "locked_out", body["error"])
	assert.Equal(t, "login-lockout", body["policy"])

	srv.stop()
	out := logs.String()
	assert.True(t, strings.HasPrefix(out, "routes:\n  GET /quote "), "the routes come first:\n%s", out)
	assert.Contains(t, out, "\n  POST /labels:batch ")
	assert.Contains(t, out, "; 10 a call\n")
	assert.Contains(t, out, "\n  POST /login ")
	assert.Contains(t, out, "msg=listening")
	assert.Contains(t, out, "msg=stopped")
	limited := strings.Count(out, `msg="httplimit: rate limited"`)
	assert.True(t, limited <= 1, "one line per limited request:\n%s", out)
	assert.Contains(t, out, `msg="locked out" key=ip:127.0.0.1 for=15m0s`)
}

func TestRunArguments(t *testing.T) {
	for _, args := range [][]string{
		{"-trust", "10.0.0.0/33"},
		{"-addr", "256.0.0.1:0"},
		{"-nope"},
		{"extra"},
	} {
		err := run(context.Background(), args, io.Discard, nil)
		assert.Error(t, err, "%q", args)
	}
}

// TestRulesFile serves with -rules, moves a key to another plan and changes
// a plan by rewriting the file and sending SIGHUP, and checks that a bad
// file is refused while the rules in force stay.
func TestRulesFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.json")
	example, err := os.ReadFile("rules.json")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, example, 0o600))

	srv := start(t, "-rules", file)
	base, logs := srv.base, srv.logs
	client := &http.Client{Timeout: 5 * time.Second}
	quote := func(apiKey string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+"/quote", nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	// A plan of layers lists every layer: pro's own and the one all pro
	// customers share.
	assert.Equal(t, `"api-pro";q=200;w=2, "pro-all";q=2000;w=2`, quote("demo-pro-key").Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"api";q=20;w=2`, quote("someone").Header.Get("RateLimit-Policy"))
	// "someone" spends 10 more on the batch route: 11 of 20.
	req, err := http.NewRequest(http.MethodPost, base+"/labels:batch", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", "someone")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// reloaded waits for the n-th log line saying msg.
	reloaded := func(msg string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(logs.String(), msg) < n {
			require.True(t, time.Now().Before(deadline), "waiting for %q in the log:\n%s", msg, logs.String())
			time.Sleep(5 * time.Millisecond)
		}
	}

	// "someone" moves to pro, and pro's burst doubles.
	next := strings.Replace(string(example), `"demo-pro-key": "pro"`, `"demo-pro-key": "pro", "someone": "pro"`, 1)
	next = strings.Replace(next, `"burst": 200`, `"burst": 400`, 1)
	require.NoError(t, os.WriteFile(file, []byte(next), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	reloaded("rules reloaded", 1)
	resp = quote("someone")
	assert.Equal(t, `"api-pro";q=400;w=4, "pro-all";q=2000;w=2`, resp.Header.Get("RateLimit-Policy"))
	// It had spent 11 of 20, less what came back since at 10 a second: the
	// same fraction of 400 is about 220, not a fresh burst.
	var r, sec int
	_, err = fmt.Sscanf(resp.Header.Get("RateLimit"), `"api-pro";r=%d;t=%d`, &r, &sec)
	require.NoError(t, err, resp.Header.Get("RateLimit"))
	assert.Less(t, r, 300, "remaining after the move to pro")

	// A bad file is refused; the rules in force stay.
	require.NoError(t, os.WriteFile(file, []byte(`{"rules": {"default": "gold", "plans": {}}}`), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	reloaded("rules refused", 1)
	assert.Equal(t, `"api-pro";q=400;w=4, "pro-all";q=2000;w=2`, quote("someone").Header.Get("RateLimit-Policy"))

	srv.stop()
}

func TestRulesFileErrors(t *testing.T) {
	dir := t.TempDir()
	for name, doc := range map[string]string{
		"unknown field":   `{"rules": {"default": "a", "plans": {"a": {"algorithm": "gcra", "rate": "1/s", "burst": 1}}}, "key": {}}`,
		"key on no plan":  `{"rules": {"default": "a", "plans": {"a": {"algorithm": "gcra", "rate": "1/s", "burst": 1}}}, "keys": {"k": "b"}}`,
		"no rules":        `{"keys": {}}`,
		"bad rule":        `{"rules": {"default": "a", "plans": {"a": {"algorithm": "gcra", "rate": "1/s", "burst": 0}}}}`,
		"not json at all": `plans`,
	} {
		file := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-rules", file}, io.Discard, nil)
		assert.ErrorContains(t, err, "-rules", name)
	}
}
