package bench

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
)

// shuffled returns xs in the order the BENCH_ORDER environment variable
// asks for: as declared when it is unset or 0, otherwise shuffled with it
// as the seed. run.sh gives every pass its own seed, so that a subject's
// place in the run (what ran before it, the state of the heap it leaves)
// varies from pass to pass instead of favouring the same subject each time.
func shuffled[T any](xs []T) []T {
	seed, _ := strconv.ParseUint(os.Getenv("BENCH_ORDER"), 10, 64)
	if seed != 0 {
		r := rand.New(rand.NewPCG(seed, 0))
		r.Shuffle(len(xs), func(i, j int) { xs[i], xs[j] = xs[j], xs[i] })
	}
	return xs
}

// BenchmarkSingle checks one key over and over:
//
//   - allowed: under a limit the benchmark cannot exhaust, from one
//     goroutine;
//   - denied: under a limit already spent, from one goroutine;
//   - parallel: as allowed, from GOMAXPROCS goroutines at once.
//
// Every subject gets a fresh limiter. admitted/op is the fraction of checks
// admitted: 1 for allowed and parallel, 0 for denied.
func BenchmarkSingle(b *testing.B) {
	scenarios := []struct {
		name     string
		sc       Scenario
		parallel bool
	}{
		{"allowed", Allowed, false},
		{"denied", Denied, false},
		{"parallel", Allowed, true},
	}
	for _, s := range scenarios {
		for _, subj := range shuffled(SingleSubjects()) {
			if !takes(subj, s.sc) {
				continue
			}
			b.Run(s.name+"/"+subj.Name, func(b *testing.B) {
				check, done := subj.New(s.sc)
				defer done()
				if s.sc == Denied {
					check() // spend the one request the limit admits
				}
				var sleeps int64
				if subj.Sleeps != nil {
					sleeps = subj.Sleeps.Load()
				}
				runChecks(b, s.parallel, check)
				if subj.Sleeps != nil {
					b.ReportMetric(float64(subj.Sleeps.Load()-sleeps)/float64(b.N), "sleeps/op")
				}
			})
		}
	}
}

// takes reports whether subj can take scenario sc.
func takes(subj Single, sc Scenario) bool {
	check, done := subj.New(sc)
	done()
	return check != nil
}

// BenchmarkKeyed runs, for each keyed subject, on the same NumKeys keys:
//
//   - insert: build a store of all NumKeys keys, each added by its first
//     check. Here one op is one key: ns/op, B/op and allocs/op are per key
//     inserted, and heap-B/key is the live heap the full store takes per
//     key, key strings excluded (the benchmark holds them all before it
//     starts).
//   - serial: check the keys of that full store in a fixed random order,
//     from one goroutine;
//   - parallel: the same from GOMAXPROCS goroutines, each starting at its
//     own place in the order.
//
// Only one subject's store is alive at a time.
func BenchmarkKeyed(b *testing.B) {
	keys, order := Keys()
	for _, subj := range shuffled(KeyedSubjects()) {
		var (
			check KeyedCheck
			done  func()
		)
		release := func() {
			if done != nil {
				done()
			}
			check, done = nil, nil
		}
		fill := func() (admitted int) {
			check, done = subj.New()
			for _, k := range keys {
				if check(k) {
					admitted++
				}
			}
			return admitted
		}
		b.Run("insert/"+subj.Name, func(b *testing.B) {
			release()
			b.ReportAllocs()
			before := liveHeap()
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			admitted := 0
			cpu := cpuNanos()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i > 0 {
					b.StopTimer()
					release()
					b.StartTimer()
				}
				admitted += fill()
			}
			b.StopTimer()
			cpu = cpuNanos() - cpu
			runtime.ReadMemStats(&ms1)
			heap := float64(liveHeap()) - float64(before)
			n := float64(b.N) * NumKeys
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/op")
			b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, "B/op")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/op")
			b.ReportMetric(float64(cpu)/n, "cpu-ns/op")
			b.ReportMetric(heap/NumKeys, "heap-B/key")
			b.ReportMetric(float64(admitted)/n, "admitted/op")
		})
		b.Run("serial/"+subj.Name, func(b *testing.B) {
			if check == nil {
				fill()
			}
			b.ReportAllocs()
			cpu := cpuNanos()
			var admitted int64
			i := 0
			for b.Loop() {
				if check(keys[order[i]]) {
					admitted++
				}
				if i++; i == NumKeys {
					i = 0
				}
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
		})
		b.Run("parallel/"+subj.Name, func(b *testing.B) {
			if check == nil {
				fill()
			}
			b.ReportAllocs()
			cpu := cpuNanos()
			var start, total atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(start.Add(250_007) % NumKeys)
				var n int64
				for pb.Next() {
					if check(keys[order[i]]) {
						n++
					}
					if i++; i == NumKeys {
						i = 0
					}
				}
				total.Add(n)
			})
			reportCPU(b, cpu)
			b.ReportMetric(float64(total.Load())/float64(b.N), "admitted/op")
		})
		release()
		runtime.GC()
	}
}

// reportCPU reports the process's CPU time per op since start (a
// cpuNanos reading), GC and every goroutine included: with other work on
// the machine, ns/op grows when the benchmark waits for a core, cpu-ns/op
// much less so. For a parallel benchmark it adds up every core's time.
func reportCPU(b *testing.B, start int64) {
	if now := cpuNanos(); start >= 0 && now >= 0 && b.N > 0 {
		b.ReportMetric(float64(now-start)/float64(b.N), "cpu-ns/op")
	}
}

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkHTTP sends requests from one client through each HTTP
// middleware to the same handler, [Admitted], keyed by the client's
// address:
//
//   - allowed: under a limit the benchmark cannot exhaust, from one
//     goroutine;
//   - denied: under a limit already spent, from one goroutine;
//   - parallel and parallel-denied: the same from GOMAXPROCS goroutines at
//     once, each with its own request and ResponseWriter.
//
// One op is one request, the response's header map cleared before it.
// admitted/op is the fraction answered by the handler: 1 when allowed, 0
// when denied.
func BenchmarkHTTP(b *testing.B) {
	scenarios := []struct {
		name     string
		sc       Scenario
		parallel bool
	}{
		{"allowed", Allowed, false},
		{"denied", Denied, false},
		{"parallel", Allowed, true},
		{"parallel-denied", Denied, true},
	}
	for _, s := range scenarios {
		for _, subj := range shuffled(HTTPSubjects()) {
			b.Run(s.name+"/"+subj.Name, func(b *testing.B) {
				h, done := subj.New(s.sc, Admitted)
				defer done()
				if s.sc == Denied {
					newDiscard().serve(h, newRequest()) // spend the one request the limit admits
				}
				b.ReportAllocs()
				cpu := cpuNanos()
				var admitted int64
				if s.parallel {
					var total atomic.Int64
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						w, r := newDiscard(), newRequest()
						var n int64
						for pb.Next() {
							if w.serve(h, r) {
								n++
							}
						}
						total.Add(n)
					})
					admitted = total.Load()
				} else {
					w, r := newDiscard(), newRequest()
					for b.Loop() {
						if w.serve(h, r) {
							admitted++
						}
					}
				}
				reportCPU(b, cpu)
				b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
			})
		}
	}
}

// runChecks runs check b.N times, from one goroutine or from every core,
// and reports its CPU time and the fraction it admitted.
func runChecks(b *testing.B, parallel bool, check func() bool) {
	b.ReportAllocs()
	cpu := cpuNanos()
	var admitted int64
	if parallel {
		var total atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var n int64
			for pb.Next() {
				if check() {
					n++
				}
			}
			total.Add(n)
		})
		admitted = total.Load()
	} else {
		for b.Loop() {
			if check() {
				admitted++
			}
		}
	}
	reportCPU(b, cpu)
	b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
}
