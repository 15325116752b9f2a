package ratelimit_test

import (
	"math/big"
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
				assert.Equal(t, int64(100), checkConcurrently(t, lim, nil))
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

// Rates whose pace's denominator n (in lowest terms) is too wide for the
// lock-free word: their single-key limiters keep their state under the
// mutex from the start.
var wideRates = []ratelimit.Rate{
	ratelimit.PerHour(1_000_003),                   // n = 1,000,003
	ratelimit.PerSecond(1_000_003),                 // n = 1,000,003, p = 1e6
	{Count: 257, Per: time.Microsecond},            // n = 257: one bit too many
	{Count: 999_999_999_989, Per: 7*time.Hour + 3}, // n near 1e15
	{Count: 1_000_000_000_000_000, Per: 1<<40 + 1}, // n = 1e18
	{Count: 2_000_003, Per: 3*24*time.Hour - 1},    // a pace of more than a second per unit
	{Count: 1_000_000_007, Per: 1_000_000_009},     // about a nanosecond per unit
}

func drawWideRate(t *rapid.T) ratelimit.Rate {
	if rapid.Bool().Draw(t, "namedWide") {
		return rapid.SampledFrom(wideRates).Draw(t, "rate")
	}
	// A random pace whose n needs at least 9 bits: a prime count above
	// 256 over a period it does not divide.
	count := rapid.SampledFrom([]int64{257, 65_537, 1_000_003, 999_999_937, 1_000_000_000_039}).Draw(t, "count")
	per := time.Duration(rapid.Int64Range(1, int64(10*year)).Draw(t, "per"))
	if int64(per)%count == 0 {
		per++
	}
	return ratelimit.Rate{Count: count, Per: per}
}

// A limiter at a wide pace (a GCRA, a token bucket or a leaky bucket)
// decides as the model does on random traces, settlements into debt
// included, and keeps its mutex.
func TestWidePaceMatchesModel(t *testing.T) {
	for _, name := range []string{"GCRA", "TokenBucket", "LeakyBucket"} {
		a := testedAlgorithmNamed(name)
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := settings{rate: drawWideRate(t), capacity: drawCapacity(t), name: drawName(t)}
				if !a.valid(s) {
					t.Skip("the capacity takes longer than MaxTime at this rate")
				}
				lim, err := ratelimit.New(a.rule(s), ratelimit.WithClock(ratelimit.NewManualClock(0)))
				require.NoError(t, err)
				require.Equal(t, "mutex", ratelimit.SingleKeyPath(lim))
				runModel(t, modelCase{rule: a.rule(s), model: a.model(s), scale: s.rate.Per,
					valid: true, name: s.name, window: a.decisionWindow(s)})
			})
		})
	}
}

// A single-key limiter at a wide pace decides every operation (Check,
// Peek, Refund, Settle, Reset) as a Store, which keeps its states under
// shard locks and steps them with the pure transition, does on the same
// trace: with a Delay for the leaky bucket, with clocks set back, and from
// instants up to MaxTime with capacities whose span (and a debt of twice
// it) reaches MaxTime and the largest int64 nanosecond.
func TestWidePaceMatchesStore(t *testing.T) {
	for _, name := range []string{"GCRA", "TokenBucket", "LeakyBucket"} {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				rate := drawWideRate(t)
				capacity := drawCapacity(t)
				if rapid.Bool().Draw(t, "hugeCapacity") {
					// The largest capacity whose span fits MaxTime, or near it.
					c := new(big.Int).Mul(big.NewInt(int64(ratelimit.MaxTime)-1), big.NewInt(rate.Count))
					c.Quo(c, big.NewInt(int64(rate.Per)))
					if !c.IsInt64() || c.Int64() > 1e15 {
						c.SetInt64(1e15)
					}
					capacity = max(1, c.Int64()-rapid.Int64Range(0, 3).Draw(t, "less"))
				}
				a := testedAlgorithmNamed(name)
				if !a.valid(settings{rate: rate, capacity: capacity}) {
					t.Skip("the capacity takes longer than MaxTime at this rate")
				}
				var rule ratelimit.Rule
				switch name {
				case "GCRA":
					rule = ratelimit.GCRA{Rate: rate, Burst: capacity}
				case "TokenBucket":
					rule = ratelimit.TokenBucket{Rate: rate, Burst: capacity}
				default:
					rule = ratelimit.LeakyBucket{Rate: rate, Capacity: capacity,
						Delay: rapid.Int64Range(0, capacity).Draw(t, "delay")}
				}
				start := rapid.SampledFrom([]int64{0, int64(time.Hour), int64(ratelimit.MaxTime) / 2,
					int64(ratelimit.MaxTime) - int64(year), int64(ratelimit.MaxTime)}).Draw(t, "start")
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(time.Duration(start))}
				lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				require.Equal(t, "mutex", ratelimit.SingleKeyPath(lim))
				store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				// The store reads its clock when built, a limiter only when
				// it decides: one check each at the start, before the clock
				// can go back.
				want, err := store.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				got, err := lim.Check(ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, want, got)
				capMilli := capacity * int64(ratelimit.Unit)
				drawUnits := func(t *rapid.T, label string, most int64) ratelimit.Units {
					return ratelimit.Units(rapid.OneOf(rapid.Int64Range(1, most),
						rapid.Int64Range(max(1, most-3), most), rapid.Just(min(most, int64(ratelimit.Unit)))).Draw(t, label))
				}
				drawAt := func(t *rapid.T) time.Duration {
					now := max(int64(clk.Now()), 0)
					return time.Duration(rapid.OneOf(rapid.Int64Range(0, now),
						rapid.Int64Range(max(0, now-int64(rate.Per)), now)).Draw(t, "at"))
				}
				actions := traceActions(clk, rate.Per)
				actions["check"] = func(t *rapid.T) {
					cost := drawUnits(t, "cost", capMilli)
					peek, err := ratelimit.Peek(lim, cost)
					require.NoError(t, err)
					wantPeek, err := store.Peek("k", cost)
					require.NoError(t, err)
					require.Equal(t, wantPeek, peek, "peek")
					got, err := lim.Check(cost)
					require.NoError(t, err)
					want, err := store.Check("k", cost)
					require.NoError(t, err)
					require.Equal(t, want, got, "check %d", cost)
				}
				actions["refund"] = func(t *rapid.T) {
					cost, at := drawUnits(t, "cost", capMilli), drawAt(t)
					got, err := ratelimit.Refund(lim, cost, at)
					require.NoError(t, err)
					want, err := store.Refund("k", cost, at)
					require.NoError(t, err)
					require.Equal(t, want, got, "refund %d at %d", cost, at)
				}
				actions["settle"] = func(t *rapid.T) {
					charged := drawUnits(t, "charged", capMilli)
					actual := drawUnits(t, "actual", 3*capMilli)
					at := drawAt(t)
					got, gs, err := ratelimit.Settle(lim, charged, actual, at)
					require.NoError(t, err)
					want, ws, err := store.Settle("k", charged, actual, at)
					require.NoError(t, err)
					require.Equal(t, ws, gs, "settled")
					require.Equal(t, want, got, "settle %d as %d at %d", charged, actual, at)
				}
				actions["reset"] = func(t *rapid.T) {
					// The store's Reset reads its clock, a limiter's does not:
					// a check on both right after keeps their instants one.
					require.NoError(t, ratelimit.Reset(lim))
					store.Reset("k")
					got, err := lim.Check(ratelimit.Unit)
					require.NoError(t, err)
					want, err := store.Check("k", ratelimit.Unit)
					require.NoError(t, err)
					require.Equal(t, want, got, "check after reset")
				}
				actions["far"] = func(t *rapid.T) {
					clk.Set(time.Duration(rapid.Int64Range(0, int64(ratelimit.MaxTime)+int64(year)).Draw(t, "far")))
				}
				t.Repeat(actions)
				require.Equal(t, "mutex", ratelimit.SingleKeyPath(lim))
			})
		})
	}
}

// Concurrent operations at wide paces, under the race detector: checks
// admit exactly the capacity, and peeks, refunds of nothing and
// settlements that change nothing running beside them do not disturb that.
func TestWidePaceConcurrentChecksAdmitExactlyTheBurst(t *testing.T) {
	for _, rate := range wideRates[:3] {
		for _, name := range []string{"GCRA", "TokenBucket", "LeakyBucket"} {
			a := testedAlgorithmNamed(name)
			t.Run(rate.String()+"/"+name, func(t *testing.T) {
				clk := ratelimit.NewManualClock(time.Hour)
				lim, err := ratelimit.New(a.rule(settings{rate: rate, capacity: 100}), ratelimit.WithClock(clk))
				require.NoError(t, err)
				require.Equal(t, "mutex", ratelimit.SingleKeyPath(lim))
				admitted := checkConcurrently(t, lim, func(i int) {
					switch i % 10 {
					case 1:
						d, err := ratelimit.Peek(lim, ratelimit.Unit)
						assert.NoError(t, err)
						assert.GreaterOrEqual(t, d.Remaining, int64(0))
					case 2:
						// An instant before any admission: nothing to give back.
						g, err := ratelimit.Refund(lim, ratelimit.Unit, time.Minute)
						assert.NoError(t, err)
						assert.Zero(t, g)
					}
				})
				assert.Equal(t, int64(100), admitted)
				d, err := lim.Check(ratelimit.Unit)
				require.NoError(t, err)
				assert.False(t, d.Allowed)
				assert.Zero(t, d.Remaining)
			})
		}
	}
}
