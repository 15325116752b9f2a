package redisstore

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The tests run against a real redis-server that TestMain starts on a free
// loopback port (redistest) and stops at the end; drills that hang or crash
// a server start one of their own, and the Cluster tests a cluster of their
// own. Without redis-server on PATH they fail, unless REDISSTORE_NO_REDIS=1
// says to skip them on purpose.

// shared is the server most tests use; nil when skipping on purpose.
var shared *redistest.Server

func TestMain(m *testing.M) {
	if redistest.Disabled() {
		os.Exit(m.Run()) // every test calls needRedis and skips
	}
	s, err := redistest.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisstore tests need redis-server (or %s=1 to skip them): %v\n", redistest.NoRedisEnv, err)
		os.Exit(1)
	}
	shared = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// needRedis returns a client of the shared server, skipping the test only
// when the opt-out is set.
func needRedis(t testing.TB) *redis.Client {
	t.Helper()
	if shared == nil {
		t.Skipf("%s=1: no redis-server", redistest.NoRedisEnv)
	}
	c := shared.Client(nil)
	t.Cleanup(func() { c.Close() })
	return c
}

// startCluster starts a Redis Cluster of three masters for the test, with
// cluster-require-full-coverage off, so that the live masters keep serving
// their slots when one is lost. It fails the test when the cluster does not
// start, unless the opt-out is set.
func startCluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	return startClusterCoverage(t, false)
}

// startClusterCoverage is startCluster with cluster-require-full-coverage
// set to fullCoverage: when true (Redis's default), every master refuses
// every key once a slot is unserved.
func startClusterCoverage(t testing.TB, fullCoverage bool) *redistest.Cluster {
	t.Helper()
	needRedis(t)
	return redistest.NewCluster(t, redistest.ClusterConfig{FullCoverage: fullCoverage})
}

func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(s, v...) }

func i64(v int64) string { return strconv.FormatInt(v, 10) }
