package ratelimit_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// Rates whose pace is not a whole number of nanoseconds per milli-unit
// but whose denominator n (in lowest terms) fits the lock-free word, and
// the bits the fraction takes.
var packedRates = []struct {
	rate ratelimit.Rate
	bits int
}{
	{ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, 3},  // n = 7
	{ratelimit.Rate{Count: 7, Per: 3 * time.Second}, 3},       // n = 7
	{ratelimit.Rate{Count: 13, Per: 7 * time.Microsecond}, 4}, // n = 13
	{ratelimit.Rate{Count: 3, Per: time.Second}, 2},           // n = 3
	{ratelimit.Rate{Count: 251, Per: time.Microsecond}, 8},    // n = 251: a horizon of 2^55 ns
}

func TestSingleKeyPath(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule ratelimit.Rule
		want string
	}{
		{"GCRA 10/s", ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}, "lock-free"},
		{"GCRA 7 per 3µs", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Burst: 5}, "lock-free"},
		{"TokenBucket 7 per 3µs", ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Burst: 5}, "lock-free"},
		{"GCRA 251/µs", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 251, Per: time.Microsecond}, Burst: 5}, "lock-free"},
		// n = 257 needs 9 bits.
		{"GCRA 257/µs", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 257, Per: time.Microsecond}, Burst: 5}, "mutex"},
		{"GCRA 1000003/h", ratelimit.GCRA{Rate: ratelimit.PerHour(1_000_003), Burst: 5}, "mutex"},
		{"LeakyBucket 10/s", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 5}, "lock-free"},
		{"LeakyBucket 7 per 3µs", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Capacity: 5, Delay: 2}, "lock-free"},
		{"LeakyBucket 1000003/h", ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1_000_003), Capacity: 5}, "mutex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := ratelimit.New(tc.rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
			require.NoError(t, err)
			assert.Equal(t, tc.want, ratelimit.SingleKeyPath(lim))
		})
	}
}

// A lock-free limiter at a fractional pace (a GCRA, a token bucket or a
// leaky bucket) decides as the model does, on
// traces that run past the word's horizon (leaps of up to two years pass
// the 2^55 ns of a pace of 8 fraction bits) and so also move the state
// under the mutex, and with settlements into debt.
func TestPackedGCRAMatchesModel(t *testing.T) {
	for _, name := range []string{"GCRA", "TokenBucket", "LeakyBucket"} {
		a := testedAlgorithmNamed(name)
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				pr := rapid.SampledFrom(packedRates).Draw(t, "rate")
				s := settings{rate: pr.rate, capacity: drawCapacity(t), name: drawName(t)}
				runModel(t, modelCase{rule: a.rule(s), model: a.model(s), scale: s.rate.Per,
					valid: true, name: s.name, window: a.decisionWindow(s)})
			})
		})
	}
}

// The move under the mutex: a limiter built at 0 at 251 per µs (a horizon
// of 2^55 ns) checked just before it, with a burst that ends past it.
func TestPackedGCRAMovesPastItsHorizon(t *testing.T) {
	const horizon = int64(1) << 55
	rate := ratelimit.Rate{Count: 251, Per: time.Microsecond}
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(ratelimit.GCRA{Rate: rate, Burst: 100}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	model := refmodel.NewBucket(rate, 100)
	clk.Set(time.Duration(horizon - 200))
	for i := 0; i < 101; i++ {
		got, err := lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		want := model.Step(horizon-200, int64(ratelimit.Unit))
		want.Window = bucketWindow(rate, 100)
		require.Equal(t, want, got, "check %d", i)
	}
	assert.Equal(t, "moved", ratelimit.SingleKeyPath(lim))
	// Refund, Peek, Settle and Reset on the moved state.
	g, err := ratelimit.Refund(lim, ratelimit.Unit, time.Duration(horizon-200))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Unit, g)
	d, err := ratelimit.Peek(lim, ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	_, settled, err := ratelimit.Settle(lim, ratelimit.Unit, 3*ratelimit.Unit, time.Duration(horizon-200))
	require.NoError(t, err)
	assert.Equal(t, 3*ratelimit.Unit, settled)
	d, err = lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "in debt")
	require.NoError(t, ratelimit.Reset(lim))
	d, err = lim.Check(100 * ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "fresh after Reset")
	assert.Equal(t, "moved", ratelimit.SingleKeyPath(lim))
}

// Concurrent checks at fractional paces admit exactly the burst (the
// capacity), on the
// packed word and across the move under the mutex (clocks set so that the
// TATs the burst writes cross the horizon half way).
func TestPackedGCRAConcurrentChecksAdmitExactlyTheBurst(t *testing.T) {
	const horizon = int64(1) << 55
	for _, tc := range []struct {
		name  string
		rate  ratelimit.Rate
		start int64
		moved bool
	}{
		{"7 per 3 days", ratelimit.Rate{Count: 7, Per: 3 * 24 * time.Hour}, int64(time.Hour), false},
		{"7 per 3µs, frozen", ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, int64(time.Hour), false},
		// 100 units at 251 per µs take 398.4 ns: half of them fit.
		{"251 per µs, across the horizon", ratelimit.Rate{Count: 251, Per: time.Microsecond}, horizon - 200, true},
	} {
		for _, name := range []string{"GCRA", "TokenBucket", "LeakyBucket"} {
			a := testedAlgorithmNamed(name)
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(a.rule(settings{rate: tc.rate, capacity: 100}), ratelimit.WithClock(clk))
				require.NoError(t, err)
				clk.Set(time.Duration(tc.start))
				var admitted atomic.Int64
				var start, done sync.WaitGroup
				start.Add(1)
				for i := 0; i < 1000; i++ {
					done.Add(1)
					go func() {
						defer done.Done()
						start.Wait()
						d, err := lim.Check(ratelimit.Unit)
						assert.NoError(t, err)
						if d.Allowed {
							admitted.Add(1)
						}
					}()
				}
				start.Done()
				waitGroup(t, &done, "1000 concurrent checks to finish")
				assert.Equal(t, int64(100), admitted.Load())
				want := "lock-free"
				if tc.moved {
					want = "moved"
				}
				assert.Equal(t, want, ratelimit.SingleKeyPath(lim))
			})
		}
	}
}

// A lock-free leaky bucket with a Delay decides, Delay included, as a
// Store (which keeps its states under shard locks) does on the same trace.
func TestPackedLeakyBucketDelayMatchesStore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pr := rapid.SampledFrom(packedRates).Draw(t, "rate")
		capacity := drawCapacity(t)
		rule := ratelimit.LeakyBucket{Rate: pr.rate, Capacity: capacity,
			Delay: rapid.Int64Range(0, capacity).Draw(t, "delay")}
		clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
		lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		require.Equal(t, "lock-free", ratelimit.SingleKeyPath(lim))
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		capMilli := capacity * int64(ratelimit.Unit)
		actions := traceActions(clk, pr.rate.Per)
		actions["check"] = func(t *rapid.T) {
			cost := ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, "cost"))
			peek, err := ratelimit.Peek(lim, cost)
			require.NoError(t, err)
			got, err := lim.Check(cost)
			require.NoError(t, err)
			want, err := store.Check("k", cost)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, want, peek, "the look decides as the check does")
		}
		actions["settle"] = func(t *rapid.T) {
			charged := ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, "charged"))
			actual := ratelimit.Units(rapid.Int64Range(1, 3*capMilli).Draw(t, "actual"))
			at := time.Duration(rapid.Int64Range(0, max(int64(clk.Now()), 0)).Draw(t, "at"))
			got, gs, err := ratelimit.Settle(lim, charged, actual, at)
			require.NoError(t, err)
			want, ws, err := store.Settle("k", charged, actual, at)
			require.NoError(t, err)
			require.Equal(t, ws, gs, "settled")
			require.Equal(t, want, got)
		}
		t.Repeat(actions)
	})
}

// At a pace of whole nanoseconds a Check takes the word without a
// fraction; a clock set back to before the limiter was built makes it
// write a TAT before the word's base, which moves the state under the
// mutex, and the decisions still match the model's.
func TestWholeNanosecondGCRAMovesOnAClockSetBack(t *testing.T) {
	rate := ratelimit.Rate{Count: 10, Per: time.Second}
	for _, name := range []string{"GCRA", "TokenBucket"} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(time.Hour)
			var rule ratelimit.Rule = ratelimit.GCRA{Rate: rate, Burst: 3}
			if name == "TokenBucket" {
				rule = ratelimit.TokenBucket{Rate: rate, Burst: 3}
			}
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			assert.Equal(t, "lock-free", ratelimit.SingleKeyPath(lim))
			model := refmodel.NewBucket(rate, 3)
			clk.Set(time.Minute)
			for i := 0; i < 5; i++ {
				got, err := lim.Check(ratelimit.Unit)
				require.NoError(t, err)
				want := model.Step(int64(time.Minute), int64(ratelimit.Unit))
				want.Window = bucketWindow(rate, 3)
				require.Equal(t, want, got, "check %d", i)
			}
			assert.Equal(t, "moved", ratelimit.SingleKeyPath(lim))
		})
	}
}
