package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratekit/ratelimit/redisstore/bench/load"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoadSmoke is a short cmd/load: three processes of
// redisstore/examples/server sharing a redis-server of their own, under 100
// requests a second for 3 s, two keys at 25 a second each against their
// limit of 10 a second with bursts of 20. No answer may be a 5xx or
// missing, and no key may be admitted more than 20 + 10 t over the span t
// of its admissions. The replicas fail closed, so that a check a loaded
// machine makes miss its deadline can only refuse, never admit beyond the
// bound.
func TestLoadSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	root, err := load.RepoRoot()
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "server")
	require.NoError(t, load.Build(ctx, filepath.Join(root, "redisstore"), "./examples/server", bin))

	r := redistest.New(t)
	logf, err := os.Create(filepath.Join(t.TempDir(), "replicas.log"))
	require.NoError(t, err)
	t.Cleanup(func() { logf.Close() })
	var urls []string
	for range 3 {
		s, err := load.StartServer(bin, []string{"-redis", r.Addr(), "-decided-by", "-failure", "closed"}, logf)
		require.NoError(t, err)
		t.Cleanup(s.Stop)
		urls = append(urls, s.URL)
	}

	res, err := load.Attack(ctx, load.Plan{Name: "smoke", URLs: urls, Path: "/quote", Rate: 100, Duration: 3 * time.Second,
		Keys: 1000, Hot: 2, HotPercent: 50})
	require.NoError(t, err)
	sum := load.Summarize(res)
	keys := load.Bounds(res, load.Rule{Burst: 20, Count: 10, Per: time.Second}, nil)
	t.Logf("%d requests, %.1f/s sent; 200: %d, 429: %d; p50 %v, p99 %v, max %v; decided by %v; %d keys admitted, %d refused, least slack %d",
		sum.Requests, sum.Sent, sum.OK, sum.Refused, sum.P50, sum.P99, sum.Max, sum.By, keys.Keys, keys.Refused, keys.MinSlack)
	assert.GreaterOrEqual(t, sum.Requests, 290)
	assert.Zero(t, sum.Server5xx, "5xx")
	assert.Zero(t, sum.Errors, "requests without an answer")
	assert.Zero(t, sum.Other, "statuses other than 200, 429 and 5xx")
	assert.Zero(t, keys.Over, "keys admitted beyond their bound")
	assert.Equal(t, 2, keys.Refused, "both hot keys reached their limit")
	assert.Equal(t, sum.Requests, sum.By["redis"]+sum.By["fail-closed"], "every answer says who decided")
}
