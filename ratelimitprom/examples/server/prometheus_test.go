package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPrometheusScrapesServer runs the server and a real Prometheus server
// (Debian's package prometheus) on loopback ports, Prometheus scraping the
// server's /metrics every 100 ms, and asks Prometheus's query API for the
// decisions the server made: what a user's Prometheus records is what the
// clients were answered. A machine without the prometheus command fails
// the test: .ci/run installs it.
func TestPrometheusScrapesServer(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus command (Debian package prometheus) is needed for this test")

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

	prom := startPrometheus(t, bin, target)
	deadline := time.Now().Add(60 * time.Second)
	for _, c := range []struct {
		outcome string
		want    int
	}{{"allowed", codes[http.StatusOK]}, {"refused", codes[http.StatusTooManyRequests]}} {
		query := fmt.Sprintf(`sum(ratelimit_decisions_total{policy="hello",outcome=%q})`, c.outcome)
		var got float64
		for {
			v, ok := instantQuery(t, prom, query)
			if ok && v == float64(c.want) {
				break
			}
			got = v
			if time.Now().After(deadline) {
				t.Fatalf("%s: Prometheus has %v (found: %v), want %d, within 60 s", query, got, ok, c.want)
			}
			time.Sleep(100 * time.Millisecond) // polling a real server's scrapes, not waiting for time in the test's own code
		}
	}
}

// startPrometheus starts prometheus scraping target, with its storage in
// the test's temporary directory, and waits until it reports ready; it is
// stopped when the test ends.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 100ms
  evaluation_interval: 1s
scrape_configs:
  - job_name: ratelimit
    static_configs:
      - targets: [%q]
`, target)
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(config), 0o644))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	require.NoError(t, err)
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus's log:\n%s", out)
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("prometheus was not ready within 60 s")
		}
		time.Sleep(100 * time.Millisecond) // polling a real server's readiness
	}
}

// instantQuery asks Prometheus's query API for one scalar-valued vector,
// reporting whether it had a sample.
func instantQuery(t *testing.T, base, query string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(query))
	require.NoError(t, err)
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	require.Equal(t, "success", r.Status)
	if len(r.Data.Result) == 0 {
		return 0, false
	}
	s, ok := r.Data.Result[0].Value[1].(string)
	require.True(t, ok, "a sample's value is a string")
	v, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return v, true
}
