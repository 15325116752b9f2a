package redisstore

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// prefixes keeps every test's keys apart on the shared server.
var prefixes, totalChecks atomic.Int64

func testPrefix() string { return fmt.Sprintf("t%d:", prefixes.Add(1)) }

const (
	year    = 365 * 24 * time.Hour
	unixNow = time.Duration(1_780_000_000) * time.Second // mid-2026 as Unix time
)

// drawCount draws a count or capacity from 1 to 1e15, favouring the shapes
// that matter: small, round, prime-ish, around 2^53 / 1000, and the top.
func drawCount(t *rapid.T, label string) int64 {
	return rapid.OneOf(
		rapid.Int64Range(1, 10),
		rapid.SampledFrom([]int64{7, 20, 100, 1000, 1_000_003, 9_007_199_254_740, 9_007_199_254_741, 1e12, 999_999_999_999_989, 1e15}),
		rapid.Int64Range(1, 1e15),
	).Draw(t, label)
}

// drawPeriod draws a period or window from 1 ns to about 100 years.
func drawPeriod(t *rapid.T, label string) time.Duration {
	return rapid.OneOf(
		rapid.SampledFrom([]time.Duration{1, 3, time.Millisecond, time.Second, 3 * time.Second, time.Minute, time.Hour, 24 * time.Hour, year, 100 * year}),
		rapid.Map(rapid.Int64Range(1, int64(100*year)), func(v int64) time.Duration { return time.Duration(v) }),
	).Draw(t, label)
}

// drawRule draws a rule that ratelimit.New accepts, of any algorithm.
func drawRule(t *rapid.T) ratelimit.Rule {
	for {
		var r ratelimit.Rule
		switch rapid.IntRange(0, 6).Draw(t, "algorithm") {
		case 0:
			r = ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: drawCount(t, "count"), Per: drawPeriod(t, "per")}, Burst: drawCount(t, "burst")}
		case 1:
			r = ratelimit.GCRA{Rate: ratelimit.Rate{Count: drawCount(t, "count"), Per: drawPeriod(t, "per")}, Burst: drawCount(t, "burst"), Name: "g"}
		case 2:
			c := drawCount(t, "capacity")
			delay := rapid.OneOf(rapid.Just(int64(0)), rapid.Just(c), rapid.Int64Range(0, c)).Draw(t, "delay")
			r = ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: drawCount(t, "count"), Per: drawPeriod(t, "per")}, Capacity: c, Delay: delay}
		case 3:
			r = ratelimit.FixedWindow{Limit: drawCount(t, "limit"), Window: drawPeriod(t, "window")}
		case 4:
			r = ratelimit.SlidingLog{Limit: drawCount(t, "limit"), Window: drawPeriod(t, "window"), Name: "log"}
		case 5:
			r = ratelimit.SlidingCounter{Limit: drawCount(t, "limit"), Window: drawPeriod(t, "window"), CountRefused: rapid.Bool().Draw(t, "countRefused")}
		default:
			k := rapid.OneOf(rapid.SampledFrom([]int{1, 2, 6, 60}), rapid.IntRange(1, 60)).Draw(t, "buckets")
			w := drawPeriod(t, "window")
			r = ratelimit.SubWindow{Limit: drawCount(t, "limit"), Window: w - w%time.Duration(k), Buckets: k, CountRefused: rapid.Bool().Draw(t, "countRefused")}
		}
		if _, err := ratelimit.NewMachine(r); err == nil {
			return r
		}
	}
}

// drawCost draws a cost within the capacity: mostly one unit, sometimes a
// bulk or fractional cost, sometimes the whole capacity.
func drawCost(t *rapid.T, capacity ratelimit.Units) ratelimit.Units {
	c := rapid.OneOf(
		rapid.Just(ratelimit.Unit),
		rapid.Just(ratelimit.Unit),
		rapid.Just(capacity),
		rapid.Map(rapid.Int64Range(1, int64(capacity)), func(v int64) ratelimit.Units { return ratelimit.Units(v) }),
		rapid.Map(rapid.Int64Range(1, 3000), func(v int64) ratelimit.Units { return ratelimit.Units(v) }),
	).Draw(t, "cost")
	return min(c, capacity)
}

// drawActual draws a settlement's actual cost for a request charged
// charged: near it, anywhere up to past the debt bound, or far beyond.
func drawActual(t *rapid.T, charged, capacity ratelimit.Units) ratelimit.Units {
	return rapid.OneOf(
		rapid.Map(rapid.Int64Range(-2, 2), func(v int64) ratelimit.Units { return max(1, charged+ratelimit.Units(v)) }),
		rapid.Map(rapid.Int64Range(1, 3*int64(min(capacity, math.MaxInt64/4))+2000), func(v int64) ratelimit.Units { return ratelimit.Units(v) }),
		rapid.Just(2*capacity+charged),
		rapid.Map(rapid.Int64Range(1, math.MaxInt64), func(v int64) ratelimit.Units { return ratelimit.Units(v) }),
	).Draw(t, "actual")
}

// TestSameDecisionsAsInProcess runs one trace against the Redis store and
// against an in-process single-key limiter per key, on one ManualClock, and
// requires every Decision, and every amount a refund gives back, to be the
// same (a refusal the deny cache answers instead of Redis: refused alike,
// with a wait never shorter; see requireCachedRefusal): checks, a leaky
// bucket's CheckWithin (held to withinModel), peeks, refunds (at instants checks admitted at, and at
// others), settlements (charging into debt, past its bound, or refunding)
// and resets; the checks after a settlement are what show that the
// scripts accept a debt and decide on it exactly. Times run from 0 to MaxTime with leaps of years and
// readings that go back; capacities and rates reach 1e15, so most
// quantities are beyond 2^53.
func TestSameDecisionsAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	defer func() { t.Logf("%d checks compared", totalChecks.Load()) }()
	rapid.Check(t, func(t *rapid.T) {
		rule := drawRule(t)
		start := rapid.SampledFrom([]time.Duration{0, 1, unixNow, ratelimit.MaxTime - year, ratelimit.MaxTime}).Draw(t, "start")
		clk := ratelimit.NewManualClock(start)
		s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(time.Hour), WithTimeout(5*time.Second))
		require.NoError(t, err)
		p := s.Params()
		local := map[string]ratelimit.Limiter{}
		keys := []string{"a", "b", "{c}"}
		// limiter returns key's limiter, made when a check first touches
		// the key (as Redis holds a key from its first check on); keep says
		// whether to keep one made now.
		limiter := func(key string, keep bool) ratelimit.Limiter {
			l, ok := local[key]
			if !ok {
				l, err = ratelimit.New(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				if keep {
					local[key] = l
				}
			}
			return l
		}
		checks := 0
		var ats []time.Duration
		check := func(t *rapid.T) {
			key := rapid.SampledFrom(keys).Draw(t, "key")
			cost := drawCost(t, p.Capacity)
			want, werr := limiter(key, true).Check(cost)
			before := s.Stats().LocalDenials
			got, gerr := s.Check(key, cost)
			require.NoError(t, werr)
			require.NoError(t, gerr)
			checks++
			if s.Stats().LocalDenials > before {
				// The deny cache's refusal: Redis's, or a longer wait.
				requireCachedRefusal(t, want, got, "check %d at %d, key %q, cost %d", checks, clk.Now(), key, cost)
			} else if want != got {
				t.Fatalf("check %d at %d, key %q, cost %d:\n in-process %+v\n redis      %+v", checks, clk.Now(), key, cost, want, got)
			}
			if got.Allowed {
				ats = append(ats, got.At)
			}
		}
		span := max(p.Window, 2)
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				d := rapid.OneOf(
					rapid.SampledFrom([]time.Duration{0, 1, time.Millisecond, time.Second, span, span / 2, span - 1}),
					rapid.Map(rapid.Int64Range(0, int64(span)), func(v int64) time.Duration { return time.Duration(v) }),
					rapid.Map(rapid.Int64Range(0, int64(10*year)), func(v int64) time.Duration { return time.Duration(v) }),
				).Draw(t, "advance")
				clk.Advance(d)
			},
			"back": func(t *rapid.T) {
				now := clk.Now()
				clk.Set(now - time.Duration(rapid.Int64Range(0, int64(min(now, 2*year))).Draw(t, "back")))
			},
			"check": func(t *rapid.T) {
				for range rapid.IntRange(1, 10).Draw(t, "checks") {
					check(t)
				}
			},
			// A leaky bucket's CheckWithin: one script, which refuses an
			// admission whose Delay is over the cap and then writes nothing.
			"within": func(t *rapid.T) {
				if p.Algorithm != "leaky_bucket" {
					return
				}
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := drawCost(t, p.Capacity)
				maxDelay := drawMaxDelay(t, max(time.Duration(p.TauNanos), 2))
				want, werr := withinModel(limiter(key, true), cost, p.Capacity, maxDelay)
				got, gerr := s.CheckWithin(key, cost, maxDelay)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				checks++
				if want != got {
					t.Fatalf("check %d within %d at %d, key %q, cost %d:\n in-process %+v\n redis      %+v", checks, maxDelay, clk.Now(), key, cost, want, got)
				}
				if got.Allowed {
					ats = append(ats, got.At)
				}
			},
			"peek": func(t *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(t, "key")
				cost := drawCost(t, p.Capacity)
				want, werr := ratelimit.Peek(limiter(key, false), cost)
				got, gerr := s.Peek(key, cost)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				if want != got {
					t.Fatalf("peek at %d, key %q, cost %d:\n in-process %+v\n redis      %+v", clk.Now(), key, cost, want, got)
				}
			},
			"refund": func(t *rapid.T) {
				key := rapid.SampledFrom(append(keys, "never")).Draw(t, "key")
				at := clk.Now()
				if len(ats) > 0 && rapid.IntRange(0, 3).Draw(t, "admitted") > 0 {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				} else {
					at += time.Duration(rapid.Int64Range(-int64(span), int64(span)).Draw(t, "offset"))
				}
				cost := rapid.OneOf(
					rapid.Just(drawCost(t, p.Capacity)),
					rapid.Just(p.Capacity+ratelimit.Unit),
				).Draw(t, "refund")
				// A key no check has touched is not in Redis and gives back
				// nothing; the in-process limiter is not asked, so that its
				// clamp on time stays the one Redis keeps (none).
				var want ratelimit.Units
				if l, ok := local[key]; ok {
					want, err = ratelimit.Refund(l, cost, at)
					require.NoError(t, err)
				}
				got, err := s.Refund(key, cost, at)
				require.NoError(t, err)
				if want != got {
					t.Fatalf("refund at %d, key %q, cost %d admitted at %d: in-process %d, redis %d", clk.Now(), key, cost, at, want, got)
				}
			},
			"reset": func(t *rapid.T) {
				key := rapid.SampledFrom(append(keys, "never")).Draw(t, "key")
				if l, ok := local[key]; ok {
					require.NoError(t, ratelimit.Reset(l))
				}
				require.NoError(t, s.Reset(key))
			},
			"settle": func(t *rapid.T) {
				key := rapid.SampledFrom(append(keys, "never")).Draw(t, "key")
				at := clk.Now()
				if len(ats) > 0 && rapid.IntRange(0, 3).Draw(t, "admitted") > 0 {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				} else {
					at += time.Duration(rapid.Int64Range(-int64(span), int64(span)).Draw(t, "offset"))
				}
				charged := drawCost(t, p.Capacity)
				actual := drawActual(t, charged, p.Capacity)
				// A charge makes the key (in Redis as in process); a refund
				// on a key no check has touched gives nothing and makes
				// nothing, and the in-process limiter is not kept for it.
				want, wx, werr := ratelimit.Settle(limiter(key, actual > charged), charged, actual, at)
				got, gx, gerr := s.Settle(key, charged, actual, at)
				require.NoError(t, werr)
				require.NoError(t, gerr)
				if want != got || wx != gx {
					t.Fatalf("settle at %d, key %q, %d as %d admitted at %d:\n in-process %+v settled %d\n redis      %+v settled %d", clk.Now(), key, charged, actual, at, want, wx, got, gx)
				}
			},
		})
		totalChecks.Add(int64(checks))
		st := s.Stats()
		require.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
	})
}
