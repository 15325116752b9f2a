package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScrapeServer runs the server on a loopback port, spends a client's
// burst and more, and scrapes /metrics over HTTP: the counts are the
// answers the client got.
func TestScrapeServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, io.Discard, func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatal(err)
	}
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	codes := map[int]int{}
	for range 13 {
		resp, err := http.Get(base + "/hello")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	// A burst of 10, and one more every 6 s: 10 or 11 admitted.
	require.Equal(t, 13, codes[http.StatusOK]+codes[http.StatusTooManyRequests])
	require.GreaterOrEqual(t, codes[http.StatusOK], 10)

	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	metrics := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if name, value, ok := strings.Cut(line, " "); ok && strings.HasPrefix(name, "ratelimit_") {
			metrics[name] = value
		}
	}
	itoa := strconv.Itoa
	assert.Equal(t, itoa(codes[http.StatusOK]), metrics[`ratelimit_decisions_total{outcome="allowed",policy="hello"}`])
	assert.Equal(t, itoa(codes[http.StatusTooManyRequests]), metrics[`ratelimit_decisions_total{outcome="refused",policy="hello"}`])
	assert.Equal(t, "1", metrics[`ratelimit_store_keys{layer="0",plan="",policy="hello",store="hello"}`])
	assert.Equal(t, "100000", metrics[`ratelimit_store_max_keys{layer="0",plan="",policy="hello",store="hello"}`])
	assert.Equal(t, "10", metrics[`ratelimit_policy_limit{layer="0",plan="",policy="hello",store="hello"}`])
	assert.Equal(t, "60", metrics[`ratelimit_policy_window_seconds{layer="0",plan="",policy="hello",store="hello"}`])
	assert.Equal(t, "0", metrics[`ratelimit_store_lossy_evictions_total{layer="0",plan="",policy="hello",store="hello"}`])
}
