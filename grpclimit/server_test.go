package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
)

// limited returns the interceptor options for lim with opts.
func limited(lim ratelimit.KeyedLimiter, opts ...grpclimit.Option) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, opts...)),
	}
}

var byAPIKey = grpclimit.WithKey(grpclimit.MetadataKey("X-API-Key", nil))

// newStore builds a store for rule on a ManualClock at 0.
func newStore(t *testing.T, rule ratelimit.Rule) (*ratelimit.Store, *ratelimit.ManualClock) {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	return store, clk
}

func TestUnaryAdmitsThenRefusesWithExactRetryInfo(t *testing.T) {
	// 3 a second, 2 at once: the third call at t=0 must wait a third of a
	// second, rounded up to the nanosecond.
	store, clk := newStore(t, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(3), Burst: 2, Name: "api"})
	cc, svc := serve(t, limited(store, byAPIKey))
	ctx := testCtx(t)

	got, hdr, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	assert.Equal(t, "hi", got)
	assert.Equal(t, []string{`"api";q=3;w=1`}, hdr.Get("ratelimit-policy"))
	assert.Equal(t, []string{`"api";r=1;t=1`}, hdr.Get("ratelimit"))

	_, hdr, err = say(ctx, cc, "alice")
	require.NoError(t, err)
	assert.Equal(t, []string{`"api";r=0;t=1`}, hdr.Get("ratelimit"))

	_, hdr, err = say(ctx, cc, "alice")
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, ok := grpclimit.RetryDelay(err)
	require.True(t, ok, "the refusal carries RetryInfo: %v", err)
	assert.Equal(t, 333_333_334*time.Nanosecond, delay)
	assert.Equal(t, []string{`"api";q=3;w=1`}, hdr.Get("ratelimit-policy"))
	assert.Equal(t, []string{`"api";r=0;t=1`}, hdr.Get("ratelimit"))
	assert.Equal(t, int64(2), svc.calls.Load(), "a refused call never reaches its handler")

	// Another key has its own allowance.
	_, _, err = say(ctx, cc, "bob")
	require.NoError(t, err)

	// One nanosecond early is still too early; at the delay it passes.
	clk.Advance(delay - 1)
	_, _, err = say(ctx, cc, "alice")
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	d, _ := grpclimit.RetryDelay(err)
	assert.Equal(t, time.Nanosecond, d)
	clk.Advance(1)
	_, _, err = say(ctx, cc, "alice")
	require.NoError(t, err)
}

func TestMissingAPIKeyIsUnauthenticatedEvenFailingOpen(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	cc, svc := serve(t, limited(store, byAPIKey, grpclimit.WithErrorHandler(grpclimit.FailOpen)))
	ctx := testCtx(t)

	_, _, err := say(ctx, cc, "")
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "x-api-key")

	_, err = roundTrip(mustChat(t, ctx, cc, ""), "x")
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Zero(t, svc.calls.Load())

	// With a fallback, a call without the key is keyed by its peer.
	cc2, _ := serve(t, limited(store, grpclimit.WithKey(grpclimit.MetadataKey("x-api-key", grpclimit.PeerAddr{}.Key))))
	_, _, err = say(ctx, cc2, "")
	require.NoError(t, err)
	_, _, err = say(ctx, cc2, "")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "the peer's allowance is spent")
}

func TestKeyFuncStatusIsReturned(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	key := func(context.Context, string, metadata.MD) (string, error) {
		return "", status.Error(codes.InvalidArgument, "no tenant")
	}
	cc, _ := serve(t, limited(store, grpclimit.WithKey(key)))
	_, _, err := say(testCtx(t), cc, "")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, "no tenant", status.Convert(err).Message())
}

func TestBadCostIsInvalidArgument(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2, Name: "api"})
	for _, tc := range []struct {
		name   string
		cost   grpclimit.CostFunc
		policy []string
	}{
		{"above capacity", grpclimit.MethodCosts(map[string]ratelimit.Units{sayMethod: 3 * ratelimit.Unit}, ratelimit.Unit), []string{`"api";q=2;w=2`}},
		{"zero", grpclimit.FixedCost(0), nil},
		{"negative", grpclimit.FixedCost(-ratelimit.Unit), nil},
		{"cost error", func(context.Context, string, metadata.MD) (ratelimit.Units, error) {
			return 0, errors.New("unpriced")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, svc := serve(t, limited(store, byAPIKey, grpclimit.WithCost(tc.cost)))
			_, hdr, err := say(testCtx(t), cc, "alice")
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			assert.Equal(t, tc.policy, hdr.Get("ratelimit-policy"))
			_, ok := grpclimit.RetryDelay(err)
			assert.False(t, ok)
			assert.Zero(t, svc.calls.Load())
		})
	}
}

func TestMethodCosts(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 10})
	costs := map[string]ratelimit.Units{sayMethod: 4 * ratelimit.Unit}
	cc, _ := serve(t, limited(store, byAPIKey, grpclimit.WithCost(grpclimit.MethodCosts(costs, ratelimit.Unit))))
	costs[sayMethod] = ratelimit.Unit // the map was copied
	ctx := testCtx(t)
	_, hdr, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	assert.Equal(t, []string{`"default";r=6;t=4`}, hdr.Get("ratelimit"))

	// A stream costs the default.
	cs := mustChat(t, ctx, cc, "alice")
	_, err = roundTrip(cs, "x")
	require.NoError(t, err)
	hdr, err = cs.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{`"default";r=5;t=5`}, hdr.Get("ratelimit"))
}

// failing is a limiter that is down.
type failing struct{}

var errDown = errors.New("limiter down")

func (failing) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errDown
}

func TestLimiterErrorFailsOpenOrClosed(t *testing.T) {
	t.Run("open by default", func(t *testing.T) {
		var seen []error
		onErr := func(_ context.Context, method string, err error) error {
			assert.Equal(t, sayMethod, method)
			seen = append(seen, err)
			return nil
		}
		cc, svc := serve(t, limited(failing{}, byAPIKey, grpclimit.WithErrorHandler(onErr)))
		_, hdr, err := say(testCtx(t), cc, "alice")
		require.NoError(t, err)
		assert.Empty(t, hdr.Get("ratelimit"))
		assert.Equal(t, int64(1), svc.calls.Load())
		require.Len(t, seen, 1)
		assert.ErrorIs(t, seen[0], errDown)

		cc, _ = serve(t, limited(failing{}))
		_, _, err = say(testCtx(t), cc, "")
		require.NoError(t, err)
	})
	t.Run("closed", func(t *testing.T) {
		cc, svc := serve(t, limited(failing{}, byAPIKey, grpclimit.WithErrorHandler(grpclimit.FailClosed)))
		ctx := testCtx(t)
		_, _, err := say(ctx, cc, "alice")
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.NotContains(t, err.Error(), errDown.Error())
		_, err = roundTrip(mustChat(t, ctx, cc, "alice"), "x")
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Zero(t, svc.calls.Load())
	})
}

// degraded is a limiter whose backend is down and whose own failure policy
// answers: it returns d with an error matching ratelimit.ErrDegraded.
type degraded struct{ d ratelimit.Decision }

func (l degraded) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return l.d, fmt.Errorf("%w: %w", ratelimit.ErrDegraded, errDown)
}

// TestLimiterFailurePolicyDecides: a limiter that fails with a Decision of
// its own failure policy is obeyed, whatever the ErrorHandler would do: a
// store that fails closed stays closed behind an interceptor that fails open.
func TestLimiterFailurePolicyDecides(t *testing.T) {
	onErr := func(context.Context, string, error) error {
		t.Error("an error that comes with the policy's Decision reached the ErrorHandler")
		return nil
	}
	refused := ratelimit.Decision{Limit: 5, Window: time.Second, RetryAfter: 250 * time.Millisecond}
	cc, svc := serve(t, limited(degraded{refused}, byAPIKey, grpclimit.WithErrorHandler(onErr)))
	_, _, err := say(testCtx(t), cc, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "fail closed's refusal is kept")
	assert.Zero(t, svc.calls.Load())

	admitted := ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4, Window: time.Second}
	cc, svc = serve(t, limited(degraded{admitted}, byAPIKey, grpclimit.WithErrorHandler(grpclimit.FailClosed)))
	_, hdr, err := say(testCtx(t), cc, "alice")
	require.NoError(t, err, "fail open's admission is kept")
	assert.Equal(t, []string{`"default";r=4;t=0`}, hdr.Get("ratelimit"))
	assert.Equal(t, int64(1), svc.calls.Load())
}

func mustChat(t *testing.T, ctx context.Context, cc *grpc.ClientConn, apiKey string) grpc.ClientStream {
	t.Helper()
	cs, err := chat(ctx, cc, apiKey)
	require.NoError(t, err)
	return cs
}

func TestStreamCheckedWhenItOpens(t *testing.T) {
	store, clk := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 1, Name: "chat"})
	cc, svc := serve(t, limited(store, byAPIKey))
	ctx := testCtx(t)

	cs := mustChat(t, ctx, cc, "alice")
	for _, s := range []string{"a", "b", "c"} { // messages are not counted
		got, err := roundTrip(cs, s)
		require.NoError(t, err)
		assert.Equal(t, s, got)
	}
	hdr, err := cs.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{`"chat";q=2;w=1`}, hdr.Get("ratelimit-policy"))
	require.NoError(t, cs.CloseSend())

	refused := mustChat(t, ctx, cc, "alice")
	_, err = roundTrip(refused, "x")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, ok := grpclimit.RetryDelay(err)
	require.True(t, ok)
	assert.Equal(t, 500*time.Millisecond, delay)
	hdr, err = refused.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{`"chat";r=0;t=1`}, hdr.Get("ratelimit"))
	assert.Equal(t, int64(1), svc.calls.Load())

	clk.Advance(delay)
	_, err = roundTrip(mustChat(t, ctx, cc, "alice"), "y")
	require.NoError(t, err)
}

func TestMessageCost(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 3, Name: "chat"})
	perMessage := func(_ context.Context, method string, msg any) (ratelimit.Units, error) {
		assert.Equal(t, chatMethod, method)
		return ratelimit.Unit, nil
	}
	cc, _ := serve(t, limited(store, byAPIKey, grpclimit.WithMessageCost(perMessage)))
	ctx := testCtx(t)

	// Opening spends 1, each message 1: the third message is refused.
	cs := mustChat(t, ctx, cc, "alice")
	for _, s := range []string{"a", "b"} {
		_, err := roundTrip(cs, s)
		require.NoError(t, err)
	}
	_, err := roundTrip(cs, "c")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, ok := grpclimit.RetryDelay(err)
	require.True(t, ok)
	assert.Equal(t, time.Second, delay)
	assert.Equal(t, []string{`"chat";r=0;t=3`}, cs.Trailer().Get("ratelimit"))

	// Unary calls are not charged per message.
	_, _, err = say(ctx, cc, "bob")
	require.NoError(t, err)
}

// blocking is a limiter that waits on a network until its context ends.
type blocking struct{ entered chan context.Context }

func (b blocking) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	panic("the interceptor must ask with the call's context")
}

func (b blocking) CheckContext(ctx context.Context, _ string, _ ratelimit.Units) (ratelimit.Decision, error) {
	b.entered <- ctx
	<-ctx.Done()
	return ratelimit.Decision{}, ctx.Err()
}

func TestCheckContextEndsWithTheCall(t *testing.T) {
	lim := blocking{entered: make(chan context.Context, 1)}
	cc, svc := serve(t, limited(lim, byAPIKey, grpclimit.WithErrorHandler(grpclimit.FailOpen)))
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, "alice"); done <- err }()

	var sctx context.Context
	select {
	case sctx = <-lim.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the limiter was never asked")
	}
	_, hasDeadline := sctx.Deadline()
	assert.True(t, hasDeadline, "the limiter gets the call's context, with its deadline")
	cancel()
	select {
	case err := <-done:
		assert.Equal(t, codes.Canceled, status.Code(err))
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not end when it was cancelled")
	}
	select {
	case <-sctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the server's check was not cancelled with the call")
	}
	assert.Zero(t, svc.calls.Load(), "a cancelled check does not fail open")
}

func TestLeakyBucketDelayOnVirtualTime(t *testing.T) {
	store, clk := newStore(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 3})
	cc, svc := serve(t, limited(store, byAPIKey))
	ctx := testCtx(t)

	_, _, err := say(ctx, cc, "alice") // goes on at once
	require.NoError(t, err)

	// The second is queued for a second of the store's clock.
	done := make(chan error, 1)
	go func() { _, _, err := say(ctx, cc, "alice"); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	assert.Equal(t, int64(1), svc.calls.Load())
	clk.Advance(time.Second)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the queued call never went on")
	}

	// A call cancelled while queued ends with codes.Canceled and never runs.
	cctx, cancel := context.WithCancel(ctx)
	go func() { _, _, err := say(cctx, cc, "alice"); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	cancel()
	select {
	case err := <-done:
		assert.Equal(t, codes.Canceled, status.Code(err))
	case <-ctx.Done():
		t.Fatal("the cancelled call never ended")
	}
	require.NoError(t, waitNoSleepers(ctx, clk))
	assert.Equal(t, int64(2), svc.calls.Load())
}

// waitNoSleepers waits, without sleeping, until nothing sleeps on clk.
func waitNoSleepers(ctx context.Context, clk *ratelimit.ManualClock) error {
	for clk.Sleepers() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		// Let the server's goroutine see its cancellation.
		runtime.Gosched()
	}
	return nil
}

func TestExpiredDeadline(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	cc, svc := serve(t, limited(store, byAPIKey))
	ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
	defer cancel()
	_, _, err := say(ctx, cc, "alice")
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Zero(t, svc.calls.Load())
	_, _, err = say(testCtx(t), cc, "alice")
	require.NoError(t, err, "the expired call spent nothing")
}

func TestPeerAddrKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr net.Addr
		pfx  int
		want string
	}{
		{"ipv4", &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 9}, 0, "ip:192.0.2.7"},
		{"ipv4-mapped", &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 9}, 0, "ip:192.0.2.7"},
		{"ipv6 grouped by /64", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 9}, 0, "ip:2001:db8:1:2::/64"},
		{"ipv6 /48", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 9}, 48, "ip:2001:db8:1::/48"},
		{"ipv6 zone dropped", &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, 128, "ip:fe80::1/128"},
		{"other addr type", &net.UDPAddr{IP: net.ParseIP("192.0.2.8"), Port: 1}, 0, "ip:192.0.2.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
			got, err := grpclimit.PeerAddr{IPv6Prefix: tc.pfx}.Key(ctx, sayMethod, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := grpclimit.PeerAddr{}.Key(context.Background(), sayMethod, nil)
	assert.ErrorIs(t, err, grpclimit.ErrNoPeerAddr)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.UnixAddr{Name: "/tmp/s", Net: "unix"}})
	_, err = grpclimit.PeerAddr{}.Key(ctx, sayMethod, nil)
	assert.ErrorIs(t, err, grpclimit.ErrNoPeerAddr)
}

func TestPeerAddrOverLoopback(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	cc, _ := serve(t, limited(store)) // the default key: the peer
	ctx := testCtx(t)
	_, _, err := say(ctx, cc, "alice")
	require.NoError(t, err)
	_, _, err = say(ctx, cc, "bob")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "an API key does not matter to the peer's key")
	d, err := store.Check("ip:127.0.0.1", ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the peer's key is ip:127.0.0.1")
}

func TestOtherKeys(t *testing.T) {
	k, err := grpclimit.MethodKey(context.Background(), sayMethod, nil)
	require.NoError(t, err)
	assert.Equal(t, "method:"+sayMethod, k)

	md := metadata.Pairs("x-api-key", "secret")
	k, err = grpclimit.PerMethod(grpclimit.MetadataKey("x-api-key", nil))(context.Background(), sayMethod, md)
	require.NoError(t, err)
	assert.Equal(t, "hdr:2bb80d537b1da3e38bd30361aa855686 "+sayMethod, k)
	assert.NotContains(t, k, "secret")

	assert.Panics(t, func() { grpclimit.MetadataKey("", nil) })
	assert.Panics(t, func() { grpclimit.UnaryServerInterceptor(nil) })
	var s *ratelimit.Store
	assert.Panics(t, func() { grpclimit.StreamServerInterceptor(s) })
}

func TestSkip(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1})
	skip := func(_ context.Context, method string) bool { return method == chatMethod }
	cc, svc := serve(t, limited(store, byAPIKey, grpclimit.WithSkip(skip)))
	ctx := testCtx(t)
	for range 3 { // no key, no limit
		cs := mustChat(t, ctx, cc, "")
		_, err := roundTrip(cs, "x")
		require.NoError(t, err)
		hdr, err := cs.Header()
		require.NoError(t, err)
		assert.Empty(t, hdr.Get("ratelimit"))
	}
	_, _, err := say(ctx, cc, "")
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Equal(t, int64(3), svc.calls.Load())
}

func TestPlanFromTheCall(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	plans, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1, Name: "free"}},
			"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10, Name: "pro"}},
		},
		Default: "free",
	}, func(string) string { return "" }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	plan := func(_ context.Context, _ string, md metadata.MD) string {
		if v := md.Get("x-plan"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	cc, _ := serve(t, limited(plans, byAPIKey, grpclimit.WithPlan(plan)))
	ctx := testCtx(t)

	_, hdr, err := say(metadata.AppendToOutgoingContext(ctx, "x-plan", "pro"), cc, "alice")
	require.NoError(t, err)
	assert.Equal(t, []string{`"pro";q=10;w=1`}, hdr.Get("ratelimit-policy"))
	_, hdr, err = say(ctx, cc, "bob")
	require.NoError(t, err)
	assert.Equal(t, []string{`"free";q=1;w=1`}, hdr.Get("ratelimit-policy"))
}

func TestConcurrentCallsAdmitExactlyTheBurst(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 10})
	cc, svc := serve(t, limited(store, byAPIKey))
	ctx := testCtx(t)
	const n = 50
	errs := make(chan error, n)
	for range n {
		go func() { _, _, err := say(ctx, cc, "alice"); errs <- err }()
	}
	var admitted, refused int
	for range n {
		select {
		case err := <-errs:
			switch status.Code(err) {
			case codes.OK:
				admitted++
			case codes.ResourceExhausted:
				refused++
			default:
				t.Errorf("unexpected %v", err)
			}
		case <-ctx.Done():
			t.Fatal("the calls never ended")
		}
	}
	assert.Equal(t, 10, admitted)
	assert.Equal(t, n-10, refused)
	assert.Equal(t, int64(10), svc.calls.Load())
}

// failingAfter admits its first n checks, then fails.
type failingAfter struct {
	store *ratelimit.Store
	n     atomic.Int64
}

func (f *failingAfter) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	if f.n.Add(-1) < 0 {
		return ratelimit.Decision{}, errDown
	}
	return f.store.Check(key, cost)
}

func TestMessageCostLimiterErrors(t *testing.T) {
	one := func(context.Context, string, any) (ratelimit.Units, error) { return ratelimit.Unit, nil }
	for _, tc := range []struct {
		name    string
		onError grpclimit.ErrorHandler
		want    codes.Code
	}{
		{"open", grpclimit.FailOpen, codes.OK},
		{"closed", grpclimit.FailClosed, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 10})
			lim := &failingAfter{store: store}
			lim.n.Store(1) // the stream's opening check
			cc, _ := serve(t, limited(lim, byAPIKey, grpclimit.WithMessageCost(one), grpclimit.WithErrorHandler(tc.onError)))
			_, err := roundTrip(mustChat(t, testCtx(t), cc, "alice"), "x")
			assert.Equal(t, tc.want, status.Code(err), "%v", err)
		})
	}
}

// counting is a keyed limiter that counts the checks that reach its store.
type counting struct {
	store  *ratelimit.Store
	checks atomic.Int64
}

func (c *counting) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	c.checks.Add(1)
	return c.store.Check(key, cost)
}

// TestMessageCostZeroIsFree: a message whose cost is 0 is free and
// unchecked: it reaches the handler, even with the key's allowance spent,
// and never reaches the limiter.
func TestMessageCostZeroIsFree(t *testing.T) {
	store, _ := newStore(t, ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 1, Name: "chat"})
	lim := &counting{store: store}
	cost := func(_ context.Context, _ string, msg any) (ratelimit.Units, error) {
		if msg.(*wrapperspb.StringValue).GetValue() == "free" {
			return 0, nil
		}
		return ratelimit.Unit, nil
	}
	cc, _ := serve(t, limited(lim, byAPIKey, grpclimit.WithMessageCost(cost)))
	ctx := testCtx(t)

	cs := mustChat(t, ctx, cc, "alice") // spends the whole allowance
	for range 5 {
		got, err := roundTrip(cs, "free")
		require.NoError(t, err)
		assert.Equal(t, "free", got)
	}
	assert.Equal(t, int64(1), lim.checks.Load(), "only the stream's opening was checked")
	_, err := roundTrip(cs, "paid")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, int64(2), lim.checks.Load())
}
