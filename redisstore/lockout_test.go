package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// drawLockout draws a valid lockout rule: durations of a few ns (so that
// spans and blocks overlap often) or of years (so that times pass 2^53
// and blocks grow large).
func drawLockout(t *rapid.T) ratelimit.LockoutRule {
	dur := func(label string) time.Duration {
		return time.Duration(rapid.OneOf(rapid.Int64Range(1, 50), rapid.Int64Range(int64(time.Second), int64(3*year))).Draw(t, label))
	}
	r := ratelimit.LockoutRule{
		Failures: rapid.Int64Range(1, 4).Draw(t, "failures"),
		Within:   dur("within"),
		Block:    dur("block"),
		Growth:   rapid.Int64Range(0, 3).Draw(t, "growth"),
		Name:     rapid.SampledFrom([]string{"", "login"}).Draw(t, "name"),
	}
	if rapid.Bool().Draw(t, "capped") {
		r.MaxBlock = r.Block + dur("extra")
	}
	if r.Growth >= 2 || rapid.Bool().Draw(t, "forget anyway") {
		r.Forget = dur("forget")
	}
	return r
}

// TestLockoutSameDecisionsAsInProcess runs a Lockout in Redis beside the
// in-process Lockout on random traces, on one client clock: every
// Decision of Check and Fail and every started flag are the same, field
// for field, from Unix times past 2^53 ns up to MaxTime.
func TestLockoutSameDecisionsAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		rule := drawLockout(t)
		start := rapid.SampledFrom([]time.Duration{0, unixNow, ratelimit.MaxTime - year}).Draw(t, "start")
		clk := ratelimit.NewManualClock(start)
		local, err := ratelimit.NewLockout(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		l, err := NewLockout(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		ctx := context.Background()
		keys := []string{"a", "b"}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.OneOf(rapid.Int64Range(0, 60), rapid.Int64Range(0, int64(4*year))).Draw(t, "by")))
			},
			"check": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				want := local.Check(k)
				got, err := l.Check(ctx, k)
				require.NoError(t, err)
				require.Equal(t, want, got, "check %q at %d", k, clk.Now())
			},
			"fail": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				want, wantStarted := local.Fail(k)
				got, started, err := l.Fail(ctx, k)
				require.NoError(t, err)
				require.Equal(t, want, got, "fail %q at %d", k, clk.Now())
				require.Equal(t, wantStarted, started, "fail %q at %d", k, clk.Now())
			},
			"reset": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				local.Reset(k)
				require.NoError(t, l.Reset(ctx, k))
			},
		})
		require.Zero(t, l.Stats())
	})
}

// TestLockoutConcurrentFailuresStartOneBlock sends failures of one key at
// once from three clients (three processes' connections), on the server's
// clock: exactly one starts the block, exactly Failures-1 are allowed
// before it, and every process then sees the key blocked.
func TestLockoutConcurrentFailuresStartOneBlock(t *testing.T) {
	needRedis(t)
	rule := ratelimit.LockoutRule{Failures: 5, Within: time.Hour, Block: time.Hour, Name: "login"}
	prefix := testPrefix()
	var lockouts []*Lockout
	for range 3 {
		c := shared.Client(nil)
		t.Cleanup(func() { c.Close() })
		l, err := NewLockout(c, rule, WithPrefix(prefix), WithTimeout(10*time.Second))
		require.NoError(t, err)
		lockouts = append(lockouts, l)
	}
	const perClient = 20
	var (
		mu               sync.Mutex
		started, allowed int
	)
	var wg sync.WaitGroup
	for _, l := range lockouts {
		for range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, s, err := l.Fail(context.Background(), "10.0.0.1")
				assert.NoError(t, err)
				mu.Lock()
				defer mu.Unlock()
				if s {
					started++
				}
				if d.Allowed {
					allowed++
				}
			}()
		}
	}
	wg.Wait()
	assert.Equal(t, 1, started, "blocks started")
	assert.Equal(t, 4, allowed, "failures allowed before the block")
	for _, l := range lockouts {
		d, err := l.Check(context.Background(), "10.0.0.1")
		require.NoError(t, err)
		assert.False(t, d.Allowed)
		assert.Greater(t, d.RetryAfter, 59*time.Minute)
	}
}

// TestLockoutFailurePolicies stops Redis under lockouts of each policy:
// by default a key reads as blocked (fail closed), FailOpen lets it
// through, a fallback counts on its own; every answer carries an error
// matching ErrUnavailable and ErrDegraded; and once Redis is back, its
// state decides again.
func TestLockoutFailurePolicies(t *testing.T) {
	srv := drillServer(t)
	// A dead Redis refuses connections at once; the long deadline keeps a
	// loaded machine from turning Redis's answers into the policy's.
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	defer rdb.Close()
	rule := ratelimit.LockoutRule{Failures: 2, Within: time.Hour, Block: time.Hour}
	clk := ratelimit.NewManualClock(unixNow)
	fallback, err := ratelimit.NewLockout(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	opts := []Option{WithClock(clk), WithTimeout(5 * time.Second), WithCircuit(2, 50*time.Millisecond)}
	closed, err := NewLockout(rdb, rule, opts...)
	require.NoError(t, err)
	open, err := NewLockout(rdb, rule, append(opts, WithFailureMode(FailOpen))...)
	require.NoError(t, err)
	local, err := NewLockout(rdb, rule, append(opts, WithLockoutFallback(fallback))...)
	require.NoError(t, err)
	ctx := context.Background()

	_, _, err = closed.Fail(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	for range 4 { // through Redis's errors, then the open circuit
		d, err := closed.Check(ctx, "fresh")
		require.ErrorIs(t, err, ErrUnavailable)
		require.ErrorIs(t, err, ratelimit.ErrDegraded)
		assert.False(t, d.Allowed, "fail closed: a lockout that cannot ask Redis refuses")
		assert.Equal(t, 50*time.Millisecond, d.RetryAfter)
		d, started, err := closed.Fail(ctx, "fresh")
		require.ErrorIs(t, err, ErrUnavailable)
		assert.False(t, d.Allowed)
		assert.False(t, started)

		d, err = open.Check(ctx, "fresh")
		require.ErrorIs(t, err, ErrUnavailable)
		assert.True(t, d.Allowed, "fail open")
		assert.Equal(t, int64(2), d.Remaining)
	}
	d, started, err := local.Fail(ctx, "x")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.True(t, d.Allowed)
	assert.False(t, started)
	d, started, err = local.Fail(ctx, "x")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.True(t, started, "the fallback counts failures on its own")
	assert.False(t, d.Allowed)
	assert.False(t, fallback.Check("x").Allowed)
	assert.NotZero(t, closed.Stats().CircuitRefusals)

	require.NoError(t, srv.Restart())
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := closed.Check(ctx, "k")
		if err == nil {
			// Redis restarted without persistence: the key's one failure
			// is gone, and the key is fresh.
			assert.True(t, d.Allowed)
			assert.Equal(t, int64(2), d.Remaining)
			break
		}
		require.True(t, errors.Is(err, ErrUnavailable), "%v", err)
		require.True(t, time.Now().Before(deadline), "checks did not resume: %v", err)
		time.Sleep(10 * time.Millisecond) // waiting out the circuit's pause on the wall clock
	}
	d, started, err = closed.Fail(ctx, "k")
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.False(t, started)
	_, started, err = closed.Fail(ctx, "k")
	require.NoError(t, err)
	assert.True(t, started)
}

// TestLockoutCorruptedStateRefuses: a state the rule could not have
// written blocks the key with ErrInvalidState, whatever the policy.
func TestLockoutCorruptedStateRefuses(t *testing.T) {
	rdb := needRedis(t)
	rule := ratelimit.LockoutRule{Failures: 2, Within: time.Hour, Block: time.Hour}
	l, err := NewLockout(rdb, rule, WithPrefix(testPrefix()), WithFailureMode(FailOpen))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, l.Key("k"), "12 x", 0).Err())
	d, err := l.Check(ctx, "k")
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	assert.False(t, d.Allowed)
	d, _, err = l.Fail(ctx, "k")
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	assert.False(t, d.Allowed)
	assert.Equal(t, uint64(2), l.Stats().InvalidStates)
}
