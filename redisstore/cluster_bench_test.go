package redisstore

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClusterVsNode measures GCRA checks on the server's clock from 64
// goroutines over 100,000 distinct keys, on one redis-server and on a
// three-master cluster, side by side, reporting checks/s and p50 and p99
// latency. Every process shares the machine's cores, so the cluster's
// figure is its routing cost, not the throughput of three hosts.
func BenchmarkClusterVsNode(b *testing.B) {
	if shared == nil {
		b.Skipf("%s=1: no redis-server", redistest.NoRedisEnv)
	}
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000}
	const keys = 100_000
	run := func(b *testing.B, rdb redis.UniversalClient) {
		s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		var next atomic.Int64
		var mu sync.Mutex
		var lat []time.Duration
		b.SetParallelism(32) // 64 goroutines on 2 cores
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			own := make([]time.Duration, 0, 1024)
			for pb.Next() {
				key := "key" + strconv.FormatInt(next.Add(1)%keys, 10)
				t0 := time.Now()
				_, err := s.Check(key, ratelimit.Unit)
				own = append(own, time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
			}
			mu.Lock()
			lat = append(lat, own...)
			mu.Unlock()
		})
		elapsed := time.Since(start)
		b.StopTimer()
		slices.Sort(lat)
		if len(lat) > 0 {
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "checks/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		}
	}
	b.Run("node", func(b *testing.B) {
		rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 64 })
		defer rdb.Close()
		run(b, rdb)
	})
	b.Run("cluster", func(b *testing.B) {
		cl := startCluster(b)
		run(b, cl.Client(b, func(o *redis.ClusterOptions) { o.PoolSize = 64 }))
	})
}
