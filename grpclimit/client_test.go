package grpclimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
)

// attempts returns a server option counting the calls that reach the
// server, refused or not.
func attempts(n *int64Counter) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		n.add()
		return h(ctx, req)
	})
}

type int64Counter struct{ ch chan struct{} }

func newCounter() *int64Counter    { return &int64Counter{ch: make(chan struct{}, 100)} }
func (c *int64Counter) add()       { c.ch <- struct{}{} }
func (c *int64Counter) count() int { return len(c.ch) }

// retrying serves the echo service limited by a store of rule on a
// ManualClock, to a client whose interceptor waits on the same clock.
func retrying(t *testing.T, rule ratelimit.Rule, copts ...grpclimit.ClientOption) (*grpc.ClientConn, *ratelimit.ManualClock, *int64Counter) {
	t.Helper()
	store, clk := newStore(t, rule)
	n := newCounter()
	opts := append([]grpc.ServerOption{attempts(n)}, limited(store, byAPIKey)...)
	copts = append([]grpclimit.ClientOption{grpclimit.WithClock(clk)}, copts...)
	cc, _ := serve(t, opts, grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(copts...)))
	return cc, clk, n
}

func TestClientRetriesAfterRetryInfoOnVirtualTime(t *testing.T) {
	cc, clk, n := retrying(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 1})
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, "alice"); done <- err }()
	// Refused once, the client sleeps exactly the 250 ms the server asked.
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	wake, ok := clk.NextWake()
	require.True(t, ok)
	assert.Equal(t, 250*time.Millisecond, wake)
	assert.Equal(t, 2, n.count())
	clk.Advance(250 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the retried call never ended")
	}
	assert.Equal(t, 3, n.count())
}

// refuser refuses every call, asking for a second.
type refuser struct{}

func (refuser) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{Limit: 1, RetryAfter: time.Second, Window: time.Second}, nil
}

func TestClientGivesUpAfterItsRetries(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	n := newCounter()
	opts := append([]grpc.ServerOption{attempts(n)}, limited(refuser{})...)
	cc, _ := serve(t, opts, grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(
		grpclimit.WithClock(clk), grpclimit.WithRetries(1))))
	givesUpAfterOneRetry(t, cc, clk, n, codes.ResourceExhausted)
}

// givesUpAfterOneRetry makes a call through a client allowed one retry to
// a server that refuses it with code, asking for a second each time, and
// checks that the refusal comes back after the retry.
func givesUpAfterOneRetry(t *testing.T, cc *grpc.ClientConn, clk *ratelimit.ManualClock, n *int64Counter, code codes.Code) {
	t.Helper()
	ctx := testCtx(t)
	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, ""); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	wake, ok := clk.NextWake()
	require.True(t, ok)
	clk.Set(wake)
	select {
	case err := <-done:
		assert.Equal(t, code, status.Code(err))
		d, ok := grpclimit.RetryDelay(err)
		assert.True(t, ok)
		assert.Equal(t, time.Second, d)
	case <-ctx.Done():
		t.Fatal("the call never ended")
	}
	assert.Equal(t, 2, n.count(), "one call and one retry")
	assert.Zero(t, clk.Sleepers())
}

func TestClientReturnsRefusalAfterLastRetry(t *testing.T) {
	cc, _, n := retrying(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}, grpclimit.WithRetries(0))
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	_, _, err = say(ctx, cc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	d, ok := grpclimit.RetryDelay(err)
	require.True(t, ok)
	assert.Equal(t, time.Second, d)
	assert.Equal(t, 2, n.count())
}

func TestClientNeverRetriesPastTheDeadline(t *testing.T) {
	cc, clk, n := retrying(t, ratelimit.GCRA{Rate: ratelimit.Every(time.Hour), Burst: 1})
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)

	// The server asks for an hour; the call has ten seconds.
	_, _, err = say(ctx, cc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Zero(t, clk.Sleepers())
	assert.Equal(t, 2, n.count())
}

func TestClientMaxRetryDelay(t *testing.T) {
	cc, clk, n := retrying(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1},
		grpclimit.WithMaxRetryDelay(999*time.Millisecond))
	// The call's deadline (10 s) is far beyond the delay (1 s): only the cap
	// stops the wait, and a wait the cap fails to stop ends with the
	// deadline rather than hanging.
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	_, _, err = say(ctx, cc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Zero(t, clk.Sleepers())
	assert.Equal(t, 2, n.count())
}

func TestClientCancelledDuringRetryDelay(t *testing.T) {
	cc, clk, n := retrying(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, _, err := say(cctx, cc, "alice"); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	cancel()
	select {
	case err := <-done:
		assert.Equal(t, codes.Canceled, status.Code(err))
	case <-ctx.Done():
		t.Fatal("the cancelled call never ended")
	}
	assert.Equal(t, 2, n.count(), "no retry after the cancellation")
}

func TestClientPacer(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	pacer, err := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 1}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	n := newCounter()
	cc, _ := serve(t, []grpc.ServerOption{attempts(n)},
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.WithPacer(pacer), grpclimit.WithClock(clk))),
		grpc.WithChainStreamInterceptor(grpclimit.StreamClientInterceptor(grpclimit.WithPacer(pacer), grpclimit.WithClock(clk))))
	ctx := testCtx(t)

	_, _, err = say(ctx, cc, "")
	require.NoError(t, err)

	// The next call waits 100 ms of the pacer's clock before it is sent.
	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, ""); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	assert.Equal(t, 1, n.count())
	clk.Advance(100 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the paced call never went")
	}
	assert.Equal(t, 2, n.count())

	// A stream waits its turn too.
	go func() {
		cs, err := chat(ctx, cc, "")
		if err == nil {
			_, err = roundTrip(cs, "x")
		}
		done <- err
	}()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(100 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the paced stream never opened")
	}

	// A wait the deadline cannot cover fails at once, spending nothing.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err = say(dctx, cc, "")
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Zero(t, clk.Sleepers())
}

func TestClientKeyedPacer(t *testing.T) {
	store, clk := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	var keys []string
	key := func(_ context.Context, method string) string { keys = append(keys, method); return method }
	cc, _ := serve(t, nil, grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(
		grpclimit.WithKeyedPacer(store, key), grpclimit.WithPaceCost(func(string) ratelimit.Units { return 2 * ratelimit.Unit }))))
	// A cost the pacer can never admit is the caller's mistake.
	_, _, err := say(testCtx(t), cc, "")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, []string{sayMethod}, keys)
	assert.Zero(t, clk.Sleepers())
}

// shedServer serves the echo service behind a WorkerShedder of one class
// and limit 1 that asks for retry (its RetryAfter), counting every call
// that reaches the server, to a client whose interceptor waits on a
// ManualClock. The test fills the shedder's place itself.
func shedServer(t *testing.T, retry time.Duration, copts ...grpclimit.ClientOption) (*grpc.ClientConn, *echo, *ratelimit.WorkerShedder, *ratelimit.ManualClock, *int64Counter) {
	t.Helper()
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 1, Classes: []ratelimit.ShedClass{{Name: "only", Share: 100}},
		RetryAfter: retry, Name: "workers"})
	require.NoError(t, err)
	clk := ratelimit.NewManualClock(0)
	n := newCounter()
	copts = append([]grpclimit.ClientOption{grpclimit.WithClock(clk)}, copts...)
	cc, svc := serve(t, []grpc.ServerOption{attempts(n), grpc.ChainUnaryInterceptor(grpclimit.UnaryShedInterceptor(s, nil))},
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(copts...)))
	return cc, svc, s, clk, n
}

// A call shed (Unavailable with RetryInfo) is tried again after the delay
// it carries (with no jitter drawn here), and goes through once the server
// has room.
func TestClientRetriesShedCall(t *testing.T) {
	cc, svc, s, clk, n := shedServer(t, 300*time.Millisecond, grpclimit.WithRandom(func(int64) int64 { return 0 }))
	ctx := testCtx(t)
	rel, d, err := s.Admit(ctx, 0)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, ""); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1), "the shed call is waited out, not returned")
	wake, ok := clk.NextWake()
	require.True(t, ok)
	assert.Equal(t, 300*time.Millisecond, wake)
	assert.Equal(t, 1, n.count())
	rel()
	clk.Advance(300 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the retried call never ended")
	}
	assert.Equal(t, 2, n.count())
	assert.Equal(t, int64(1), svc.calls.Load())
}

// A shed call retried as often as WithRetries allows returns Unavailable
// with its delay; one whose delay reaches its deadline returns at once.
func TestClientShedRetriesBounded(t *testing.T) {
	t.Run("retries", func(t *testing.T) {
		cc, svc, s, clk, n := shedServer(t, time.Second, grpclimit.WithRetries(1))
		ctx := testCtx(t)
		rel, _, err := s.Admit(ctx, 0)
		require.NoError(t, err)
		defer rel()
		givesUpAfterOneRetry(t, cc, clk, n, codes.Unavailable)
		assert.Zero(t, svc.calls.Load())
	})
	t.Run("deadline", func(t *testing.T) {
		cc, _, s, clk, n := shedServer(t, time.Hour)
		ctx := testCtx(t)
		rel, _, err := s.Admit(ctx, 0)
		require.NoError(t, err)
		defer rel()
		_, _, err = say(ctx, cc, "") // an hour asked, ten seconds left
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Zero(t, clk.Sleepers())
		assert.Equal(t, 1, n.count())
	})
}

// Unavailable without RetryInfo (a broken connection, a server failing
// closed) is returned as it is, never retried.
func TestClientUnavailableWithoutRetryInfo(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	n := newCounter()
	down := grpc.ChainUnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.Unavailable, "down")
	})
	cc, _ := serve(t, []grpc.ServerOption{attempts(n), down},
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.WithClock(clk))))
	_, _, err := say(testCtx(t), cc, "")
	assert.Equal(t, codes.Unavailable, status.Code(err))
	_, ok := grpclimit.RetryDelay(err)
	assert.False(t, ok)
	assert.Equal(t, 1, n.count())
	assert.Zero(t, clk.Sleepers())
}

// firstRetryAt makes a call with key through cc, which the server
// refuses, and returns when the client's first retry is due on clk; the
// call is then cancelled.
func firstRetryAt(t *testing.T, ctx context.Context, cc *grpc.ClientConn, clk *ratelimit.ManualClock, key string) time.Duration {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _, _, _ = say(cctx, cc, key); close(done) }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	wake, ok := clk.NextWake()
	require.True(t, ok)
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the cancelled call never ended")
	}
	return wake
}

// jitteredWake returns when a shed call through a client with copts, to a
// server shedding with delay retry, is first retried on the client's
// ManualClock, and the bound n the jitter was drawn below (0 if it was
// not drawn), the random source giving pick(n).
func jitteredWake(t *testing.T, retry time.Duration, pick func(n int64) int64, copts ...grpclimit.ClientOption) (wake, bound time.Duration) {
	t.Helper()
	var drawn atomic.Int64
	random := grpclimit.WithRandom(func(n int64) int64 {
		drawn.Store(n)
		return pick(n)
	})
	cc, _, s, clk, _ := shedServer(t, retry, append(copts, random)...)
	ctx := testCtx(t)
	rel, _, err := s.Admit(ctx, 0)
	require.NoError(t, err)
	defer rel()
	wake = firstRetryAt(t, ctx, cc, clk, "")
	return wake, time.Duration(drawn.Load())
}

// A shed call's retry waits the server's delay plus a jitter drawn
// uniformly from [0, half the delay]: never earlier than the delay, at
// most half as long again, within WithMaxRetryDelay and before the call's
// deadline.
func TestClientJittersShedRetry(t *testing.T) {
	const retry = 300 * time.Millisecond
	most := retry + retry/2
	least := func(int64) int64 { return 0 }
	highest := func(n int64) int64 { return n - 1 }

	wake, bound := jitteredWake(t, retry, least)
	assert.Equal(t, retry, wake, "never earlier than the server's delay")
	assert.Equal(t, most-retry+1, bound)
	wake, _ = jitteredWake(t, retry, highest)
	assert.Equal(t, most, wake, "at most half as long again")
	wake, _ = jitteredWake(t, retry, func(n int64) int64 { return n / 2 })
	assert.Equal(t, retry+(most-retry+1)/2, wake)

	wake, bound = jitteredWake(t, retry, highest, grpclimit.WithMaxRetryDelay(retry+time.Millisecond))
	assert.Equal(t, retry+time.Millisecond, wake, "within the cap")
	assert.Equal(t, time.Millisecond+1, bound)
	wake, bound = jitteredWake(t, retry, highest, grpclimit.WithMaxRetryDelay(retry))
	assert.Equal(t, retry, wake, "a cap equal to the delay leaves no jitter")
	assert.Zero(t, bound)

	// The call has ten seconds (testCtx): a retry asked for after 9.9 s is
	// made before the deadline.
	wake, _ = jitteredWake(t, 9900*time.Millisecond, highest)
	assert.GreaterOrEqual(t, wake, 9900*time.Millisecond)
	assert.Less(t, wake, 10*time.Second)
}

// A rate limit's refusal, whose delay is exact for its client, is retried
// after exactly its delay: no jitter is drawn.
func TestClientRateLimitRetryHasNoJitter(t *testing.T) {
	var drawn atomic.Bool
	cc, clk, _ := retrying(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 1},
		grpclimit.WithRandom(func(n int64) int64 { drawn.Store(true); return n - 1 }))
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, firstRetryAt(t, ctx, cc, clk, "alice"))
	assert.False(t, drawn.Load())
}
