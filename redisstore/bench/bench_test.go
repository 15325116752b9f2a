package bench

import (
	"context"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	sredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// checkFunc checks one request for key and reports whether it was admitted.
type checkFunc func(ctx context.Context, key string) (bool, error)

// subject is one limiter under measurement, built on a client.
type subject struct {
	name string
	new  func(tb testing.TB, rdb *redis.Client) checkFunc
}

// ours is the Redis store with rule.
func ours(name string, rule ratelimit.Rule) subject {
	return subject{name, func(tb testing.TB, rdb *redis.Client) checkFunc {
		s, err := redisstore.New(rdb, rule, redisstore.WithTimeout(time.Second))
		if err != nil {
			tb.Fatal(err)
		}
		return func(ctx context.Context, key string) (bool, error) {
			d, err := s.CheckContext(ctx, key, ratelimit.Unit)
			return d.Allowed, err
		}
	}}
}

// subjects are the peers and ours with comparable limits: 1,000 a second
// (a burst of 1,000 for the buckets), except the sliding log, whose state
// holds an entry per admitted instant, at 10 a second; and a GCRA whose
// span (30,000 units at 1,000 a day, 30 days) is beyond the fast path's
// 2^51 ns, so that every check runs on the exact path.
func subjects() []subject {
	return []subject{
		{"redis_rate/gcra", func(tb testing.TB, rdb *redis.Client) checkFunc {
			l := redis_rate.NewLimiter(rdb)
			limit := redis_rate.PerSecond(1000)
			return func(ctx context.Context, key string) (bool, error) {
				r, err := l.Allow(ctx, key, limit)
				if err != nil {
					return false, err
				}
				return r.Allowed > 0, nil
			}
		}},
		{"ulule/fixed_window", func(tb testing.TB, rdb *redis.Client) checkFunc {
			store, err := sredis.NewStoreWithOptions(rdb, limiter.StoreOptions{Prefix: "ulule", MaxRetry: 3})
			if err != nil {
				tb.Fatal(err)
			}
			l := limiter.New(store, limiter.Rate{Period: time.Second, Limit: 1000})
			return func(ctx context.Context, key string) (bool, error) {
				c, err := l.Get(ctx, key)
				return !c.Reached, err
			}
		}},
		ours("ratekit/gcra", ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000}),
		ours("ratekit/token_bucket", ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1000), Burst: 1000}),
		ours("ratekit/leaky_bucket", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1000), Capacity: 1000}),
		ours("ratekit/fixed_window", ratelimit.FixedWindow{Limit: 1000, Window: time.Second}),
		ours("ratekit/sliding_counter", ratelimit.SlidingCounter{Limit: 1000, Window: time.Second}),
		ours("ratekit/sliding_log", ratelimit.SlidingLog{Limit: 10, Window: time.Second}),
		ours("ratekit/gcra_exact", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 1000, Per: 24 * time.Hour}, Burst: 30_000}),
	}
}

var cmdstat = regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+),usec=(\d+)`)

// serverUsec returns the Redis CPU, from INFO commandstats, of the commands
// named in sent since the last CONFIG RESETSTAT. Only the commands the
// client sent count: a script's own calls (TIME, GET, SET, INCRBY...) have
// lines of their own whose time is already in the script's.
func serverUsec(tb testing.TB, rdb *redis.Client, sent map[string]bool) (usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		if sent[m[1]] {
			u, _ := strconv.ParseInt(m[3], 10, 64)
			usec += u
		}
	}
	return usec
}

var usedCPU = regexp.MustCompile(`used_cpu_(?:sys|user):([\d.]+)`)

// serverCPU returns the CPU time the redis-server process has used, system
// and user, from INFO cpu: all its work, reading and writing the network
// included, whatever else shares the cores.
func serverCPU(tb testing.TB, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sec float64
	for _, m := range usedCPU.FindAllStringSubmatch(info, 2) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sec += v
	}
	return time.Duration(sec * float64(time.Second))
}

// clientCPU returns the CPU time this process has used, system and user.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// roundTrips counts the client's round trips (a pipeline is one) and the
// commands it sent.
type roundTrips struct {
	mu    sync.Mutex
	n     int64
	names map[string]bool
}

func (c *roundTrips) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	c.n++
	for _, cmd := range cmds {
		c.names[cmd.Name()] = true
	}
	c.mu.Unlock()
}

// take returns the counts so far and starts again.
func (c *roundTrips) take() (int64, map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, names := c.n, c.names
	c.n, c.names = 0, map[string]bool{}
	return n, names
}

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}

// BenchmarkPeers runs every subject against the same redis-server from 8
// and from 64 goroutines over 10,000 keys, one after another, and reports checks/s, p50
// and p99 latency, Redis CPU per check (the commands' own time from INFO
// commandstats, and the server process's whole CPU time from INFO cpu),
// this process's CPU time per check (the client's side, go-redis
// included), and round trips per check. With PEERS_REVERSED set, the
// subjects run in the reverse order at each number of goroutines: run.sh
// alternates the order from pass to pass, so that no subject always runs
// first on a server that the others have not yet filled and warmed.
func BenchmarkPeers(b *testing.B) {
	rdb := client(b, 64)
	admin := client(b, 1)
	trips := &roundTrips{names: map[string]bool{}}
	rdb.AddHook(trips)
	subs := subjects()
	if os.Getenv("PEERS_REVERSED") != "" {
		slices.Reverse(subs)
	}
	for _, workers := range []int{8, 64} {
		for _, sub := range subs {
			peer(b, rdb, admin, trips, sub, workers)
		}
	}
}

// peer runs one subject from workers goroutines (see BenchmarkPeers).
func peer(b *testing.B, rdb, admin *redis.Client, trips *roundTrips, sub subject, workers int) {
	ctx := context.Background()
	b.Run(sub.name+"/w"+strconv.Itoa(workers), func(b *testing.B) {
		check := sub.new(b, rdb)
		if _, err := check(ctx, "warm-up"); err != nil { // loads scripts
			b.Fatal(err)
		}
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		trips.take()
		server0, client0 := serverCPU(b, admin), clientCPU()
		var mu sync.Mutex
		var lat []time.Duration
		b.SetParallelism(max(1, workers/runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			own := make([]time.Duration, 0, 4096)
			i := 0
			for pb.Next() {
				t0 := time.Now()
				_, err := check(ctx, "key"+strconv.Itoa(i%10000))
				own = append(own, time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
				i += 7
			}
			mu.Lock()
			lat = append(lat, own...)
			mu.Unlock()
		})
		elapsed := time.Since(start)
		b.StopTimer()
		server, client := serverCPU(b, admin)-server0, clientCPU()-client0
		calls, sent := trips.take()
		usec := serverUsec(b, admin, sent)
		slices.Sort(lat)
		n := float64(len(lat))
		if n == 0 {
			return
		}
		b.ReportMetric(n/elapsed.Seconds(), "checks/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(usec)/n, "redis-µs/check")
		b.ReportMetric(float64(calls)/n, "trips/check")
		b.ReportMetric(float64(server.Microseconds())/n, "server-cpu-µs/check")
		b.ReportMetric(float64(client.Microseconds())/n, "client-cpu-µs/check")
	})
}

// TestMemoryPerKey reports what one key's state takes in Redis after five
// checks: every Redis key the subject wrote, by MEMORY USAGE.
func TestMemoryPerKey(t *testing.T) {
	rdb := client(t, 4)
	ctx := context.Background()
	for _, sub := range subjects() {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		check := sub.new(t, rdb)
		for range 5 {
			if _, err := check(ctx, "user:12345"); err != nil {
				t.Fatal(err)
			}
		}
		keys, err := rdb.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, k := range keys {
			n, err := rdb.MemoryUsage(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		var value string
		if len(keys) == 1 {
			value, _ = rdb.Get(ctx, keys[0]).Result()
		}
		t.Logf("%-24s %4d bytes in %d key(s) %q = %q", sub.name, total, len(keys), keys, value)
	}
}
