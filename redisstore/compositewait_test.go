package redisstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// outcome is what a Wait or a check returned.
type outcome struct {
	d   ratelimit.Decision
	err error
}

// drive runs fs at once, each on a goroutine of its own, moving clk to the
// earliest instant a sleeper waits for whenever every one still running
// is asleep on it, and returns what each returned. It fails the test if
// they have not all returned within 20 s.
func drive(t require.TestingT, clk *ratelimit.ManualClock, fs ...func() (ratelimit.Decision, error)) []outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := make([]outcome, len(fs))
	done := make(chan int, len(fs))
	for i, f := range fs {
		go func() {
			d, err := f()
			out[i] = outcome{d, err}
			done <- i
		}()
	}
	for running := len(fs); running > 0; {
		sctx, scancel := context.WithCancel(ctx)
		asleep := make(chan error, 1)
		go func(n int) { asleep <- clk.BlockUntilSleepers(sctx, n) }(running)
		select {
		case <-done:
			running--
			scancel()
			<-asleep
		case err := <-asleep:
			scancel()
			require.NoError(t, err, "the waits neither returned nor slept")
			if at, ok := clk.NextWake(); ok {
				clk.Set(at)
			}
		}
	}
	return out
}

// sameOutcome requires got to be want: the same Decision and the same
// error, as far as errors.Is tells the sentinels a caller acts on.
func sameOutcome(t require.TestingT, want, got outcome, msgAndArgs ...any) {
	require.Equal(t, want.d, got.d, msgAndArgs...)
	require.Equal(t, want.err == nil, got.err == nil, "errors %v, %v", want.err, got.err)
	for _, target := range []error{ratelimit.ErrWouldExceedDeadline, context.DeadlineExceeded, ratelimit.ErrInvalidCost, ratelimit.ErrCostExceedsCapacity} {
		require.Equal(t, errors.Is(want.err, target), errors.Is(got.err, target), "errors %v, %v", want.err, got.err)
	}
}

// TestCompositeWaitWithinAsInProcess runs one trace of checks, CheckWithin
// calls (with caps from none to beyond any Delay) and Waits (with
// deadlines near and far) against the Redis Composite and the in-process
// ratelimit.Composite of the same layers, on one ManualClock, and requires
// the same Decisions and errors; the Waits of both run at once, the clock
// moved to each wake-up as both sleep. For a single enforced layer the
// Redis Store and the in-process Store run the same trace too. Layers of
// every algorithm (leaky buckets with and without their Delay option
// among them), enforced or shadow, keyed globally, per customer or per
// whole key. A refusal the deny cache answers is held to
// requireCachedCompositeRefusal (the Stores' to requireCachedRefusal).
func TestCompositeWaitWithinAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	var slept, gaveUp, admitted, tooSlow atomic.Int64
	defer func() {
		t.Logf("waits: %d slept, %d gave up, %d admitted; CheckWithin: %d too slow", slept.Load(), gaveUp.Load(), admitted.Load(), tooSlow.Load())
	}()
	// Leaky buckets one time in three, paced in days, so that the waits'
	// deadlines (about two weeks, or fifty years) fall among their Delays.
	rule := func(t *rapid.T) ratelimit.Rule {
		if rapid.IntRange(0, 2).Draw(t, "leaky") != 0 {
			return drawRule(t)
		}
		c := rapid.Int64Range(1, 6).Draw(t, "capacity")
		return ratelimit.LeakyBucket{
			Rate:     ratelimit.Rate{Count: rapid.Int64Range(1, 3).Draw(t, "count"), Per: rapid.SampledFrom([]time.Duration{24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour}).Draw(t, "per")},
			Capacity: c, Delay: rapid.Int64Range(0, c).Draw(t, "delay"), Name: "leaky",
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		local, clk, want, got := drawComposites(t, rdb, rule)
		n := len(local)
		var err error
		// One enforced layer: the Stores too, keyed as the layer is.
		var wantStore *ratelimit.Store
		var gotStore *Store
		storeKey := func(k string) string { return k }
		if n == 1 && !local[0].Shadow {
			wantStore, err = ratelimit.NewStore(local[0].Rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			gotStore, err = New(rdb, local[0].Rule, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(time.Hour), WithTimeout(5*time.Second))
			require.NoError(t, err)
			if local[0].Key != nil {
				storeKey = local[0].Key
			}
		}
		capacity := ratelimit.Units(1 << 62)
		for _, l := range local {
			m, _ := ratelimit.NewMachine(l.Rule)
			capacity = min(capacity, m.Params().Capacity)
		}
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			clk.Advance(rapid.SampledFrom([]time.Duration{0, 0, 1, time.Millisecond, time.Second, time.Hour, 24 * time.Hour}).Draw(t, "advance"))
			key := rapid.SampledFrom([]string{"x 1", "x 2", "y 1"}).Draw(t, "key")
			cost := drawCost(t, capacity)
			msg := []any{"step %d at %d: key %q cost %d", step, clk.Now(), key, cost}
			waitMsg := []any{"step %d at %d: key %q cost %d: wait", step, clk.Now(), key, cost}
			switch op := rapid.IntRange(0, 2).Draw(t, "op"); {
			case op == 0:
				before := got.Stats().LocalDenials
				w, werr := want.Check(key, cost)
				g, gerr := got.Check(key, cost)
				if got.Stats().LocalDenials > before {
					requireCachedCompositeRefusal(t, w, g, msg...)
				} else {
					sameOutcome(t, outcome{w, werr}, outcome{g, gerr}, msg...)
				}
				if gotStore != nil {
					before := gotStore.Stats().LocalDenials
					w, werr := wantStore.Check(storeKey(key), cost)
					g, gerr := gotStore.Check(storeKey(key), cost)
					if gotStore.Stats().LocalDenials > before {
						requireCachedRefusal(t, w, g, msg...)
					} else {
						sameOutcome(t, outcome{w, werr}, outcome{g, gerr}, msg...)
					}
				}
			case op == 1:
				maxDelay := rapid.SampledFrom([]time.Duration{-1, 0, 1, time.Millisecond, time.Second, time.Hour, 7 * 24 * time.Hour, 100 * year}).Draw(t, "maxDelay")
				before := got.Stats().LocalDenials
				w, werr := want.CheckWithin(key, cost, maxDelay)
				g, gerr := got.CheckWithin(key, cost, maxDelay)
				if got.Stats().LocalDenials > before {
					requireCachedCompositeRefusal(t, w, g, msg...)
				} else {
					sameOutcome(t, outcome{w, werr}, outcome{g, gerr}, msg...)
				}
				if werr == nil && !w.Allowed && w.RetryAfter > 0 {
					if ok, _ := want.Peek(key, cost); ok.Allowed {
						tooSlow.Add(1)
					}
				}
				if gotStore != nil {
					before := gotStore.Stats().LocalDenials
					w, werr := wantStore.CheckWithin(storeKey(key), cost, maxDelay)
					g, gerr := gotStore.CheckWithin(storeKey(key), cost, maxDelay)
					if gotStore.Stats().LocalDenials > before {
						requireCachedRefusal(t, w, g, msg...)
					} else {
						sameOutcome(t, outcome{w, werr}, outcome{g, gerr}, msg...)
					}
				}
			default:
				if clk.Now() > unixNow+30*year {
					continue // a wait could then run past MaxTime
				}
				// Deadlines in real time, far from any wait the rules give
				// (so that the time the calls take cannot tip one over),
				// and far enough that none could reach MaxTime.
				deadline := rapid.SampledFrom([]time.Duration{1_234_567_891_234_567, 50*year + 7}).Draw(t, "deadline")
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				fs := []func() (ratelimit.Decision, error){
					func() (ratelimit.Decision, error) { return want.Wait(ctx, key, cost) },
					func() (ratelimit.Decision, error) { return got.Wait(ctx, key, cost) },
				}
				if gotStore != nil {
					fs = append(fs,
						func() (ratelimit.Decision, error) { return wantStore.Wait(ctx, storeKey(key), cost) },
						func() (ratelimit.Decision, error) { return gotStore.Wait(ctx, storeKey(key), cost) })
				}
				start := clk.Now()
				out := drive(t, clk, fs...)
				cancel()
				switch {
				case errors.Is(out[0].err, ratelimit.ErrWouldExceedDeadline):
					gaveUp.Add(1)
				case out[0].err == nil && clk.Now() > start:
					slept.Add(1)
				case out[0].err == nil:
					admitted.Add(1)
				}
				sameOutcome(t, out[0], out[1], waitMsg...)
				if gotStore != nil {
					sameOutcome(t, out[2], out[3], waitMsg...)
				}
			}
		}
	})
}
