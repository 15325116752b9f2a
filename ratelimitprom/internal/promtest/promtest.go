// Package promtest runs a real Prometheus server (Debian's package
// prometheus) for tests, on a loopback port, and asks its query API what
// it scraped. A machine without the prometheus command fails the test that
// asks for one: .ci/run installs it.
package promtest

import (
	"encoding/json"
	"fmt"
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

// Start starts prometheus scraping target (host:port) every 100 ms, with
// its storage in the test's temporary directory, waits until it reports
// ready (60 s at most), and returns the base URL of its API; it is stopped
// when the test ends, and its log shown if the test failed.
func Start(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus command (Debian package prometheus) is needed for this test")
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

// Query asks Prometheus's query API for one scalar-valued vector,
// reporting whether it had a sample.
func Query(t *testing.T, base, query string) (float64, bool) {
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

// Await polls Query until query's value is want, failing the test if it
// is not by deadline.
func Await(t *testing.T, base, query string, want float64, deadline time.Time) {
	t.Helper()
	for {
		v, ok := Query(t, base, query)
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: Prometheus has %v (found: %v), want %v, by the deadline", query, v, ok, want)
		}
		time.Sleep(100 * time.Millisecond) // polling a real server's scrapes, not waiting for time in the test's own code
	}
}
