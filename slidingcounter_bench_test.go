package ratelimit_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
)

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
