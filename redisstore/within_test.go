package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// withinChecks is what a hot-key round calls: a Store's or a Composite's
// CheckWithinContext.
type withinChecks func(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error)

// TestLeakyCheckWithinHotKey: 64 goroutines call CheckWithin on one leaky
// bucket key at once, with small caps on the Delay, through a Store and
// through a Composite with a leaky bucket layer. None may fail (a
// leaky bucket's CheckWithin is one script call, which has nothing to
// conflict with), and each round, all at one instant of the client clock
// with one cap, must give the in-process Decisions: costs of one unit at
// one instant queue up one after another until the cap or the capacity
// refuses, and from then on every request is refused alike, so the
// Decisions, in whatever order the calls ran, are the in-process ones for
// the same calls made one by one.
func TestLeakyCheckWithinHotKey(t *testing.T) {
	rdb := needRedis(t)
	const goroutines, perGoroutine = 64, 8
	leaky := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1000), Capacity: 400, Delay: 20, Name: "leaky"}
	global := ratelimit.GCRA{Rate: ratelimit.PerSecond(100_000), Burst: 100_000, Name: "global"}
	caps := []time.Duration{0, time.Millisecond, 50 * time.Millisecond, 250*time.Millisecond + 1, time.Second}
	kinds := []struct {
		name string
		make func(t *testing.T, clk *ratelimit.ManualClock) (want, got withinChecks)
	}{
		{"store", func(t *testing.T, clk *ratelimit.ManualClock) (withinChecks, withinChecks) {
			local, err := ratelimit.NewStore(leaky, ratelimit.WithClock(clk))
			require.NoError(t, err)
			s, err := New(rdb, leaky, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
			require.NoError(t, err)
			return func(_ context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
				return local.CheckWithin(key, cost, maxDelay)
			}, s.CheckWithinContext
		}},
		{"composite", func(t *testing.T, clk *ratelimit.ManualClock) (withinChecks, withinChecks) {
			layers := []ratelimit.Layer{{Rule: leaky}, {Rule: global, Key: func(string) string { return "all" }}}
			local, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
			require.NoError(t, err)
			c, err := NewComposite(rdb, []Layer{{Layer: layers[0]}, {Layer: layers[1]}}, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
			require.NoError(t, err)
			return func(_ context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
				return local.CheckWithin(key, cost, maxDelay)
			}, c.CheckWithinContext
		}},
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			want, got := kind.make(t, clk)
			var conflicts, failures, admitted int
			for round, maxDelay := range caps {
				clk.Advance(time.Duration(round) * 300 * time.Millisecond)
				out := make([]ratelimit.Decision, 0, goroutines*perGoroutine)
				var errs []error
				var mu sync.Mutex
				var wg sync.WaitGroup
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range perGoroutine {
							d, err := got(ctx, "hot", ratelimit.Unit, maxDelay)
							mu.Lock()
							if err != nil {
								errs = append(errs, err)
							} else {
								out = append(out, d)
							}
							mu.Unlock()
						}
					}()
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("round %d: the checks did not return within 30 s", round)
				}
				cancel()
				for _, err := range errs {
					failures++
					if errors.Is(err, ErrConflict) {
						conflicts++
					}
				}
				if failures > 0 {
					t.Fatalf("round %d (cap %v): %d of %d calls failed, %d with ErrConflict; the first: %v",
						round, maxDelay, failures, goroutines*perGoroutine, conflicts, errs[0])
				}
				var local []ratelimit.Decision
				for range goroutines * perGoroutine {
					d, err := want(context.Background(), "hot", ratelimit.Unit, maxDelay)
					require.NoError(t, err)
					local = append(local, d)
					if d.Allowed {
						admitted++
					}
				}
				require.Equal(t, sortedDecisions(local), sortedDecisions(out), "round %d (cap %v)", round, maxDelay)
			}
			require.Positive(t, admitted)
		})
	}
}

// sortedDecisions returns ds as sorted text, to compare as a multiset.
func sortedDecisions(ds []ratelimit.Decision) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%+v", d)
	}
	slices.Sort(out)
	return out
}

// withinModel is ratelimit.Store.CheckWithin for the one key of l, a leaky
// bucket's single-key limiter, made of its Peek and Check: a request the
// queue refuses gets Peek's refusal, spending nothing; one the queue admits
// with a Delay of at most maxDelay (0 if negative) is checked, and
// admitted alike; one it would admit with a longer Delay is refused,
// spending nothing, as the queue stands for a request of the whole
// capacity, with a RetryAfter of the Delay beyond maxDelay.
// TestWithinModel holds it to ratelimit.Store.CheckWithin.
func withinModel(l ratelimit.Limiter, cost, capacity ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	maxDelay = max(maxDelay, 0)
	d, err := ratelimit.Peek(l, cost)
	switch {
	case err != nil || !d.Allowed:
		return d, err
	case d.Delay <= maxDelay:
		return l.Check(cost)
	}
	slow, err := ratelimit.Peek(l, capacity)
	if err != nil {
		return slow, err
	}
	slow.Allowed, slow.Delay, slow.RetryAfter = false, 0, d.Delay-maxDelay
	return slow, nil
}

// drawMaxDelay draws a cap on the Delay for a rule whose queue drains in
// span: none, tiny, or anywhere up to beyond the longest Delay.
func drawMaxDelay(t *rapid.T, span time.Duration) time.Duration {
	return rapid.OneOf(
		rapid.SampledFrom([]time.Duration{-1, 0, 1, time.Millisecond, time.Second, span / 3, span / 2, span - 1, span}),
		rapid.Map(rapid.Int64Range(0, int64(min(span, math.MaxInt64/2))*2), func(v int64) time.Duration { return time.Duration(v) }),
	).Draw(t, "maxDelay")
}

// TestWithinModel: withinModel decides as ratelimit.Store.CheckWithin does,
// on traces of checks and capped checks of leaky buckets, so that the
// differential tests may hold Redis to it.
func TestWithinModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawCount(t, "capacity")
		rule := ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: drawCount(t, "count"), Per: drawPeriod(t, "per")}, Capacity: c,
			Delay: rapid.OneOf(rapid.Just(int64(0)), rapid.Just(c), rapid.Int64Range(0, c)).Draw(t, "delay")}
		m, err := ratelimit.NewMachine(rule)
		if err != nil {
			t.Skip("not a rule")
		}
		p := m.Params()
		clk := ratelimit.NewManualClock(unixNow)
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		l, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		span := max(time.Duration(p.TauNanos), 2)
		for i := range rapid.IntRange(1, 40).Draw(t, "steps") {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(span)).Draw(t, "advance")))
			cost := drawCost(t, p.Capacity)
			var want, got ratelimit.Decision
			var werr, gerr error
			if rapid.Bool().Draw(t, "within") {
				maxDelay := drawMaxDelay(t, span)
				want, werr = store.CheckWithin("k", cost, maxDelay)
				got, gerr = withinModel(l, cost, p.Capacity, maxDelay)
			} else {
				want, werr = store.Check("k", cost)
				got, gerr = l.Check(cost)
			}
			require.NoError(t, werr)
			require.NoError(t, gerr)
			require.Equal(t, want, got, "step %d", i)
		}
	})
}

// TestLeakyCheckWithinServerTime: on the server's clock, a leaky bucket's
// CheckWithin, on the fast path, on the exact path (as a script and as
// the library runs it) and as the store runs it, decides as the rule's
// LayeredMachine does on the state the key held before and at the instant
// the Decision reports, and writes the state the Machine computes, or
// nothing when it does not commit.
func TestLeakyCheckWithinServerTime(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(20), Capacity: 12, Delay: 3}
	lm, err := ratelimit.NewLayeredMachine([]ratelimit.Layer{{Rule: rule}})
	require.NoError(t, err)
	caps := []time.Duration{-1, 0, 40 * time.Millisecond, 120 * time.Millisecond, 300 * time.Millisecond, time.Second}
	for _, path := range []struct {
		name   string
		script scriptRunner
	}{{"fast", fastScript}, {"exact", exactScript}, {"exact library", exactFunction}, {"store", nil}} {
		t.Run(path.name, func(t *testing.T) {
			s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(5*time.Second))
			require.NoError(t, err)
			if path.script != nil {
				s.script = path.script
			}
			var committed, tooSlow, refused int
			for i := range 60 {
				cost := ratelimit.Unit
				if i%5 == 4 {
					cost = 3 * ratelimit.Unit
				}
				maxDelay := caps[i%len(caps)]
				before, err := rdb.Get(ctx, s.Key("k")).Result()
				if err != nil {
					require.ErrorIs(t, err, redis.Nil)
				}
				got, err := s.CheckWithin("k", cost, maxDelay)
				require.NoError(t, err, "step %d", i)
				a, next, _, err := lm.StepWithin([][]byte{[]byte(before)}, got.At, cost, max(maxDelay, 0))
				require.NoError(t, err)
				want := a.Decision
				switch {
				case a.Committed:
					committed++
				case a.Decision.Allowed:
					want = a.TooSlow
					tooSlow++
				default:
					refused++
				}
				require.Equal(t, want, got, "step %d, cap %v, on %q", i, maxDelay, before)
				after, err := rdb.Get(ctx, s.Key("k")).Result()
				if err != nil {
					require.ErrorIs(t, err, redis.Nil)
				}
				require.Equal(t, string(next[0]), after, "step %d: the state written", i)
			}
			require.Zero(t, s.Stats().Mismatches+s.Stats().InvalidStates+s.Stats().Failures)
			t.Logf("%d committed, %d too slow, %d refused", committed, tooSlow, refused)
			require.Positive(t, committed)
			require.Positive(t, tooSlow)
		})
	}
}
