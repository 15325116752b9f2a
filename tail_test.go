package ratelimit_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"runtime/metrics"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ratekit/ratelimit"
)

var (
	tail       = flag.Bool("tail", false, "run TestTail, the fill-and-churn latency harness (slow)")
	tailShards = flag.Int("tailshards", 0, "TestTail: the store's WithShards (0: the default)")
	tailOnly   = flag.String("tailonly", "", "TestTail: run only the subjects whose names match this regular expression")
	tailRounds = flag.Int("tailrounds", 2, "TestTail: rounds of every subject, alternating")
	tailTrace  = flag.String("tailtrace", "", "TestTail: write an execution trace of the run to this file, with every check over 200µs logged")
)

// tailKeys is the bound of the stores in TestTail; twice as many distinct
// keys are checked, the first half filling a store from empty and the second
// churning through eviction.
const tailKeys = 1_000_000

// tailSlow is the latency over which TestTail logs a check in its
// execution trace (-tailtrace).
const tailSlow = 200 * time.Microsecond

// tailSubject is one thing TestTail times: make builds it, empty, and
// returns its check, which is called with a key valid only during the call
// (its bytes are reused).
type tailSubject struct {
	name string
	make func() func(string) error
}

// TestTail measures the latency of every Check while one goroutine per core
// fills a store from empty to its bound of 1,000,000 keys and then checks
// 1,000,000 more, each new key evicting another, and reports its quantiles
// (over all checks, and over the fill's alone), for a store with the
// default options, for one built WithPreallocation and for a preallocated
// rule set of two plans, beside those of a mutex-guarded Go map bounded the
// same way (the store a user would otherwise write), of an atomic add, and
// of a loop as long as the store's median check (busy, see tailBusy), which
// does no work that could pause: its tail is the machine's (preemption, the
// runtime), the floor under the others; and of the same loop after a few
// writes at random in a working set as large as a store's (busy+mem, see
// tailBusyMem), a floor for code that misses the caches as a check does;
// and of the loop while it allocates as much as the default store did in
// the first round, without the store (busy+alloc, see tailBusyAlloc).
// For each store it also reports the checks that waited for a shard's lock
// and the allocations its insertions made outside the lock (see
// tailWaits), each with how many took the run's p99.99 or more. The
// subjects run in -tailrounds rounds, one after the other in each, and the
// summary gives each its better round and the stores' ratios to the
// floors'. The keys are made as
// they are checked, in a buffer each goroutine reuses, so that the harness
// holds no key strings for the collector to mark.
//
// Then (if -tailonly matches "gc") it times forced full collections
// (runtime.GC, the median of ten, in wall time and in the collector's CPU
// time) with an empty heap, with a store of 1,000,000 keys, and with a
// map[string]int64 of the same keys, and reports the store's ratio to the
// map's (see tailGC).
//
// It asserts nothing about time: run it with
//
//	go test -run TestTail -tail -v .
//
// -tailshards sets the stores' shards, -tailonly picks subjects by name
// (busy needs store or store+pre: it takes the first one's median in the
// first round), -tailrounds the rounds, and -tailtrace writes an execution
// trace of the whole run with every check over 200µs logged in it
// (category "slow", the check's start and latency in nanoseconds since the
// trace began), for `go tool trace`.
func TestTail(t *testing.T) {
	if !*tail {
		t.Skip("a latency harness: run with -tail")
	}
	rule := ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}
	storeOpts := func() []ratelimit.Option {
		opts := []ratelimit.Option{ratelimit.WithMaxKeys(tailKeys)}
		if *tailShards > 0 {
			opts = append(opts, ratelimit.WithShards(*tailShards))
		}
		return opts
	}
	store := func(more ...ratelimit.Option) func(string) error {
		s, err := ratelimit.NewStore(rule, append(storeOpts(), more...)...)
		if err != nil {
			t.Fatal(err)
		}
		return func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err }
	}
	// Each round builds its subjects anew, so that each starts empty.
	subjects := []tailSubject{
		{"store", func() func(string) error { return store() }},
		{"store+pre", func() func(string) error { return store(ratelimit.WithPreallocation()) }},
		{"plans+pre", func() func(string) error {
			// A rule set of two plans, every key on one: its checks take
			// the composite's path through the shards (lock, acquire,
			// step), not the store's.
			set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"free": {Rule: rule}, "pro": {Rule: rule}}, Default: "free"}
			p, err := ratelimit.NewPlans(set, func(string) string { return "free" }, append(storeOpts(), ratelimit.WithPreallocation())...)
			if err != nil {
				t.Fatal(err)
			}
			return func(k string) error { _, err := p.Check(k, ratelimit.Unit); return err }
		}},
		{"map+mutex", func() func(string) error { return newTailMap(tailKeys, rule).check }},
		{"atomic", func() func(string) error {
			var n atomic.Int64
			return func(string) error { n.Add(1); return nil }
		}},
	}
	only, err := regexp.Compile(*tailOnly)
	if err != nil {
		t.Fatal(err)
	}
	// Preallocated or not, the stores take the same shards.
	if s, err := ratelimit.NewStore(rule, storeOpts()...); err == nil {
		t.Logf("stores: %d shards, %d goroutines", s.Stats().Shards, runtime.GOMAXPROCS(0))
	}
	ctx := context.Background()
	if *tailTrace != "" {
		f, err := os.Create(*tailTrace)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			t.Fatal(err)
		}
		defer trace.Stop()
	}
	traceStart := time.Now()
	type result struct{ p9999, max time.Duration }
	best := map[string]result{}
	var order []string
	keep := func(name string, lat []int64) {
		r := result{tailQuantile(lat, 0.9999), time.Duration(lat[len(lat)-1])}
		b, ok := best[name]
		if !ok {
			order = append(order, name)
		} else {
			r = result{min(r.p9999, b.p9999), min(r.max, b.max)}
		}
		best[name] = r
	}
	var busy func(string) error // calibrated in the first round
	var median time.Duration    // the first store's median check, which the floors last
	var grown tailAllocs        // what the default store allocated in the first round
	for round := 1; round <= *tailRounds; round++ {
		for _, sub := range subjects {
			if !only.MatchString(sub.name) {
				continue
			}
			waits, allocs := newTailWaits(), newTailWaits()
			ratelimit.SetLockWaits(waits.record)
			ratelimit.SetInsertAllocs(func(d time.Duration) { allocs.record(d, false) })
			lat, fill, allocated := tailRun(ctx, traceStart, sub.make())
			ratelimit.SetLockWaits(nil)
			ratelimit.SetInsertAllocs(nil)
			if sub.name == "store" && grown.n == 0 {
				grown = tailAllocs{n: allocs.n.Load(), bytes: int64(allocated)}
			}
			t.Logf("round %d: %s  heap allocated %.1f MB", round, tailReport(sub.name, lat), float64(allocated)/1e6)
			t.Logf("round %d: %s", round, tailReport(sub.name+" fill", fill))
			if waits.n.Load() > 0 {
				t.Logf("round %d: %s", round, waits.report(sub.name, lat))
			}
			if allocs.n.Load() > 0 {
				t.Logf("round %d: %s", round, allocs.allocReport(sub.name, lat))
			}
			keep(sub.name, lat)
			if busy == nil && strings.HasPrefix(sub.name, "store") {
				median = time.Duration(lat[len(lat)/2])
				busy = tailBusy(median)
			}
		}
		if busy == nil {
			continue
		}
		for _, floor := range []struct {
			name  string
			check func() func(string) error
		}{
			{"busy", func() func(string) error { return busy }},
			// Its working set is made for each run, so that the stores
			// never run beside it on the heap.
			{"busy+mem", func() func(string) error { return tailBusyMem(median) }},
			// The default store's allocations, without the store.
			{"busy+alloc", func() func(string) error { return tailBusyAlloc(median, grown) }},
		} {
			if only.MatchString(floor.name) && (floor.name != "busy+alloc" || grown.n > 0) {
				lat, _, allocated := tailRun(ctx, traceStart, floor.check())
				t.Logf("round %d: %s  heap allocated %.1f MB", round, tailReport(floor.name, lat), float64(allocated)/1e6)
				keep(floor.name, lat)
			}
		}
	}
	t.Logf("better of %d rounds:", *tailRounds)
	for _, name := range order {
		r := best[name]
		line := fmt.Sprintf("%-10s p99.99 %v  max %v", name, r.p9999, r.max)
		if name == "busy" || name == "busy+mem" {
			t.Log(line)
			continue
		}
		for _, floor := range []struct{ name, label string }{{"busy", "floor"}, {"busy+mem", "memory floor"}} {
			if f, ok := best[floor.name]; ok {
				line += fmt.Sprintf("  x %s: p99.99 %.2f  max %.2f", floor.label,
					float64(r.p9999)/float64(f.p9999), float64(r.max)/float64(f.max))
			}
		}
		t.Log(line)
	}
	if only.MatchString("gc") {
		tailGC(t, rule, storeOpts())
	}
}

// tailGC times forced full collections: with nothing of its own on the
// heap, then with a store holding 1,000,000 keys (with the default
// options, then preallocated), then with a map[string]int64 of the same
// keys (each a string of its own, as a map keeps them), and logs each
// store's ratio to the map's (see tailGCTime). It also logs each store's
// live heap per key when filled, and once 1,000,000 more keys have
// churned through it, as in TestTail's runs (a store that allocates as
// keys come may grow its segments again once full, within its budget, as
// sweeps free room in some and new keys land in others).
func tailGC(t *testing.T, rule ratelimit.Rule, opts []ratelimit.Option) {
	t.Helper()
	empty := tailGCTime()
	t.Logf("gc, empty heap: %v", empty)
	var stores []tailGCTimes
	for _, pre := range []bool{false, true} {
		o := opts
		if pre {
			o = append(o[:len(o):len(o)], ratelimit.WithPreallocation())
		}
		before := liveHeap()
		s, err := ratelimit.NewStore(rule, o...)
		if err != nil {
			t.Fatal(err)
		}
		var buf []byte
		check := func(from, to int) {
			for i := from; i < to; i++ {
				buf = tailKey(buf, i)
				if _, err := s.Check(unsafe.String(&buf[0], len(buf)), ratelimit.Unit); err != nil {
					t.Fatal(err)
				}
			}
		}
		check(0, tailKeys)
		filled := float64(liveHeap()-before) / tailKeys
		d := tailGCTime()
		t.Logf("gc, store of %d keys (preallocated %v): %v", s.Len(), pre, d)
		stores = append(stores, d)
		check(tailKeys, 2*tailKeys)
		t.Logf("memory, store bounded at %d keys (preallocated %v): live heap %.1f B a key of its bound when filled, %.1f B once %d more keys churned through it (holding %d)",
			tailKeys, pre, filled, float64(liveHeap()-before)/tailKeys, tailKeys, s.Len())
		runtime.KeepAlive(s)
	}
	m := make(map[string]int64)
	var buf []byte
	for i := range tailKeys {
		buf = tailKey(buf, i)
		m[string(buf)] = int64(i)
	}
	d := tailGCTime()
	t.Logf("gc, map[string]int64 of %d keys: %v", len(m), d)
	runtime.KeepAlive(m)
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	t.Logf("gc, store / map: wall %.3f, cpu %.3f (preallocated: wall %.3f, cpu %.3f; empty heap: wall %.3f, cpu %.3f)",
		ratio(stores[0].wall, d.wall), ratio(stores[0].cpu, d.cpu), ratio(stores[1].wall, d.wall), ratio(stores[1].cpu, d.cpu),
		ratio(empty.wall, d.wall), ratio(empty.cpu, d.cpu))
}

// tailGCTimes is what ten forced full collections took: the median and
// the fastest, in wall time and in the collector's CPU time
// (/cpu/classes/gc/total:cpu-seconds, which other work on the machine
// hardly moves).
type tailGCTimes struct{ wall, wallMin, cpu, cpuMin time.Duration }

func (g tailGCTimes) String() string {
	return fmt.Sprintf("wall %v (fastest %v), gc cpu %v (least %v)", g.wall, g.wallMin, g.cpu, g.cpuMin)
}

// tailGCTime times ten forced full collections, after one to settle.
func tailGCTime() tailGCTimes {
	sample := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	cpu := func() time.Duration {
		metrics.Read(sample)
		return time.Duration(sample[0].Value.Float64() * 1e9)
	}
	runtime.GC()
	var wall, used [10]time.Duration
	for i := range wall {
		c, start := cpu(), time.Now()
		runtime.GC()
		wall[i], used[i] = time.Since(start), cpu()-c
	}
	slices.Sort(wall[:])
	slices.Sort(used[:])
	return tailGCTimes{wall[len(wall)/2], wall[0], used[len(used)/2], used[0]}
}

// tailKey writes TestTail's i'th key into buf and returns it: the keys
// 0 to tailKeys-1 fill a store, the next as many churn it, and every one is
// distinct.
func tailKey(buf []byte, i int) []byte {
	buf = append(buf[:0], "user-"...)
	return strconv.AppendInt(buf, int64(i)*7919%(2*tailKeys), 10)
}

// tailBusy returns a check that computes for about d (less the two clock
// readings that time it), touching no memory but its registers: no lock,
// no allocation, no cache miss, nothing that could pause. Its tail is what the machine and the runtime do to any code
// that runs as long as a check, the floor under a store's: a check taking
// d is interrupted as often as the machine interrupts anything, and the
// longer a check, the more of them land inside one (an atomic add, a
// tenth as long, is hit a tenth as often).
func tailBusy(d time.Duration) func(string) error {
	const probe = 1 << 20
	fastest := time.Duration(math.MaxInt64) // of five probes: one may be interrupted
	var seen uint64                         // the probes' results, so that they are computed
	for range 5 {
		start := time.Now()
		seen |= tailSpin(probe)
		fastest = min(fastest, time.Since(start))
	}
	if seen == 0 {
		panic("tailSpin returned 0")
	}
	clock := time.Duration(math.MaxInt64) // the two readings around a check
	for range 1000 {
		start := time.Now()
		clock = min(clock, time.Since(start))
	}
	n := int(float64(d-clock) / (float64(fastest) / probe))
	return func(string) error {
		if tailSpin(n) == 0 { // never: keeps the loop from being dropped
			return errors.New("busy: the loop came to 0")
		}
		return nil
	}
}

// tailMemBytes is the working set of the memory floor (busy+mem, see
// tailBusyMem): about the heap of a store of tailKeys keys (49 MB with the
// default options, 66 MB preallocated; docs/tail.md).
const tailMemBytes = 64 << 20

// tailMemLines is how many cache lines, at random in tailMemBytes, each
// check of the memory floor writes: about as many as a store's check of a
// new key reaches at random (its shard, its directory entry, its segment's
// header, and its home slot, from which its probe runs on in order).
const tailMemLines = 4

// tailBusyMem returns a check like tailBusy's that first adds 1 to
// tailMemLines words at random (chosen by the key) in a working set of
// tailMemBytes, every page of it written before the first check, and then
// computes for the rest of d: no lock, no allocation, no page fault. Its
// tail is what the machine does to code that runs as long as a check and
// misses the caches and the TLB as a check does, a floor that touches
// memory; the goal is stated against tailBusy's, which touches none.
func tailBusyMem(d time.Duration) func(string) error {
	mem := make([]uint64, tailMemBytes/8)
	for i := range mem {
		mem[i] = uint64(i)
	}
	lines := uint64(len(mem) / 8)
	touch := func(key string) {
		x := uint64(14695981039346656037) // FNV-1a of the key, then an LCG
		for i := range len(key) {
			x = (x ^ uint64(key[i])) * 1099511628211
		}
		for range tailMemLines {
			x = x*6364136223846793005 + 1442695040888963407
			atomic.AddUint64(&mem[(x>>32)%lines*8], 1) // two goroutines share mem
		}
	}
	const probe = 1 << 16
	var key []byte
	fastest := time.Duration(math.MaxInt64) // of five probes, each over probe keys
	for range 5 {
		start := time.Now()
		for i := range probe {
			key = tailKey(key, i)
			touch(unsafe.String(&key[0], len(key)))
		}
		fastest = min(fastest, time.Since(start))
	}
	rest := tailBusy(max(0, d-fastest/probe))
	return func(key string) error {
		touch(key)
		return rest(key)
	}
}

// tailAllocs is what a store allocated in a run: how many times its
// insertions allocated, and the bytes the run allocated in all.
type tailAllocs struct{ n, bytes int64 }

// tailKeptKeyBytes is how much of what busy+alloc allocates it keeps, for
// every check made so far: about a store's memory per key (docs/tail.md).
const tailKeptKeyBytes = 36

// tailBusyAlloc returns a check like tailBusy's that, while the first
// tailKeys checks fill a store, also allocates as the default store did in
// the run a (see TestTail), without the store: a.n arrays of the mean size
// of a.bytes, one every tailKeys/a.n checks, each with every page written
// once (as the store's insertions do, see table.Make), keeping the newest
// up to tailKeptKeyBytes for every check so far and dropping the oldest,
// so that the heap grows, and collections come, about as the store's do
// (the store makes about a fifth of its allocations as it churns, once
// full: segments grow again within its budget as sweeps free room).
// Its tail beside busy's is what allocating as the store does costs,
// whatever the store's table does with the memory.
func tailBusyAlloc(d time.Duration, a tailAllocs) func(string) error {
	rest := tailBusy(d)
	every := max(1, tailKeys/a.n)
	size := max(1, a.bytes/a.n)
	var (
		checks    atomic.Int64
		mu        sync.Mutex // two goroutines share kept
		kept      = make([][]byte, 0, tailKeys/every+1)
		oldest    int // kept[:oldest] are dropped
		keptBytes int64
	)
	return func(key string) error {
		if c := checks.Add(1); c <= tailKeys && c%every == 0 {
			b := make([]byte, size)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			mu.Lock()
			kept = append(kept, b)
			keptBytes += size
			for keptBytes > tailKeptKeyBytes*c {
				keptBytes -= int64(len(kept[oldest]))
				kept[oldest] = nil
				oldest++
			}
			mu.Unlock()
		}
		return rest(key)
	}
}

// tailSpin steps a linear congruential generator n times and returns its
// last value with the low bit set: never 0. It is not inlined, so that the
// compiler cannot know that and drop the loop, nor treat the probes and the
// checks differently.
//
//go:noinline
func tailSpin(n int) uint64 {
	x := uint64(n) | 1
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x | 1
}

// tailRun checks every key once, spread over one goroutine per core, and
// returns every check's latency in nanoseconds, sorted, and apart those of
// the first half of the keys (the fill, before anything is evicted),
// sorted too, and the bytes the checks allocated on the heap. While a
// trace runs, it logs every check over tailSlow in it, with its start
// since traceStart.
func tailRun(ctx context.Context, traceStart time.Time, check func(string) error) ([]int64, []int64, uint64) {
	procs := runtime.GOMAXPROCS(0)
	lat := make([][]int64, procs)
	for g := range lat {
		lat[g] = make([]int64, 0, 2*tailKeys/procs+1)
	}
	tracing := trace.IsEnabled()
	runtime.GC()
	before := metricUint64("/gc/heap/allocs:bytes")
	var wg sync.WaitGroup
	for g := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lat[g]
			buf := make([]byte, 0, 32)
			for i := g; i < 2*tailKeys; i += procs {
				buf = tailKey(buf, i)
				start := time.Now()
				if err := check(unsafe.String(&buf[0], len(buf))); err != nil {
					panic(err)
				}
				d := time.Since(start)
				l = append(l, int64(d))
				if tracing && d > tailSlow {
					trace.Log(ctx, "slow", strconv.FormatInt(int64(start.Sub(traceStart)), 10)+" "+strconv.FormatInt(int64(d), 10))
				}
			}
			lat[g] = l
		}()
	}
	wg.Wait()
	allocated := metricUint64("/gc/heap/allocs:bytes") - before
	var fill []int64
	for g := range lat {
		fill = append(fill, lat[g][:len(lat[g])/2]...)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	slices.Sort(fill)
	return all, fill, allocated
}

// tailWaits records the waits for a shard's lock during a run (see
// ratelimit.SetLockWaits): how long each waited, and how many came to the
// mutex's wait rather than spinning, of all and of those over 100µs.
type tailWaits struct {
	lat        []int64 // the first len(lat) waits, in nanoseconds
	n          atomic.Int64
	locked     atomic.Int64
	longLocked atomic.Int64
}

func newTailWaits() *tailWaits { return &tailWaits{lat: make([]int64, 1<<21)} }

func (w *tailWaits) record(d time.Duration, locked bool) {
	if locked {
		w.locked.Add(1)
		if d > 100*time.Microsecond {
			w.longLocked.Add(1)
		}
	}
	if i := w.n.Add(1) - 1; i < int64(len(w.lat)) {
		w.lat[i] = int64(d)
	}
}

// sorted returns the first len(w.lat) times recorded, sorted.
func (w *tailWaits) sorted() []int64 {
	xs := slices.Clone(w.lat[:min(int(w.n.Load()), len(w.lat))])
	slices.Sort(xs)
	return xs
}

// tailAtLeast returns how many of xs, sorted, are at least d.
func tailAtLeast(xs []int64, d int64) int {
	i, _ := slices.BinarySearch(xs, d)
	return len(xs) - i
}

// report tells how many checks waited for a lock and for how long, beside
// the run's checks (lat, sorted): of the checks at or over the run's
// p99.99, how many waited that long for a lock. A check that waited d took
// at least d, so that is how many of the slowest checks were slow for a
// lock, at the least.
func (w *tailWaits) report(name string, lat []int64) string {
	waits := w.sorted()
	p := int64(tailQuantile(lat, 0.9999))
	return fmt.Sprintf("%-10s lock waits %d (to the mutex %d)  over 20µs %d  over 100µs %d (to the mutex %d)  at or over p99.99 (%v): %d waits, %d checks",
		name, w.n.Load(), w.locked.Load(), tailAtLeast(waits, 20_000), tailAtLeast(waits, 100_000), w.longLocked.Load(), time.Duration(p), tailAtLeast(waits, p), tailAtLeast(lat, p))
}

// allocReport tells, of times recorded as ratelimit.SetInsertAllocs's, how
// many insertions allocated outside their shard's lock and how long that
// took, and how many of those allocations alone took the run's p99.99 or
// more: so many of the slowest checks were slow for their own allocation,
// at the least.
func (w *tailWaits) allocReport(name string, lat []int64) string {
	allocs := w.sorted()
	p := int64(tailQuantile(lat, 0.9999))
	return fmt.Sprintf("%-10s allocations %d  p50 %v  p99 %v  over 20µs %d  over 100µs %d  at or over p99.99 (%v): %d allocations, %d checks",
		name, w.n.Load(), tailQuantile(allocs, 0.5), tailQuantile(allocs, 0.99), tailAtLeast(allocs, 20_000), tailAtLeast(allocs, 100_000),
		time.Duration(p), tailAtLeast(allocs, p), tailAtLeast(lat, p))
}

// tailQuantile returns the p quantile of sorted latencies.
func tailQuantile(lat []int64, p float64) time.Duration {
	return time.Duration(lat[min(len(lat)-1, int(p*float64(len(lat))))])
}

func tailReport(name string, lat []int64) string {
	q := func(p float64) time.Duration { return tailQuantile(lat, p) }
	over := func(d time.Duration) int { // checks slower than d
		i, _ := slices.BinarySearch(lat, int64(d)+1)
		return len(lat) - i
	}
	return fmt.Sprintf("%-10s checks %d  p50 %v  p99 %v  p99.9 %v  p99.99 %v  max %v  >100µs %d  >1ms %d",
		name, len(lat), q(0.5), q(0.99), q(0.999), q(0.9999), time.Duration(lat[len(lat)-1]),
		over(100*time.Microsecond), over(time.Millisecond))
}

// tailMap is the store a user would write without this package: a Go map
// of theoretical arrival times behind one mutex, dropping an arbitrary key
// when full.
type tailMap struct {
	mu       sync.Mutex
	m        map[string]int64
	max      int
	interval int64 // nanoseconds per request
	burst    int64 // nanoseconds of burst
	origin   time.Time
}

func newTailMap(max int, r ratelimit.GCRA) *tailMap {
	iv := int64(r.Rate.Per) / r.Rate.Count
	return &tailMap{m: make(map[string]int64), max: max, interval: iv, burst: iv * r.Burst, origin: time.Now()}
}

func (m *tailMap) check(key string) error {
	now := int64(time.Since(m.origin))
	m.mu.Lock()
	tat, ok := m.m[key]
	if !ok && len(m.m) >= m.max {
		for k := range m.m {
			delete(m.m, k)
			break
		}
	}
	tat = max(tat, now) + m.interval
	if tat-now <= m.burst {
		m.m[strings.Clone(key)] = tat // the map keeps the key it is given
	}
	m.mu.Unlock()
	return nil
}
