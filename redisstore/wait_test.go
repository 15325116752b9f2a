package redisstore

import (
	"context"
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
