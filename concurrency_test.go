package ratelimit_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// hundredRules are rules with a capacity of 100 that earn nothing back
// within a test's lifetime: one of every algorithm, and a GCRA whose pace
// is not a whole number of nanoseconds per milli-unit.
func hundredRules() map[string]ratelimit.Rule {
	slow := ratelimit.Rate{Count: 1, Per: 24 * time.Hour}
	rules := map[string]ratelimit.Rule{
		"GCRA/fractional": ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * 24 * time.Hour}, Burst: 100},
	}
	for _, a := range testedAlgorithms {
		rules[a.name] = a.rule(settings{rate: slow, capacity: 100, window: 100 * 365 * 24 * time.Hour})
	}
	return rules
}

func TestConcurrentChecksAdmitExactlyTheLimit(t *testing.T) {
	clocks := map[string]func() ratelimit.Clock{
		"ManualClock": func() ratelimit.Clock { return ratelimit.NewManualClock(time.Hour) },
		"SystemClock": ratelimit.SystemClock,
	}
	for name, rule := range hundredRules() {
		for clockName, clock := range clocks {
			t.Run(name+"/"+clockName, func(t *testing.T) {
				lim, err := ratelimit.New(rule, ratelimit.WithClock(clock()))
				require.NoError(t, err)
				assert.Equal(t, int64(100), checkConcurrently(t, lim, nil))
			})
		}
	}
}

// checkConcurrently starts 1000 goroutines at once, each of which calls
// before (if not nil) with its index and then checks a unit on lim, and
// returns how many of the checks were admitted once all have finished.
func checkConcurrently(t *testing.T, lim ratelimit.Limiter, before func(i int)) int64 {
	var admitted atomic.Int64
	var start, done sync.WaitGroup
	start.Add(1)
	for i := 0; i < 1000; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			if before != nil {
				before(i)
			}
			d, err := lim.Check(ratelimit.Unit)
			assert.NoError(t, err)
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	start.Done()
	waitGroup(t, &done, "1000 concurrent checks to finish")
	return admitted.Load()
}

func TestCheckDoesNotAllocate(t *testing.T) {
	for name, rule := range hundredRules() {
		for clockName, clock := range map[string]ratelimit.Clock{
			"ManualClock": ratelimit.NewManualClock(0),
			"SystemClock": ratelimit.SystemClock(),
		} {
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clock))
			require.NoError(t, err)
			allocs := testing.AllocsPerRun(200, func() {
				_, _ = lim.Check(ratelimit.Unit)
			})
			assert.Zero(t, allocs, "%s/%s", name, clockName)
		}
	}
}
