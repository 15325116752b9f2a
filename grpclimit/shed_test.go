package grpclimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
)

var shedClasses = []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: 90}, {Name: "sheddable", Share: 70}}

// A call shed ends Unavailable with RetryInfo, before the rate limit is
// asked: it spends nothing, and a client over its quota still gets
// ResourceExhausted.
func TestShedUnavailableBeforeRateLimit(t *testing.T) {
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses, Name: "workers", RetryAfter: 2 * time.Second})
	require.NoError(t, err)
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1, Name: "api"})
	classOf := grpclimit.TrustedClassMetadata("x-priority", s, 1)
	cc, svc := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(
		grpclimit.UnaryShedInterceptor(s, classOf),
		grpclimit.UnaryServerInterceptor(store, byAPIKey),
	)})
	ctx := testCtx(t)

	var held []ratelimit.Release
	for range 9 { // 90%: default is refused from here
		rel, d, err := s.Admit(ctx, 0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		held = append(held, rel)
	}
	_, _, err = say(ctx, cc, "alice")
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), `class "default"`)
	var delay time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	assert.Equal(t, 2*time.Second, delay, "the refusal carries RetryInfo: %v", err)
	assert.Zero(t, svc.calls.Load())

	// Critical, from trusted metadata, is admitted (default stays
	// refused until below 80%); the rate limit was not asked for the call
	// shed, so alice's one is left.
	held[8]()
	_, _, err = say(ctx, cc, "alice")
	assert.Equal(t, codes.Unavailable, status.Code(err), "hysteresis: 80% is not below 90% - 10")
	critCtx := metadata.AppendToOutgoingContext(ctx, "x-priority", "critical")
	_, _, err = say(critCtx, cc, "alice")
	require.NoError(t, err)
	_, _, err = say(critCtx, cc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "over quota is not overload")
	for _, r := range held {
		r()
	}
	assert.Zero(t, s.InUse())
}

// The place is given back when the handler returns, panics, or returns as
// its call's context ends; a call whose context had ended takes nothing.
func TestShedInterceptorReleases(t *testing.T) {
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses})
	require.NoError(t, err)
	unary := grpclimit.UnaryShedInterceptor(s, grpclimit.MethodClasses(map[string]ratelimit.Priority{"/x/Pay": 0}, 2))
	info := &grpc.UnaryServerInfo{FullMethod: "/x/Pay"}

	_, err = unary(context.Background(), nil, info, func(context.Context, any) (any, error) {
		assert.Equal(t, int64(1), s.InUse())
		return "ok", nil
	})
	require.NoError(t, err)
	assert.Zero(t, s.InUse(), "return")

	func() {
		defer func() { assert.NotNil(t, recover()) }()
		_, _ = unary(context.Background(), nil, info, func(context.Context, any) (any, error) { panic("boom") })
	}()
	assert.Zero(t, s.InUse(), "panic")

	ctx, cancel := context.WithCancel(context.Background())
	started, done := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := unary(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never ran")
	}
	assert.Equal(t, int64(1), s.InUse())
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not end with its context")
	}
	assert.Zero(t, s.InUse(), "cancellation")

	_, err = unary(ctx, nil, info, func(context.Context, any) (any, error) {
		t.Error("a call whose context had ended reached its handler")
		return nil, nil
	})
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Zero(t, s.InUse())
}

func TestShedStream(t *testing.T) {
	s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 1, Classes: []ratelimit.ShedClass{{Name: "only", Share: 100}}})
	require.NoError(t, err)
	cc, _ := serve(t, []grpc.ServerOption{grpc.StreamInterceptor(grpclimit.StreamShedInterceptor(s, nil))})
	ctx := testCtx(t)
	first, err := chat(ctx, cc, "")
	require.NoError(t, err)
	got, err := roundTrip(first, "a")
	require.NoError(t, err)
	assert.Equal(t, "a", got)
	second, err := chat(ctx, cc, "")
	require.NoError(t, err)
	_, err = roundTrip(second, "b")
	assert.Equal(t, codes.Unavailable, status.Code(err))
	require.NoError(t, first.CloseSend())
	_, err = roundTrip(first, "")
	require.Error(t, err) // io.EOF: the stream ended and gave its place back
	require.Eventually(t, func() bool { n, _ := s.InUse(ctx); return n == 0 }, 10*time.Second, time.Millisecond)
	third, err := chat(ctx, cc, "")
	require.NoError(t, err)
	got, err = roundTrip(third, "c")
	require.NoError(t, err)
	assert.Equal(t, "c", got)
}

type brokenCounter struct{}

func (brokenCounter) Acquire(context.Context, int64) (ratelimit.Release, ratelimit.Decision, error) {
	return func() {}, ratelimit.Decision{}, errors.New("down")
}
func (brokenCounter) InUse(context.Context) (int64, error) { return 0, errors.New("down") }

func TestShedCounterFailsOpenOrClosed(t *testing.T) {
	s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 1, Classes: shedClasses[:1], Counter: brokenCounter{}})
	require.NoError(t, err)
	info := &grpc.UnaryServerInfo{FullMethod: "/x/Pay"}
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	got, err := grpclimit.UnaryShedInterceptor(s, nil)(context.Background(), nil, info, ok)
	require.NoError(t, err)
	assert.Equal(t, "ok", got)
	_, err = grpclimit.UnaryShedInterceptor(s, nil, grpclimit.WithErrorHandler(grpclimit.FailClosed))(context.Background(), nil, info, ok)
	assert.Equal(t, codes.Unavailable, status.Code(err))
}
