package ratelimit_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
)

// The store's benchmarks run against a bare map[string]int64 on the same
// pre-generated keys, in the same pre-computed random order, so that the
// ratio of the two is the cost of the store over the hash lookup it cannot
// avoid. Compare the ratios from one run: run with
//
//	go test -run '^$' -bench 'Store' -count 5
const (
	benchStoreKeys = 1_000_000 // keys checked in the Check benchmarks
	benchMaxKeys   = 1 << 21   // the bound in the benchmarks: above every key set
)

var benchKeys struct {
	once  sync.Once
	keys  []string // 1,400,000 distinct IPv4 addresses in a random order
	order []int32  // a random permutation of [0, benchStoreKeys)
}

// storeBenchKeys returns the key set and the access order, made once.
func storeBenchKeys() ([]string, []int32) {
	benchKeys.once.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		seen := make(map[uint32]bool, 1_400_000)
		keys := make([]string, 0, 1_400_000)
		for len(keys) < cap(keys) {
			ip := r.Uint32()
			if seen[ip] {
				continue
			}
			seen[ip] = true
			keys = append(keys, strconv.Itoa(int(ip>>24))+"."+strconv.Itoa(int(ip>>16&255))+"."+
				strconv.Itoa(int(ip>>8&255))+"."+strconv.Itoa(int(ip&255)))
		}
		benchKeys.keys = keys
		benchKeys.order = make([]int32, benchStoreKeys)
		for i := range benchKeys.order {
			benchKeys.order[i] = int32(i)
		}
		r.Shuffle(len(benchKeys.order), func(i, j int) {
			benchKeys.order[i], benchKeys.order[j] = benchKeys.order[j], benchKeys.order[i]
		})
	})
	return benchKeys.keys, benchKeys.order
}

// benchSubject is a named rule a benchmark runs against.
type benchSubject struct {
	name string
	rule ratelimit.Rule
}

// storeBenchRules are the store's benchmark subjects: rules that admit
// nearly everything a benchmark sends (the common path of a limiter).
func storeBenchRules() []benchSubject {
	const big = 1_000_000_000_000
	var rules []benchSubject
	for _, a := range testedAlgorithms {
		s := settings{rate: ratelimit.PerSecond(1_000_000), capacity: big, window: time.Minute}
		if a.logState {
			s.window = time.Second // the log keeps every admission in its window
		}
		rules = append(rules, benchSubject{a.name, a.rule(s)})
	}
	return rules
}

// storeMemoryRules are the rules the memory benchmark fills stores with:
// slow enough that no key is fresh again before the benchmark ends, so that
// a bounded store is full of live keys.
func storeMemoryRules() []benchSubject {
	var rules []benchSubject
	for _, a := range testedAlgorithms {
		rules = append(rules, benchSubject{a.name, a.rule(settings{rate: ratelimit.PerHour(1), capacity: 10, window: time.Hour})})
	}
	return rules
}

var benchSink atomic.Int64

// BenchmarkStoreCheck checks existing keys: "map" is the bare map lookup,
// "map+clock" the same plus one system clock read, the others a Store's
// Check under each rule, with the system clock unless named otherwise.
func BenchmarkStoreCheck(b *testing.B) {
	keys, order := storeBenchKeys()
	keys = keys[:benchStoreKeys]
	b.Run("map/serial", func(b *testing.B) { benchMapSerial(b, keys, keys, order, false) })
	b.Run("map/parallel", func(b *testing.B) {
		m := make(map[string]int64)
		for i, k := range keys {
			m[k] = int64(i)
		}
		var start atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(start.Add(7919)) % len(order)
			var sum int64
			for pb.Next() {
				sum += m[keys[order[i]]]
				if i++; i == len(order) {
					i = 0
				}
			}
			benchSink.Add(sum)
		})
	})
	// The bare map plus one read of the system clock: the floor for any
	// limiter that reads the clock on every call. On x86 the clock read is
	// ordered (a fenced RDTSC), so the loads of one iteration can no longer
	// overlap those of the next, as they do in the bare map loop.
	clk := ratelimit.SystemClock()
	b.Run("map+clock/serial", func(b *testing.B) { benchMapSerial(b, keys, keys, order, true) })
	b.Run("map+clock/parallel", func(b *testing.B) {
		m := make(map[string]int64)
		for i, k := range keys {
			m[k] = int64(i)
		}
		var start atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(start.Add(7919)) % len(order)
			var sum int64
			for pb.Next() {
				sum += m[keys[order[i]]] + int64(clk.Now())
				if i++; i == len(order) {
					i = 0
				}
			}
			benchSink.Add(sum)
		})
	})
	type subject struct {
		name  string
		rule  ratelimit.Rule
		clock ratelimit.Clock
	}
	var subjects []subject
	for _, br := range storeBenchRules() {
		subjects = append(subjects, subject{br.name, br.rule, ratelimit.SystemClock()})
		if br.name == "GCRA" || br.name == "TokenBucket" {
			// A ManualClock reads an atomic: no ordered clock read.
			subjects = append(subjects, subject{br.name + "/ManualClock", br.rule, ratelimit.NewManualClock(0)})
		}
		if br.name == "SlidingCounter" {
			// The rule's Limit keeps its keys in 24 bytes; the largest Limit
			// whose keys take 16.
			sc := ratelimit.SlidingCounter{Limit: math.MaxUint32 / 2000, Window: time.Minute}
			subjects = append(subjects, subject{br.name + "/16-byte", sc, ratelimit.SystemClock()})
		}
	}
	for _, br := range subjects {
		var s *ratelimit.Store
		fill := func(b *testing.B) *ratelimit.Store {
			if s == nil {
				var err error
				s, err = ratelimit.NewStore(br.rule, ratelimit.WithMaxKeys(benchMaxKeys), ratelimit.WithClock(br.clock))
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					if _, err := s.Check(k, ratelimit.Unit); err != nil {
						b.Fatal(err)
					}
				}
			}
			return s
		}
		b.Run(br.name+"/serial", func(b *testing.B) { benchStoreSerial(b, fill(b), keys, order) })
		b.Run(br.name+"/parallel", func(b *testing.B) {
			s := fill(b)
			var start atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(start.Add(7919)) % len(order)
				var allowed int64
				for pb.Next() {
					d, _ := s.Check(keys[order[i]], ratelimit.Unit)
					if d.Allowed {
						allowed++
					}
					if i++; i == len(order) {
						i = 0
					}
				}
				benchSink.Add(allowed)
			})
		})
		if s != nil && s.Stats().Evictions != 0 {
			b.Fatalf("%s: %d evictions during the benchmark", br.name, s.Stats().Evictions)
		}
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

// BenchmarkStoreHotKey checks one key of a store from every core at once:
// the case a wait that spun on every holder of a shard's lock would slow
// (see storeShard.hold), as the checks would hand the lock and the key's
// slot to each other's core at every check.
func BenchmarkStoreHotKey(b *testing.B) {
	s, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 1 << 40, Window: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Check("hot", ratelimit.Unit); err != nil {
				panic(err)
			}
		}
	})
}

// BenchmarkStoreMemory reports the heap a store takes per key held (B/key),
// after 1,000,000 and 1,400,000 distinct keys: in a store bounded at 2^21
// (room for all), in one bounded at 1,000,000 (the default: the last
// 400,000 evict), and for a bare map[string]int64 of the same keys. The
// caller's key strings are not counted (the benchmark holds every key
// before it starts): a map keeps them, where a store keeps copies of their
// bytes in its arenas, which B/key counts. keyB/key is the keys' mean
// length, what those copies hold; B/key less keyB/key is what the store
// itself costs a key.
func BenchmarkStoreMemory(b *testing.B) {
	allKeys, _ := storeBenchKeys()
	for _, n := range []int{1_000_000, 1_400_000} {
		keys := allKeys[:n]
		nk := "/keys=" + strconv.Itoa(n)
		keyBytes := 0
		for _, k := range keys {
			keyBytes += len(k)
		}
		meanLen := float64(keyBytes) / float64(n)
		b.Run("map"+nk, func(b *testing.B) {
			var perKey float64
			for i := 0; i < b.N; i++ {
				before := liveHeap()
				m := make(map[string]int64)
				for i, k := range keys {
					m[k] = int64(i)
				}
				perKey = float64(liveHeap()-before) / float64(len(m))
				runtime.KeepAlive(m)
			}
			b.ReportMetric(perKey, "B/key")
		})
		for _, br := range storeMemoryRules() {
			for _, bound := range []int{benchMaxKeys, ratelimit.DefaultMaxKeys} {
				if bound >= n && bound != benchMaxKeys {
					continue // the same as the room-for-all case
				}
				name := br.name + nk
				if bound != benchMaxKeys {
					name += "/bound=" + strconv.Itoa(bound)
				}
				b.Run(name, func(b *testing.B) {
					var perKey float64
					for i := 0; i < b.N; i++ {
						before := liveHeap()
						s, err := ratelimit.NewStore(br.rule, ratelimit.WithMaxKeys(bound))
						if err != nil {
							b.Fatal(err)
						}
						for _, k := range keys {
							if _, err := s.Check(k, ratelimit.Unit); err != nil {
								b.Fatal(err)
							}
						}
						perKey = float64(liveHeap()-before) / float64(s.Len())
						runtime.KeepAlive(s)
					}
					b.ReportMetric(perKey, "B/key")
					b.ReportMetric(meanLen, "keyB/key")
				})
			}
		}
	}
}

// BenchmarkStoreCheckCopies is BenchmarkStoreCheck's map+clock/serial and
// GCRA/serial, checked with copies of the keys the map and the store were
// filled with (made before the benchmark starts), as a server's keys come
// in strings of their own. Checked with the very strings it holds, a map
// (and a store that kept its callers' strings) finds the key's bytes equal
// by their address without reading them; a store that keeps its own copy
// reads them, one more cache miss. With copies, every subject reads them.
func BenchmarkStoreCheckCopies(b *testing.B) {
	keys, order := storeBenchKeys()
	keys = keys[:benchStoreKeys]
	copies := make([]string, len(keys))
	for i, k := range keys {
		copies[i] = strings.Clone(k)
	}
	b.Run("map+clock/serial", func(b *testing.B) { benchMapSerial(b, keys, copies, order, true) })
	b.Run("GCRA/serial", func(b *testing.B) {
		var rule ratelimit.Rule
		for _, br := range storeBenchRules() {
			if br.name == "GCRA" {
				rule = br.rule
			}
		}
		s, err := ratelimit.NewStore(rule, ratelimit.WithMaxKeys(benchMaxKeys))
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			if _, err := s.Check(k, ratelimit.Unit); err != nil {
				b.Fatal(err)
			}
		}
		benchStoreSerial(b, s, copies, order)
	})
}

// benchMapSerial fills a map with keys and looks up lookups[order[i]]
// (keys, or copies of them), each with a clock read if clock is set, from
// one goroutine.
func benchMapSerial(b *testing.B, keys, lookups []string, order []int32, clock bool) {
	clk := ratelimit.SystemClock()
	m := make(map[string]int64)
	for i, k := range keys {
		m[k] = int64(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var sum int64
	for i := 0; i < b.N; i++ {
		sum += m[lookups[order[i%len(order)]]]
		if clock {
			sum += int64(clk.Now())
		}
	}
	benchSink.Add(sum)
}

// benchStoreSerial checks lookups[order[i]] in s, filled, from one
// goroutine.
func benchStoreSerial(b *testing.B, s *ratelimit.Store, lookups []string, order []int32) {
	b.ReportAllocs()
	b.ResetTimer()
	var allowed int64
	for i := 0; i < b.N; i++ {
		d, _ := s.Check(lookups[order[i%len(order)]], ratelimit.Unit)
		if d.Allowed {
			allowed++
		}
	}
	benchSink.Add(allowed)
}
