package ratelimit_test

import (
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
)

// BenchmarkStoreCheckSlidingCounter checks existing keys, as
// BenchmarkStoreCheck does, in a store of a SlidingCounter whose keys are
// kept in 16 bytes (the largest such Limit) and in one whose keys take 24
// (a Limit above it; BenchmarkStoreCheck's rule). Both admit nearly
// everything the benchmark sends.
func BenchmarkStoreCheckSlidingCounter(b *testing.B) {
	keys, order := storeBenchKeys()
	keys = keys[:benchStoreKeys]
	for _, limit := range []int64{math.MaxUint32 / 2000, 1_000_000_000_000} {
		var s *ratelimit.Store
		fill := func(b *testing.B) *ratelimit.Store {
			if s == nil {
				var err error
				s, err = ratelimit.NewStore(ratelimit.SlidingCounter{Limit: limit, Window: time.Minute}, ratelimit.WithMaxKeys(benchMaxKeys))
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
		name := "limit=" + strconv.FormatInt(limit, 10)
		b.Run(name+"/serial", func(b *testing.B) {
			s := fill(b)
			b.ReportAllocs()
			b.ResetTimer()
			var allowed int64
			for i := 0; i < b.N; i++ {
				d, _ := s.Check(keys[order[i%len(order)]], ratelimit.Unit)
				if d.Allowed {
					allowed++
				}
			}
			benchSink.Add(allowed)
		})
		b.Run(name+"/parallel", func(b *testing.B) {
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
	}
}

// BenchmarkCheckSlidingCounter is the single-key Check of a SlidingCounter
// kept in 16 bytes (the largest such Limit) and in 24 (a Limit above it),
// on a ManualClock: the step alone, with no cache misses and no clock read.
func BenchmarkCheckSlidingCounter(b *testing.B) {
	for _, limit := range []int64{math.MaxUint32 / 2000, 1_000_000_000_000} {
		b.Run("limit="+strconv.FormatInt(limit, 10), func(b *testing.B) {
			lim, err := ratelimit.New(ratelimit.SlidingCounter{Limit: limit, Window: time.Minute},
				ratelimit.WithClock(ratelimit.NewManualClock(0)))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_, _ = lim.Check(ratelimit.Unit)
			}
		})
	}
}
