package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit/ratelimitprom/internal/promtest"
)

// TestPrometheusScrapesServer runs the server and a real Prometheus server
// (Debian's package prometheus) on loopback ports, Prometheus scraping the
// server's /metrics every 100 ms, and asks Prometheus's query API for the
// decisions the server made: what a user's Prometheus records is what the
// clients were answered (see package promtest).
func TestPrometheusScrapesServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, io.Discard, func(a net.Addr) { addrs <- a })
	}()
	var target string
	select {
	case a := <-addrs:
		target = a.String()
	case err := <-done:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not start within 10 s")
	}
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	codes := map[int]int{}
	for range 13 {
		resp, err := http.Get("http://" + target + "/hello")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}

	prom := promtest.Start(t, target)
	deadline := time.Now().Add(60 * time.Second)
	for _, c := range []struct {
		outcome string
		want    int
	}{{"allowed", codes[http.StatusOK]}, {"refused", codes[http.StatusTooManyRequests]}} {
		query := fmt.Sprintf(`sum(ratelimit_decisions_total{policy="hello",outcome=%q})`, c.outcome)
		promtest.Await(t, prom, query, float64(c.want), deadline)
	}
}
