package redisstore

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

var cpuStat = regexp.MustCompile(`used_cpu_(?:sys|user):([0-9.]+)`)

// serverCPU returns the Redis server's CPU time so far (INFO cpu, system
// plus user), in microseconds.
func serverCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, m := range cpuStat.FindAllStringSubmatch(info, 2) {
		v, _ := strconv.ParseFloat(m[1], 64)
		total += v
	}
	return total * 1e6
}

// BenchmarkLease checks one hot key from 64 goroutines on the server's
// clock, on a plain Store and with leases, side by side: checks/s, the
// admitted share, latency percentiles, and the Redis CPU (INFO cpu) per
// admitted request. The window rule's lease lasts its Hold; the bucket's,
// near full at this demand, decays at the rule's rate (see Leases in the
// package documentation).
func BenchmarkLease(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 64 })
	defer rdb.Close()
	rules := []struct {
		name string
		rule ratelimit.Rule
	}{
		{"fixed_window", ratelimit.FixedWindow{Limit: 1_000_000, Window: time.Second}},
		{"gcra", ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000}},
	}
	for _, r := range rules {
		for _, leased := range []bool{false, true} {
			name := r.name + "/plain"
			if leased {
				name = r.name + "/leased"
			}
			b.Run(name, func(b *testing.B) {
				s, err := New(rdb, r.rule, WithPrefix(testPrefix()), WithTimeout(time.Second))
				if err != nil {
					b.Fatal(err)
				}
				check := s.Check
				var l *Leased
				if leased {
					l, err = NewLeased(s, LeaseOptions{Max: 100 * ratelimit.Unit, Hold: 100 * time.Millisecond})
					if err != nil {
						b.Fatal(err)
					}
					defer l.Close()
					check = l.Check
				}
				var mu sync.Mutex
				var lat []time.Duration
				var admitted atomic.Int64
				cpu0 := serverCPU(b, rdb)
				b.SetParallelism(32) // 64 goroutines on 2 cores
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					own := make([]time.Duration, 0, 1024)
					for pb.Next() {
						t0 := time.Now()
						d, err := check("global", ratelimit.Unit)
						own = append(own, time.Since(t0))
						if err != nil {
							b.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
					mu.Lock()
					lat = append(lat, own...)
					mu.Unlock()
				})
				elapsed := time.Since(start)
				b.StopTimer()
				cpu1 := serverCPU(b, rdb)
				slices.Sort(lat)
				if len(lat) == 0 {
					return
				}
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "checks/s")
				b.ReportMetric(float64(admitted.Load())/float64(len(lat)), "admitted/check")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-µs")
				if n := admitted.Load(); n > 0 {
					b.ReportMetric((cpu1-cpu0)/float64(n), "redis-cpu-µs/admitted")
				}
				if l != nil {
					st := l.Stats()
					b.ReportMetric(float64(st.LocalAdmits)/float64(len(lat)), "local/check")
				}
			})
		}
	}
}
