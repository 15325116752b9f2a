package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	uber "go.uber.org/ratelimit"
)

// paces are the rates BenchmarkPace puts this library's single-key GCRA,
// token bucket and leaky bucket at, by the shape of the time one
// milli-unit takes in lowest terms: whole nanoseconds (n = 1), a small
// denominator (n = 7) and large ones (n = 1,000,003). Each burst admits
// every check a benchmark sends, except where a rule's span (Burst/Rate
// below MaxTime) bounds it: admitted/op shows that.
var paces = []struct {
	name  string
	rate  ratelimit.Rate
	burst int64
}{
	{"1e6-per-s", ratelimit.PerSecond(allowRate), allowBurst},
	{"7-per-3us", ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, allowBurst},
	{"1000003-per-s", ratelimit.PerSecond(1_000_003), allowBurst},
	// 1e12 units at 1,000,003 per hour take 114 years: under MaxTime.
	{"1000003-per-h", ratelimit.PerHour(1_000_003), allowBurst},
	// 7 per 3 h bounds the burst at 2.99e6: it runs out within a
	// benchmark, so this one is checked at cost 1 milli-unit.
	{"7-per-3h", ratelimit.Rate{Count: 7, Per: 3 * time.Hour}, 2_900_000},
}

// BenchmarkPace checks one key over and over, as BenchmarkSingle's allowed
// and parallel scenarios do, for this library's GCRA, TokenBucket and
// LeakyBucket at each of paces, beside uber's Take (at 1e9 per second, so
// that it almost never sleeps): the ratios that matter are each subject's
// ns/op over uber's in the same run.
func BenchmarkPace(b *testing.B) {
	type subject struct {
		name string
		new  func() Check
	}
	subjects := []subject{{"uber", func() Check {
		lim := uber.New(1_000_000_000, uber.WithClock(countingClock{&uberSleeps}))
		return func() bool { lim.Take(); return true }
	}}}
	for _, pc := range paces {
		cost := ratelimit.Unit
		if pc.name == "7-per-3h" {
			cost = 1
		}
		for _, alg := range []struct {
			name string
			rule func() ratelimit.Rule
		}{
			{"GCRA", func() ratelimit.Rule { return ratelimit.GCRA{Rate: pc.rate, Burst: pc.burst} }},
			{"TokenBucket", func() ratelimit.Rule { return ratelimit.TokenBucket{Rate: pc.rate, Burst: pc.burst} }},
			{"LeakyBucket", func() ratelimit.Rule { return ratelimit.LeakyBucket{Rate: pc.rate, Capacity: pc.burst} }},
		} {
			subjects = append(subjects, subject{fmt.Sprintf("%s@%s", alg.name, pc.name), func() Check {
				lim, err := ratelimit.New(alg.rule(), ratelimit.WithClock(ratelimit.SystemClock()))
				if err != nil {
					panic(err)
				}
				return func() bool {
					d, _ := lim.Check(cost)
					return d.Allowed
				}
			}})
		}
	}
	for _, parallel := range []bool{false, true} {
		scenario := "serial"
		if parallel {
			scenario = "parallel"
		}
		for _, subj := range shuffled(subjects) {
			b.Run(scenario+"/"+subj.name, func(b *testing.B) {
				check := subj.new()
				sleeps := uberSleeps.Load()
				runChecks(b, parallel, check)
				if subj.name == "uber" {
					b.ReportMetric(float64(uberSleeps.Load()-sleeps)/float64(b.N), "sleeps/op")
				}
			})
		}
	}
}
