package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitOnVirtualTime: Wait sleeps out RetryAfter on the store's clock and
// is admitted once the clock gets there.
func TestWaitOnVirtualTime(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	d, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	done := make(chan ratelimit.Decision)
	go func() {
		d, err := s.Wait(context.Background(), "k", ratelimit.Unit)
		assert.NoError(t, err)
		done <- d
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(time.Second)
	d = <-done
	assert.True(t, d.Allowed)

	// A wait longer than the context allows returns at once.
	short, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	d, err = s.Wait(short, "k", ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
	assert.False(t, d.Allowed)
}

// TestWaitSpendsNoRefusal: as in process, Wait's refused checks spend
// nothing even for rules that count refusals, on either path.
func TestWaitSpendsNoRefusal(t *testing.T) {
	rdb := needRedis(t)
	for _, rule := range []ratelimit.Rule{
		ratelimit.SlidingCounter{Limit: 3, Window: 10 * time.Second, CountRefused: true},
		ratelimit.SlidingCounter{Limit: 3, Window: 10*time.Second + 1, CountRefused: true}, // the exact path
		ratelimit.SubWindow{Limit: 3, Window: 10 * time.Second, Buckets: 5, CountRefused: true},
		ratelimit.SubWindow{Limit: 3, Window: 9_999_999_999, Buckets: 3, CountRefused: true}, // the exact path
	} {
		clk := ratelimit.NewManualClock(unixNow)
		paths := newPathStores(t, rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
		local, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for _, cost := range []ratelimit.Units{2 * ratelimit.Unit} {
			want, err := local.Check(cost)
			require.NoError(t, err)
			got, _, err := paths.check("k", cost)
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
		// A wait that would outlast its context returns the refusal at once.
		short, cancel := context.WithTimeout(context.Background(), time.Second)
		for range 3 {
			want, werr := local.Wait(short, 2*ratelimit.Unit)
			require.ErrorIs(t, werr, ratelimit.ErrWouldExceedDeadline)
			got, gerr := paths.fast.Wait(short, "k", 2*ratelimit.Unit)
			if gerr != nil && strings.Contains(gerr.Error(), declined) {
				got, gerr = paths.exact.Wait(short, "k", 2*ratelimit.Unit)
			}
			require.ErrorIs(t, gerr, ratelimit.ErrWouldExceedDeadline)
			require.Equal(t, want, got)
			clk.Advance(1)
		}
		cancel()
		// Nothing was spent: the next checks decide as in process.
		for _, cost := range []ratelimit.Units{ratelimit.Unit, ratelimit.Unit} {
			want, err := local.Check(cost)
			require.NoError(t, err)
			got, _, err := paths.check("k", cost)
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
		for _, s := range []*Store{paths.fast, paths.exact} {
			require.Zero(t, s.Stats().Mismatches)
		}
	}
}

// TestLeakyWaitSpendsNothingPastDeadline: a leaky bucket's Wait whose Delay
// would not end before its deadline gives up at once and spends nothing,
// whether the queue has room now (the request would be admitted with too
// long a Delay) or only after a RetryAfter that itself fits the deadline,
// as in process.
func TestLeakyWaitSpendsNothingPastDeadline(t *testing.T) {
	rdb := needRedis(t)
	rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5}
	for _, queued := range []ratelimit.Units{3 * ratelimit.Unit, 5 * ratelimit.Unit} {
		clk := ratelimit.NewManualClock(unixNow)
		s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		local, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for _, lim := range []ratelimit.KeyedLimiter{s, local} {
			d, err := lim.Check("k", queued)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		// Admitted now with a Delay of 3 s, or after a RetryAfter of 1 s
		// with a Delay of 4 s: neither fits a deadline 2 s away.
		requireWaitGivesUp(t, local, s, fmt.Sprintf("queued %d", queued))
	}
}

// waiter is a keyed limiter with Wait.
type waiter interface {
	ratelimit.KeyedLimiter
	Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error)
}

// requireWaitGivesUp: a Wait of one unit for key "k" with a deadline 2 s
// away, which the request could not go on before, gives up at once on got
// as on want, with the same refusal, and spends nothing: the next check
// is decided alike.
func requireWaitGivesUp(t *testing.T, want, got waiter, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	start := time.Now()
	wd, werr := want.Wait(ctx, "k", ratelimit.Unit)
	gd, gerr := got.Wait(ctx, "k", ratelimit.Unit)
	cancel()
	require.ErrorIs(t, werr, ratelimit.ErrWouldExceedDeadline)
	require.ErrorIs(t, gerr, ratelimit.ErrWouldExceedDeadline, what)
	require.Less(t, time.Since(start), time.Second, "Wait slept towards a deadline it could not meet")
	require.Equal(t, wd, gd, what)
	// Nothing was spent: the next check is decided as in process.
	wd, err := want.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	gd, err = got.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, wd, gd, what)
}
