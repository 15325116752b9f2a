package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// loginServer serves the API on a ManualClock, behind a trusted proxy on
// the loopback, so that each request names its client in X-Forwarded-For.
type loginServer struct {
	t    *testing.T
	clk  *ratelimit.ManualClock
	url  string
	logs *syncBuffer
}

// newLoginServer serves the API with the password "s3cret", checked by
// verify if it is not nil.
func newLoginServer(t *testing.T, verify func(string) bool) *loginServer {
	t.Helper()
	if verify == nil {
		verify = passwordIs("s3cret")
	}
	s := &loginServer{t: t, clk: ratelimit.NewManualClock(0), logs: &syncBuffer{}}
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	a, err := newAPI(slog.New(slog.NewTextHandler(s.logs, nil)), loopback, defaultRules(),
		loginConfig{verify: verify, clock: s.clk})
	require.NoError(t, err)
	srv := httptest.NewServer(a.mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// login posts password as the client at addr and returns the response,
// its body read.
func (s *loginServer) login(addr, password string) (*http.Response, map[string]any) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+"/login", strings.NewReader(url.Values{"password": {password}}.Encode()))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Forwarded-For", addr)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	var body map[string]any
	_ = json.Unmarshal(b, &body)
	return resp, body
}

// TestLogin runs the login flow end to end on virtual time: successes never
// count, five failures within a minute lock the address out for exactly 15
// minutes, and other addresses are not affected.
func TestLogin(t *testing.T) {
	s := newLoginServer(t, nil)
	const addr = "203.0.113.7"

	for i := range 20 {
		resp, body := s.login(addr, "s3cret")
		require.Equal(t, http.StatusOK, resp.StatusCode, "login %d", i)
		assert.Equal(t, true, body["ok"])
	}
	for i := range 4 {
		resp, body := s.login(addr, "guess")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "failure %d", i+1)
		assert.Equal(t, "wrong_password", body["error"])
		s.clk.Advance(10 * time.Second)
	}
	resp, _ := s.login(addr, "s3cret")
	require.Equal(t, http.StatusOK, resp.StatusCode, "four failures: not locked out")
	resp, _ = s.login(addr, "guess")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the fifth failure")
	assert.Contains(t, s.logs.String(), `msg="locked out" key=ip:203.0.113.7 for=15m0s`)

	// Locked out for exactly 15 minutes from the fifth failure, right
	// password or not.
	for _, tc := range []struct {
		at    time.Duration // after the fifth failure
		retry string
		ms    float64
	}{
		{0, "900", 900_000},
		{1500 * time.Millisecond, "899", 898_500},
		{15*time.Minute - time.Second, "1", 1000},
		{15*time.Minute - 1, "1", 1},
	} {
		s.clk.Set(40*time.Second + tc.at)
		resp, body := s.login(addr, "s3cret")
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "at %v", tc.at)
		assert.Equal(t, tc.retry, resp.Header.Get("Retry-After"), "at %v", tc.at)
		assert.Equal(t, "locked_out", body["error"])
		assert.Equal(t, "login-lockout", body["policy"])
		assert.Equal(t, tc.ms, body["retry_after_ms"], "at %v", tc.at)
	}
	resp, body := s.login("198.51.100.1", "s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another address: %v", body)

	s.clk.Set(40*time.Second + 15*time.Minute)
	resp, body = s.login(addr, "s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the block is over: %v", body)
	for i := range 4 {
		resp, _ = s.login(addr, "guess")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "failure %d after the block", i+1)
	}
	resp, _ = s.login(addr, "s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the failures before the block were forgotten with it")
}

// TestLoginConcurrent sends 50 wrong passwords at once from one address,
// with the password check held until the test releases it, as a slow one
// would be: the attempts are charged before they are tried, so exactly 5
// are tried and the rest refused, and the address is then locked out.
func TestLoginConcurrent(t *testing.T) {
	release := make(chan struct{})
	var tried atomic.Int64
	s := newLoginServer(t, func(password string) bool {
		tried.Add(1)
		<-release
		return passwordIs("s3cret")(password)
	})
	const addr = "203.0.113.9"
	codes := make(chan int, 50)
	for range 50 {
		go func() {
			req, err := http.NewRequest(http.MethodPost, s.url+"/login", strings.NewReader("password=guess"))
			if err != nil {
				codes <- 0
				return
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("X-Forwarded-For", addr)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	next := func() int {
		select {
		case c := <-codes:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no response")
			return 0
		}
	}
	for range 45 { // while five are being tried
		require.Equal(t, http.StatusTooManyRequests, next())
	}
	close(release)
	for range 5 {
		require.Equal(t, http.StatusUnauthorized, next())
	}
	assert.Equal(t, int64(5), tried.Load())
	resp, body := s.login(addr, "s3cret")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "locked_out", body["error"])
	assert.Equal(t, "900", resp.Header.Get("Retry-After"))
}

// TestLoginMalformed checks that a form that does not parse is the
// client's mistake, 400, and is not counted as a failure.
func TestLoginMalformed(t *testing.T) {
	s := newLoginServer(t, nil)
	for range 10 {
		req, err := http.NewRequest(http.MethodPost, s.url+"/login", strings.NewReader("password=%zz"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-For", "203.0.113.8")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}
	resp, _ := s.login("203.0.113.8", "s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
