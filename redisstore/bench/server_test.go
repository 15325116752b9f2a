package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratelimit/redisstore/bench/load"
)

// addr is the loopback address of the redis-server TestMain started.
var addr string

func TestMain(m *testing.M) {
	r, err := load.StartRedis()
	if err != nil {
		fmt.Fprintf(os.Stderr, "the benchmarks need redis-server on PATH: %v\n", err)
		os.Exit(1)
	}
	addr = r.Addr
	code := m.Run()
	r.Stop()
	os.Exit(code)
}

func client(tb testing.TB, pool int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	return c
}
