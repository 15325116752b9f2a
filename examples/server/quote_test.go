package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQuoteInFlight holds quotes in progress through the real server and
// checks that a key has at most 4 at once, each key on its own, and that a
// slot is given back when its quote has answered.
func TestQuoteInFlight(t *testing.T) {
	a, err := newAPI(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, defaultRules(),
		loginConfig{verify: passwordIs("letmein"), clock: ratelimit.SystemClock()})
	require.NoError(t, err)
	entered := make(chan string)
	release := make(chan struct{})
	a.quoteWait = func(r *http.Request) {
		entered <- r.Header.Get("X-API-Key")
		<-release
	}
	srv := httptest.NewServer(a.mux)
	defer srv.Close()
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // before Close, so that a failing test does not hang

	type answer struct {
		code int
		hdr  http.Header
		body map[string]any
	}
	get := func(apiKey string) <-chan answer {
		done := make(chan answer, 1)
		go func() {
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/quote", nil)
			if !assert.NoError(t, err) {
				done <- answer{}
				return
			}
			req.Header.Set("X-API-Key", apiKey)
			resp, err := srv.Client().Do(req)
			if !assert.NoError(t, err) {
				done <- answer{}
				return
			}
			defer resp.Body.Close()
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			done <- answer{resp.StatusCode, resp.Header, body}
		}()
		return done
	}
	const wait = 10 * time.Second
	enter := func(want string) {
		t.Helper()
		select {
		case key := <-entered:
			assert.Equal(t, want, key)
		case <-time.After(wait):
			t.Fatal("no quote reached the handler")
		}
	}
	await := func(done <-chan answer) answer {
		t.Helper()
		select {
		case a := <-done:
			return a
		case <-time.After(wait):
			t.Fatal("no answer")
			return answer{}
		}
	}

	var held []<-chan answer
	for range quoteInFlight {
		held = append(held, get("k1"))
		enter("k1")
	}
	// A fifth quote of k1 is refused at once, without reaching the handler.
	refused := await(get("k1"))
	assert.Equal(t, http.StatusTooManyRequests, refused.code)
	assert.Equal(t, "quote-in-flight", refused.body["policy"])
	assert.Equal(t, "1", refused.hdr.Get("Retry-After"))
	assert.Empty(t, refused.hdr.Get("RateLimit"), "no quota fields for an in-flight limit")

	// Another key has its own slots.
	held = append(held, get("k2"))
	enter("k2")

	letGo()
	for _, done := range held {
		ok := await(done)
		assert.Equal(t, http.StatusOK, ok.code)
		assert.Equal(t, `"api";q=20;w=2`, ok.hdr.Get("RateLimit-Policy"), "an admitted quote carries its plan's fields")
	}
	// The slots are back: k1 can have 4 again.
	for range quoteInFlight {
		held = append(held, get("k1"))
		enter("k1")
	}
	for _, done := range held[len(held)-quoteInFlight:] {
		assert.Equal(t, http.StatusOK, await(done).code)
	}
}
