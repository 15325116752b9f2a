package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
)

// addr is the loopback address of the redis-server TestMain started.
var addr string

func TestMain(m *testing.M) {
	r, err := redistest.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "the benchmarks need redis-server: %v\n", err)
		os.Exit(1)
	}
	addr = r.Addr()
	code := m.Run()
	if err := r.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

func client(tb testing.TB, pool int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	return c
}
