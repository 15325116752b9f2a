package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
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

func newInFlight(t testing.TB, l ratelimit.InFlightLimit, opts ...ratelimit.Option) *ratelimit.InFlight {
	t.Helper()
	f, err := ratelimit.NewInFlight(l, opts...)
	require.NoError(t, err)
	return f
}

// enter counts one more holder inside, and raises most to the count if it
// is the most seen.
func enter(inside, most *atomic.Int64) {
	n := inside.Add(1)
	for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
	}
}

// TestInFlightNeverOverLimit has 1,000 goroutines acquire and release one
// key against a limit of 4, counting the holders inside the critical
// section: never more than 4 at once.
func TestInFlightNeverOverLimit(t *testing.T) {
	rate, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1_000_000})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		acquire func(f *ratelimit.InFlight) (ratelimit.Release, ratelimit.Decision, error)
	}{
		{"Acquire", func(f *ratelimit.InFlight) (ratelimit.Release, ratelimit.Decision, error) {
			return f.Acquire("k")
		}},
		{"AcquireWith", func(f *ratelimit.InFlight) (ratelimit.Release, ratelimit.Decision, error) {
			return f.AcquireWith(context.Background(), "k", rate, ratelimit.Unit)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newInFlight(t, ratelimit.InFlightLimit{Limit: 4})
			var inside, most, admitted atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range 1000 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 3 {
						release, d, err := tc.acquire(f)
						if !assert.NoError(t, err) || !d.Allowed {
							continue
						}
						admitted.Add(1)
						enter(&inside, &most)
						runtime.Gosched() // hold the slot while others try
						assert.LessOrEqual(t, f.InUse("k"), int64(4))
						inside.Add(-1)
						release()
						release() // a second release changes nothing
					}
				}()
			}
			close(start)
			wg.Wait()
			assert.LessOrEqual(t, most.Load(), int64(4), "more than 4 held at once")
			assert.Positive(t, admitted.Load())
			assert.Zero(t, f.InUse("k"))
			assert.Zero(t, f.Len(), "a key with nothing in flight holds no memory")
		})
	}
}

func TestInFlightDecisions(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 3, Name: "conc"}, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	var releases []ratelimit.Release
	for i, want := range []struct {
		allowed   bool
		remaining int64
	}{{true, 2}, {true, 1}, {true, 0}, {false, 0}, {false, 0}} {
		release, d, err := f.Acquire("k")
		require.NoError(t, err)
		assert.Equal(t, ratelimit.Decision{Allowed: want.allowed, Limit: 3, Remaining: want.remaining, Policy: "conc"}, d, "acquisition %d", i)
		releases = append(releases, release)
	}
	assert.Equal(t, int64(3), f.InUse("k"))
	assert.Zero(t, f.InUse("other"), "keys are apart")

	// A refused acquisition's Release does nothing.
	releases[3]()
	assert.Equal(t, int64(3), f.InUse("k"))

	// Releasing twice frees one slot, not two.
	releases[0]()
	releases[0]()
	assert.Equal(t, int64(2), f.InUse("k"))
	_, d, _ := f.Acquire("k")
	assert.True(t, d.Allowed)
	assert.Zero(t, d.Remaining)
	_, d, _ = f.Acquire("k")
	assert.False(t, d.Allowed, "the double release freed a second slot")
}

func TestInFlightReleaseConcurrently(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 2})
	r1, _, _ := f.Acquire("k")
	_, _, _ = f.Acquire("k")
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); r1() }()
	}
	wg.Wait()
	assert.Equal(t, int64(1), f.InUse("k"))
}

func TestInFlightMaxHold(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 2, MaxHold: 10 * time.Second}, ratelimit.WithClock(clk))
	leaked, _, _ := f.Acquire("k")
	clk.Advance(time.Second)
	second, _, _ := f.Acquire("k")

	clk.Set(10*time.Second - 1)
	_, d, _ := f.Acquire("k")
	assert.False(t, d.Allowed, "a nanosecond before MaxHold, the slot is still held")

	clk.Set(10 * time.Second)
	assert.Equal(t, int64(1), f.InUse("k"), "at MaxHold the first slot is taken back")
	third, d, _ := f.Acquire("k")
	require.True(t, d.Allowed)
	assert.Zero(t, d.Remaining)

	// The late release of a slot taken back frees nothing: the third
	// acquisition keeps its slot.
	leaked()
	assert.Equal(t, int64(2), f.InUse("k"))
	_, d, _ = f.Acquire("k")
	assert.False(t, d.Allowed)

	second()
	third()
	assert.Zero(t, f.InUse("k"))
	assert.Zero(t, f.Len())
}

// TestInFlightMaxHoldDropsLeakedKeys leaks a slot on many keys, and checks
// that once MaxHold has passed the limiter drops them as other keys come
// and go, without those keys ever being used again.
func TestInFlightMaxHoldDropsLeakedKeys(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 1, MaxHold: time.Minute}, ratelimit.WithClock(clk), ratelimit.WithShards(1))
	for i := range 10_000 {
		_, d, _ := f.Acquire("leak-" + strconv.Itoa(i))
		require.True(t, d.Allowed)
	}
	assert.Equal(t, 10_000, f.Len(), "slots held keep their keys")

	clk.Advance(time.Minute)
	for i := range 30_000 {
		release, d, _ := f.Acquire("live-" + strconv.Itoa(i))
		require.True(t, d.Allowed)
		if i%2 == 0 {
			release()
		}
	}
	// 15,000 live slots are held; the 10,000 leaked keys have been swept.
	assert.Equal(t, 15_000, f.Len())
}

func TestInFlightWithoutMaxHoldKeepsLeaks(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 1}, ratelimit.WithClock(clk))
	_, _, _ = f.Acquire("k")
	clk.Advance(100 * 365 * 24 * time.Hour)
	_, d, _ := f.Acquire("k")
	assert.False(t, d.Allowed, "without MaxHold a slot is held until released")
}

func TestInFlightBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit ratelimit.InFlightLimit
		opts  []ratelimit.Option
		want  error
		field string
	}{
		{"zero limit", ratelimit.InFlightLimit{}, nil, ratelimit.ErrInvalidRule, "Limit"},
		{"negative limit", ratelimit.InFlightLimit{Limit: -4}, nil, ratelimit.ErrInvalidRule, "Limit"},
		{"limit too large", ratelimit.InFlightLimit{Limit: 1e15 + 1}, nil, ratelimit.ErrInvalidRule, "Limit"},
		{"negative hold", ratelimit.InFlightLimit{Limit: 1, MaxHold: -1}, nil, ratelimit.ErrInvalidRule, "MaxHold"},
		{"hold too long", ratelimit.InFlightLimit{Limit: 1, MaxHold: ratelimit.MaxTime}, nil, ratelimit.ErrInvalidRule, "MaxHold"},
		{"no shards", ratelimit.InFlightLimit{Limit: 1}, []ratelimit.Option{ratelimit.WithShards(0)}, ratelimit.ErrInvalidOption, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ratelimit.NewInFlight(tc.limit, tc.opts...)
			assert.Nil(t, f)
			require.ErrorIs(t, err, tc.want)
			if tc.field != "" {
				var re *ratelimit.RuleError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, tc.field, re.Field)
			}
		})
	}

	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 1e15, MaxHold: ratelimit.MaxTime - 1})
	_, d, err := f.Acquire("")
	require.NoError(t, err)
	assert.True(t, d.Allowed, "an empty key is a key")

	t.Run("nil rate", func(t *testing.T) {
		var store *ratelimit.Store
		for _, rate := range []ratelimit.KeyedLimiter{nil, store} {
			release, d, err := f.AcquireWith(context.Background(), "k", rate, ratelimit.Unit)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.False(t, d.Allowed)
			release()
		}
		assert.Zero(t, f.InUse("k"))
	})

	t.Run("cost errors take no slot", func(t *testing.T) {
		rate, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2})
		require.NoError(t, err)
		for cost, want := range map[ratelimit.Units]error{0: ratelimit.ErrInvalidCost, -1: ratelimit.ErrInvalidCost, 3 * ratelimit.Unit: ratelimit.ErrCostExceedsCapacity} {
			release, d, err := f.AcquireWith(context.Background(), "k", rate, cost)
			require.ErrorIs(t, err, want)
			assert.False(t, d.Allowed)
			release()
		}
		assert.Zero(t, f.InUse("k"))
		assert.Equal(t, 1, f.Len(), "only the empty key's slot is held")
	})
}

func TestInFlightLongKeys(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 1})
	long := strings.Repeat("x", ratelimit.MaxKeyLen+1)
	_, d, _ := f.Acquire(long)
	require.True(t, d.Allowed)
	for _, other := range []string{long + "y", strings.Repeat("x", ratelimit.MaxKeyLen), long[:ratelimit.MaxKeyLen-1] + "y"} {
		_, d, _ = f.Acquire(other)
		assert.True(t, d.Allowed, "a key of %d bytes shares another's slots", len(other))
	}
	_, d, _ = f.Acquire(strings.Clone(long))
	assert.False(t, d.Allowed, "a long key is the same key each time")
	assert.Equal(t, int64(1), f.InUse(long))
}

// blockingRate is a rate limiter that admits everything, each check
// blocking until told to go on: it stands for a slow backend.
type blockingRate struct {
	entered chan struct{}
	proceed chan struct{}
}

func (b *blockingRate) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	b.entered <- struct{}{}
	<-b.proceed
	return ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 99}, nil
}

func TestInFlightContext(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 2})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	release, d, err := f.AcquireContext(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, d.Allowed)
	release()
	assert.Zero(t, f.Len())

	// An acquisition waiting for its turn behind a slow rate check gives
	// up when its context ends, taking nothing.
	rate := &blockingRate{entered: make(chan struct{}), proceed: make(chan struct{})}
	first := make(chan ratelimit.Decision)
	go func() {
		_, d, _ := f.AcquireWith(context.Background(), "k", rate, ratelimit.Unit)
		first <- d
	}()
	<-rate.entered // the first holds the key's turn
	ctx, cancel = context.WithCancel(context.Background())
	second := make(chan error)
	go func() {
		_, _, err := f.AcquireContext(ctx, "k")
		second <- err
	}()
	cancel()
	require.ErrorIs(t, <-second, context.Canceled)
	assert.Zero(t, f.InUse("k"))
	close(rate.proceed)
	assert.True(t, (<-first).Allowed)
	assert.Equal(t, int64(1), f.InUse("k"))
	_, d, _ = f.Acquire("other")
	assert.True(t, d.Allowed, "other keys do not wait for the slow check")
}

// TestInFlightWithRateProperty runs random acquisitions, plain and with a
// token bucket, releases (twice, too) and time against a model: a map of
// the slots each key holds, and the token bucket's reference model for
// each key. A request refused a slot must spend no allowance, and one the
// rate refuses must take no slot: both show in the next decisions.
func TestInFlightWithRateProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 3).Draw(t, "limit")
		hold := time.Duration(rapid.IntRange(0, 3).Draw(t, "holdSeconds")) * time.Second
		burst := rapid.Int64Range(1, 5).Draw(t, "burst")
		per := ratelimit.PerSecond(rapid.Int64Range(1, 3).Draw(t, "rate"))
		clk := ratelimit.NewManualClock(0)
		f, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: limit, MaxHold: hold, Name: "slots"}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		rate, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: per, Burst: burst}, ratelimit.WithClock(clk))
		require.NoError(t, err)

		type slot struct {
			release ratelimit.Release
			at      time.Duration
		}
		keys := []string{"a", "b", "c"}
		held := map[string][]slot{}
		buckets := map[string]*refmodel.Bucket{}
		var released []ratelimit.Release
		now := func() time.Duration { return clk.Now() }
		// expire drops the model's slots past MaxHold.
		expire := func(key string) {
			if hold == 0 {
				return
			}
			s := held[key][:0]
			for _, h := range held[key] {
				if h.at+hold > now() {
					s = append(s, h)
				}
			}
			held[key] = s
		}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.Int64Range(0, 1500).Draw(t, "ms")) * time.Millisecond)
			},
			"acquireWith": func(t *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(t, "key")
				release, d, err := f.AcquireWith(context.Background(), key, rate, ratelimit.Unit)
				require.NoError(t, err)
				expire(key)
				if int64(len(held[key])) >= limit {
					assert.Equal(t, ratelimit.Decision{Limit: limit, Policy: "slots", At: now()}, d, "no free slot")
					return
				}
				if buckets[key] == nil {
					buckets[key] = refmodel.NewBucket(per, burst)
				}
				want := buckets[key].Step(int64(now()), int64(ratelimit.Unit))
				assert.Equal(t, want.Allowed, d.Allowed)
				assert.Equal(t, want.Remaining, d.Remaining)
				assert.Equal(t, want.RetryAfter, d.RetryAfter)
				assert.Equal(t, want.ResetAfter, d.ResetAfter)
				if d.Allowed {
					held[key] = append(held[key], slot{release, now()})
				} else {
					released = append(released, release)
				}
			},
			"acquire": func(t *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(t, "key")
				release, d, err := f.Acquire(key)
				require.NoError(t, err)
				expire(key)
				free := limit - int64(len(held[key]))
				assert.Equal(t, free > 0, d.Allowed)
				assert.Equal(t, max(free-1, 0), d.Remaining)
				if d.Allowed {
					held[key] = append(held[key], slot{release, now()})
				}
			},
			"release": func(t *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(t, "key")
				expire(key)
				if len(held[key]) == 0 {
					t.Skip("nothing held")
				}
				i := rapid.IntRange(0, len(held[key])-1).Draw(t, "slot")
				held[key][i].release()
				released = append(released, held[key][i].release)
				held[key] = append(held[key][:i], held[key][i+1:]...)
			},
			"releaseAgain": func(t *rapid.T) {
				if len(released) == 0 {
					t.Skip("nothing released")
				}
				rapid.SampledFrom(released).Draw(t, "release")()
			},
			"": func(t *rapid.T) {
				for _, key := range keys {
					expire(key)
					require.Equal(t, int64(len(held[key])), f.InUse(key), "slots held by %q", key)
				}
			},
		})
	})
}

// TestInFlightWithRateConcurrently races acquisitions with a rate limit of
// 10 against a limit of 4 in flight: never more than 4 at once, at most 10
// in all, and the rate's allowance is spent by admissions alone.
func TestInFlightWithRateConcurrently(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 4}, ratelimit.WithClock(clk))
	rate, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 10, Window: time.Hour}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	var inside, most, admitted atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			release, d, err := f.AcquireWith(context.Background(), "k", rate, ratelimit.Unit)
			if !assert.NoError(t, err) || !d.Allowed {
				return
			}
			admitted.Add(1)
			enter(&inside, &most)
			inside.Add(-1)
			release()
		}()
	}
	close(start)
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(4))
	assert.LessOrEqual(t, admitted.Load(), int64(10))
	assert.Positive(t, admitted.Load())
	d, err := rate.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	left := int64(0) // what the rate still admits
	if d.Allowed {
		left = d.Remaining + 1
	}
	assert.Equal(t, 10-admitted.Load(), left, "the allowance spent is the admissions'")
}

func TestInFlightErrorsAreNotPanics(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 1})
	bad := errors.New("backend down")
	release, d, err := f.AcquireWith(context.Background(), "k", failingRate{bad}, ratelimit.Unit)
	require.ErrorIs(t, err, bad)
	assert.False(t, d.Allowed)
	release()
	assert.Zero(t, f.InUse("k"), "a failed rate check takes no slot")
}

type failingRate struct{ err error }

func (r failingRate) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, r.err
}

// TestInFlightDegradedRate: a rate limiter whose backend failed and whose
// failure policy admits (an error matching ErrDegraded, Allowed set)
// decides the rate, never the slot: the admission takes a slot, comes with
// the error and a Release that gives the slot back, and once the slots are
// taken the next request is refused without asking the rate. A degraded
// refusal takes none.
func TestInFlightDegradedRate(t *testing.T) {
	f := newInFlight(t, ratelimit.InFlightLimit{Limit: 2})
	ctx := context.Background()
	open := degradedRate{ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4}}
	var held []ratelimit.Release
	for i := range 2 {
		release, d, err := f.AcquireWith(ctx, "k", open, ratelimit.Unit)
		require.ErrorIs(t, err, ratelimit.ErrDegraded, "acquisition %d", i)
		assert.True(t, d.Allowed)
		assert.Equal(t, int64(4), d.Remaining, "the degraded Decision decides the rate")
		held = append(held, release)
	}
	assert.Equal(t, int64(2), f.InUse("k"))
	release, d, err := f.AcquireWith(ctx, "k", open, ratelimit.Unit)
	require.NoError(t, err, "no free slot: the rate is not asked")
	assert.False(t, d.Allowed)
	release()
	for _, r := range held {
		r()
	}
	assert.Zero(t, f.InUse("k"))

	closed := degradedRate{ratelimit.Decision{Limit: 5, RetryAfter: time.Second}}
	release, d, err = f.AcquireWith(ctx, "k", closed, ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrDegraded)
	assert.False(t, d.Allowed)
	release()
	assert.Zero(t, f.InUse("k"), "a degraded refusal takes no slot")
}

type degradedRate struct{ d ratelimit.Decision }

func (r degradedRate) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return r.d, fmt.Errorf("%w: backend down", ratelimit.ErrDegraded)
}
