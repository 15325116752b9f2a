package ratelimit_test

import (
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
)

// benchRules are the single-key benchmark subjects: mostly-allowed rules
// (a burst far larger than a benchmark can spend), so Check takes its admit
// path. One of every algorithm, and a GCRA whose pace is not a whole number
// of nanoseconds per milli-unit.
func benchRules() []benchSubject {
	rate, odd := ratelimit.PerSecond(1_000_000), ratelimit.Rate{Count: 999_983, Per: time.Second}
	const burst = 1_000_000_000_000
	var rules []benchSubject
	for _, a := range testedAlgorithms {
		s := settings{rate: rate, capacity: burst, window: time.Second}
		if a.logState {
			// On the system clock a millisecond holds a few ten thousand
			// admissions, each logged at its own instant: the log's
			// steady state.
			s.capacity, s.window = 1_000_000, time.Millisecond
		}
		rules = append(rules, benchSubject{a.name, a.rule(s)})
	}
	return append(rules, benchSubject{"GCRA/fractional", ratelimit.GCRA{Rate: odd, Burst: burst}})
}

// BenchmarkClock is the floor: one monotonic clock read, as SystemClock does.
func BenchmarkClock(b *testing.B) {
	clk := ratelimit.SystemClock()
	b.ReportAllocs()
	var sink time.Duration
	for b.Loop() {
		sink += clk.Now()
	}
	_ = sink
}

func BenchmarkCheck(b *testing.B) {
	for _, br := range benchRules() {
		for _, c := range []struct {
			name  string
			clock func() ratelimit.Clock
		}{
			{"SystemClock", ratelimit.SystemClock},
			{"ManualClock", func() ratelimit.Clock { return ratelimit.NewManualClock(0) }},
		} {
			b.Run(br.name+"/"+c.name+"/serial", func(b *testing.B) {
				lim, err := ratelimit.New(br.rule, ratelimit.WithClock(c.clock()))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					_, _ = lim.Check(ratelimit.Unit)
				}
			})
			b.Run(br.name+"/"+c.name+"/parallel", func(b *testing.B) {
				lim, err := ratelimit.New(br.rule, ratelimit.WithClock(c.clock()))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						_, _ = lim.Check(ratelimit.Unit)
					}
				})
			})
		}
	}
}
