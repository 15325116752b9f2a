package redisstore

import (
	"context"
	"errors"
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

// benchRules are production-shaped rules, one per algorithm.
func benchRules() []ratelimit.Rule {
	return []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1000), Burst: 1000},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1000), Capacity: 1000},
		ratelimit.FixedWindow{Limit: 1000, Window: time.Second},
		ratelimit.SlidingLog{Limit: 10, Window: time.Second},
		ratelimit.SlidingCounter{Limit: 1000, Window: time.Second},
		ratelimit.SubWindow{Limit: 1000, Window: time.Second, Buckets: 10},
	}
}

var evalshaStat = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+)`)

// serverUsec returns the EVALSHA calls and the server CPU they took.
func serverUsec(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	m := evalshaStat.FindStringSubmatch(info)
	if m == nil {
		return 0, 0
	}
	calls, _ = strconv.ParseInt(m[1], 10, 64)
	usec, _ = strconv.ParseInt(m[2], 10, 64)
	return calls, usec
}

// BenchmarkCheck measures checks on the server's clock from 64 goroutines
// over 1,000 keys, reporting checks/s, p50 and p99 latency, and the Redis
// CPU per call from INFO commandstats.
func BenchmarkCheck(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 64 })
	defer rdb.Close()
	for _, rule := range benchRules() {
		m, _ := ratelimit.NewMachine(rule)
		b.Run(m.Params().Algorithm, func(b *testing.B) {
			s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat []time.Duration
			c0, u0 := serverUsec(b, rdb)
			b.SetParallelism(32) // 64 goroutines on 2 cores
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				own := make([]time.Duration, 0, 1024)
				i := 0
				for pb.Next() {
					t0 := time.Now()
					_, err := s.Check("key"+strconv.Itoa(i%1000), ratelimit.Unit)
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
			c1, u1 := serverUsec(b, rdb)
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "checks/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			if c1 > c0 {
				b.ReportMetric(float64(u1-u0)/float64(c1-c0), "redis-µs/call")
			}
		})
	}
}

// TestMemoryPerKey logs MEMORY USAGE of one key per algorithm after a few
// checks (a sliding log's grows with its entries).
func TestMemoryPerKey(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for _, rule := range benchRules() {
		s, err := New(rdb, rule, WithPrefix("ratelimit:"))
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if _, err := s.Check("user:12345", ratelimit.Unit); err != nil {
				t.Fatal(err)
			}
		}
		n, err := rdb.MemoryUsage(ctx, s.Key("user:12345")).Result()
		if err != nil {
			t.Fatal(err)
		}
		state, _ := rdb.Get(ctx, s.Key("user:12345")).Result()
		t.Logf("%-16s %4d bytes  key %q state %q", s.Params().Algorithm, n, s.Key("user:12345"), state)
	}
}

// BenchmarkComposite measures a request on two layers, a global GCRA and a
// per-key one, on the server's clock from 64 goroutines over 1,000 keys,
// beside the same per-key layer alone, reporting the Redis CPU per call.
func BenchmarkComposite(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 64 })
	defer rdb.Close()
	perKey := ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000, Name: "per-key"}}
	global := ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1e9), Burst: 1e9, Name: "global"}, Key: func(string) string { return "all" }}
	for _, bc := range []struct {
		name   string
		layers []Layer
	}{
		{"one-layer", []Layer{{Layer: perKey}}},
		{"two-layers", []Layer{{Layer: perKey}, {Layer: global, Global: true}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := NewComposite(rdb, bc.layers, WithPrefix(testPrefix()), WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			calls0, usec0 := serverUsec(b, rdb)
			var mu sync.Mutex
			n := 0
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				i := n
				n++
				mu.Unlock()
				for pb.Next() {
					i++
					if _, err := c.Check(keys[i%len(keys)], ratelimit.Unit); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			calls1, usec1 := serverUsec(b, rdb)
			if calls1 > calls0 {
				b.ReportMetric(float64(usec1-usec0)/float64(calls1-calls0), "server-µs/call")
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

// BenchmarkAfterTheFact measures, from 64 goroutines on the server's clock,
// a peek, and a check followed by a refund of its cost at its At (the pair
// is one op), over 1,000 keys and on one hot key, where refunds meet each
// other's writes, for a GCRA, a sliding log, a sub-window and a Composite
// of the three. It reports
// ops/s, p50 and p99 latency, and the share of refunds that failed with
// ErrConflict.
func BenchmarkAfterTheFact(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 64 })
	defer rdb.Close()
	gcra := ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000}
	type benchCase struct {
		name string
		rule ratelimit.Rule // nil: the Composite of the three rules
		keys int
		peek bool
	}
	rules := []ratelimit.Rule{gcra, ratelimit.SlidingLog{Limit: 1000, Window: time.Second},
		ratelimit.SubWindow{Limit: 1000, Window: time.Second, Buckets: 10}}
	cases := []benchCase{{"peek", gcra, 1000, true}}
	for _, r := range []struct {
		name string
		rule ratelimit.Rule
	}{
		{"gcra", rules[0]},
		{"sliding_log", rules[1]},
		{"sub_window", rules[2]},
		{"composite", nil},
	} {
		cases = append(cases, benchCase{"check+refund/" + r.name, r.rule, 1000, false},
			benchCase{"check+refund/hot-key/" + r.name, r.rule, 1, false})
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			var s interface {
				Check(string, ratelimit.Units) (ratelimit.Decision, error)
				Peek(string, ratelimit.Units) (ratelimit.Decision, error)
				Refund(string, ratelimit.Units, time.Duration) (ratelimit.Units, error)
			}
			var err error
			if bc.rule != nil {
				s, err = New(rdb, bc.rule, WithPrefix(testPrefix()), WithTimeout(10*time.Second))
			} else {
				layers := make([]Layer, len(rules))
				for i, r := range rules {
					layers[i] = Layer{Layer: ratelimit.Layer{Rule: r}}
				}
				s, err = NewComposite(rdb, layers, WithPrefix(testPrefix()), WithTimeout(10*time.Second))
			}
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat []time.Duration
			var refunds, conflicts int
			var next atomic.Int64 // spreads the goroutines over the keys
			b.SetParallelism(32)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				own := make([]time.Duration, 0, 1024)
				var r, c int
				for pb.Next() {
					key := "key" + strconv.Itoa(int(next.Add(1)*7)%bc.keys)
					t0 := time.Now()
					if bc.peek {
						if _, err := s.Peek(key, ratelimit.Unit); err != nil {
							b.Error(err)
							return
						}
						own = append(own, time.Since(t0))
						continue
					}
					d, err := s.Check(key, ratelimit.Unit)
					if err != nil {
						b.Error(err)
						return
					}
					if d.Allowed {
						r++
						if _, err := s.Refund(key, ratelimit.Unit, d.At); errors.Is(err, ErrConflict) {
							c++
						} else if err != nil {
							b.Error(err)
							return
						}
					}
					own = append(own, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, own...)
				refunds, conflicts = refunds+r, conflicts+c
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "ops/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			if refunds > 0 {
				b.ReportMetric(float64(conflicts)/float64(refunds), "conflicts/refund")
			}
		})
	}
}

var fcallStat = regexp.MustCompile(`cmdstat_fcall:calls=(\d+),usec=(\d+)`)

// fcallUsec returns the FCALL calls and the server CPU INFO commandstats
// counts for them, and the server's whole CPU (INFO cpu) in µs.
func fcallUsec(b *testing.B, rdb *redis.Client) (calls, usec int64, cpu float64) {
	info, err := rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	if m := fcallStat.FindStringSubmatch(info); m != nil {
		calls, _ = strconv.ParseInt(m[1], 10, 64)
		usec, _ = strconv.ParseInt(m[2], 10, 64)
	}
	for _, m := range cpuStat.FindAllStringSubmatch(info, 2) {
		v, _ := strconv.ParseFloat(m[1], 64)
		cpu += v * 1e6
	}
	return calls, usec, cpu
}

// BenchmarkExactPath measures, for each algorithm, the Redis CPU of a
// check by the step's library on its exact path (forced) against the
// same check on its fast path: b.N checks a pass from 8 goroutines over
// 1,000 keys on the server's clock, the two paths in turn for 11 passes
// each, the first pass of each left out. It reports the ratio exact/fast
// by INFO commandstats (cmd-x) and by the server's whole CPU, INFO cpu
// (cpu-x), as the median of the passes with their least and greatest.
func BenchmarkExactPath(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 8 })
	defer rdb.Close()
	for _, rule := range benchRules() {
		m, _ := ratelimit.NewMachine(rule)
		b.Run(m.Params().Algorithm, func(b *testing.B) {
			prefix := testPrefix()
			fast, err := New(rdb, rule, WithPrefix(prefix+"f:"), WithTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			exact, err := New(rdb, rule, WithPrefix(prefix+"x:"), WithTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			exact.script = exactFunction
			pass := func(s *Store) (cmd, cpu float64) {
				c0, u0, p0 := fcallUsec(b, rdb)
				var next atomic.Int64
				var wg sync.WaitGroup
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							if _, err := s.Check("key"+strconv.Itoa(int(i*7)%1000), ratelimit.Unit); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				c1, u1, p1 := fcallUsec(b, rdb)
				n := float64(c1 - c0)
				return float64(u1-u0) / n, (p1 - p0) / n
			}
			var cmdX, cpuX, fastUs, exactUs []float64
			b.ResetTimer()
			for i := range 11 {
				fc, fp := pass(fast)
				xc, xp := pass(exact)
				if i == 0 {
					continue
				}
				cmdX, cpuX = append(cmdX, xc/fc), append(cpuX, xp/fp)
				fastUs, exactUs = append(fastUs, fc), append(exactUs, xc)
			}
			b.StopTimer()
			med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
			b.ReportMetric(med(fastUs), "fast-µs")
			b.ReportMetric(med(exactUs), "exact-µs")
			b.ReportMetric(med(cmdX), "cmd-x")
			b.ReportMetric(cmdX[0], "cmd-x-min")
			b.ReportMetric(cmdX[len(cmdX)-1], "cmd-x-max")
			b.ReportMetric(med(cpuX), "cpu-x")
			b.ReportMetric(cpuX[0], "cpu-x-min")
			b.ReportMetric(cpuX[len(cpuX)-1], "cpu-x-max")
		})
	}
}
