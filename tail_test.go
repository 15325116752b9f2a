package ratelimit_test

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
)

var (
	tail       = flag.Bool("tail", false, "run TestTail, the fill-and-churn latency harness (slow)")
	tailShards = flag.Int("tailshards", 0, "TestTail: the store's WithShards (0: the default)")
	tailOnly   = flag.String("tailonly", "", "TestTail: run only the subjects whose names match this regular expression")
)

// tailKeys is the bound of the stores in TestTail; twice as many distinct
// keys are checked, the first half filling a store from empty and the second
// churning through eviction.
const tailKeys = 1_000_000

// TestTail measures the latency of every Check while one goroutine per core
// fills a store from empty to its bound of 1,000,000 keys and then checks
// 1,000,000 more, each new key evicting another, and reports its quantiles
// (over all checks, and over the fill's alone), for a store that allocates
// as it fills, for one built WithPreallocation and for a preallocated rule
// set of two plans, beside those of a mutex-guarded Go map bounded the same
// way (the store a user would otherwise write), of an atomic add, and of a
// loop as long as the preallocated store's median check (busy, see
// tailBusy), which does no work that could pause: its tail is the
// machine's (preemption, the runtime), the floor under the others. It
// asserts nothing about time: run it with
//
//	go test -run TestTail -tail -v -count 3 .
//
// -tailshards sets the stores' shards, -tailonly picks subjects by name
// (busy needs store+pre).
func TestTail(t *testing.T) {
	if !*tail {
		t.Skip("a latency harness: run with -tail")
	}
	keys := make([]string, 2*tailKeys)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919%len(keys))
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
		t.Logf("store: %d shards", s.Stats().Shards)
		return func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err }
	}
	subjects := []struct {
		name  string
		check func(string) error
	}{
		{"store", store()},
		{"store+pre", store(ratelimit.WithPreallocation())},
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
		}()},
		{"map+mutex", newTailMap(tailKeys, rule).check},
		{"atomic", func() func(string) error {
			var n atomic.Int64
			return func(string) error { n.Add(1); return nil }
		}()},
	}
	only, err := regexp.Compile(*tailOnly)
	if err != nil {
		t.Fatal(err)
	}
	var median time.Duration // store+pre's
	for _, sub := range subjects {
		if !only.MatchString(sub.name) {
			continue
		}
		lat, fill := tailRun(keys, sub.check)
		t.Log(tailReport(sub.name, lat))
		t.Log(tailReport(sub.name+" fill", fill))
		if sub.name == "store+pre" {
			median = time.Duration(lat[len(lat)/2])
		}
	}
	if median == 0 || !only.MatchString("busy") {
		return
	}
	lat, _ := tailRun(keys, tailBusy(median))
	t.Log(tailReport("busy", lat))
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
// sorted too.
func tailRun(keys []string, check func(string) error) ([]int64, []int64) {
	procs := runtime.GOMAXPROCS(0)
	lat := make([][]int64, procs)
	for g := range lat {
		lat[g] = make([]int64, 0, len(keys)/procs+1)
	}
	runtime.GC()
	var wg sync.WaitGroup
	for g := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lat[g]
			for i := g; i < len(keys); i += procs {
				start := time.Now()
				if err := check(keys[i]); err != nil {
					panic(err)
				}
				l = append(l, int64(time.Since(start)))
			}
			lat[g] = l
		}()
	}
	wg.Wait()
	var fill []int64
	for g := range lat {
		fill = append(fill, lat[g][:len(lat[g])/2]...)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	slices.Sort(fill)
	return all, fill
}

func tailReport(name string, lat []int64) string {
	q := func(p float64) time.Duration { return time.Duration(lat[min(len(lat)-1, int(p*float64(len(lat))))]) }
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
		m.m[key] = tat
	}
	m.mu.Unlock()
	return nil
}
