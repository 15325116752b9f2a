package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratekit/ratelimit"
)

// ErrorHandler decides what happens to a call whose limit could not be
// checked: its key function or the limiter failed with err. It returns nil
// to let the call go on anyway (fail open), or the error to end the call
// with, preferably a status error (fail closed). It is the place to log
// such errors: the interceptors log nothing themselves. A call without its
// key ([ErrNoKey]) and a bad cost never come here, nor does an error
// matching [ratelimit.ErrDegraded]: it comes with the Decision the
// limiter's own failure policy made (a Redis store's fail closed, say), and
// the call gets that Decision, admitted or refused; observe those failures
// with the limiter's Observer.
type ErrorHandler func(ctx context.Context, fullMethod string, err error) error

// FailOpen is the default [ErrorHandler]: it lets the call go on, so that
// a broken limiter degrades to no limit rather than to an outage.
func FailOpen(context.Context, string, error) error { return nil }

// FailClosed is an [ErrorHandler] that refuses the call with
// codes.Unavailable. The error itself is not disclosed to the client.
func FailClosed(context.Context, string, error) error {
	return status.Error(codes.Unavailable, "grpclimit: the rate limiter is unavailable; try again later")
}

// Option configures the server interceptors.
type Option func(*config)

type config struct {
	key     KeyFunc
	cost    CostFunc
	onError ErrorHandler
	plan    func(ctx context.Context, fullMethod string, md metadata.MD) string
	msgCost MessageCostFunc
	skip    func(ctx context.Context, fullMethod string) bool
}

// WithKey sets how calls are keyed. The default is PeerAddr{}.Key: the
// connection's peer address, IPv6 grouped by /64. A nil f changes nothing.
func WithKey(f KeyFunc) Option {
	return func(c *config) {
		if f != nil {
			c.key = f
		}
	}
}

// WithCost sets what each call costs, as [MethodCosts] does per method. The
// default is one [ratelimit.Unit]. A nil f changes nothing.
func WithCost(f CostFunc) Option {
	return func(c *config) {
		if f != nil {
			c.cost = f
		}
	}
}

// WithErrorHandler sets what happens when a call's limit cannot be
// checked. The default is [FailOpen]; [FailClosed] refuses with
// codes.Unavailable. A nil h changes nothing.
func WithErrorHandler(h ErrorHandler) Option {
	return func(c *config) {
		if h != nil {
			c.onError = h
		}
	}
}

// WithPlan chooses the plan of each call, for a [ratelimit.Plans] limiter,
// from the call itself (a claim of its verified credentials, say) rather
// than from its key: the limiter is asked with [ratelimit.ContextWithPlan].
// It needs a limiter that takes a context ([ratelimit.ContextChecker]);
// Plans does.
func WithPlan(f func(ctx context.Context, fullMethod string, md metadata.MD) string) Option {
	return func(c *config) { c.plan = f }
}

// WithSkip exempts the calls for which skip returns true, such as health
// checks: they go on unchecked, spending nothing and needing no key, and
// carry no ratelimit fields.
func WithSkip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return func(c *config) { c.skip = skip }
}

// MessageCostFunc returns what one message a client sends on a stream
// costs. msg is the message as the handler receives it, already decoded.
// A cost of zero means the message is free and is not checked.
type MessageCostFunc func(ctx context.Context, fullMethod string, msg any) (ratelimit.Units, error)

// WithMessageCost makes the stream interceptor charge every message the
// client sends, on the key the stream was admitted under, on top of the
// check made when the stream opened. A message over the limit is not handed
// to the handler: its RecvMsg returns a codes.ResourceExhausted status
// carrying the RetryInfo, with the ratelimit fields in the trailer, and the
// handler should return that error, which ends the stream. A bad cost is a
// codes.InvalidArgument error from RecvMsg, and a limiter error goes to
// the [ErrorHandler] as a failed open check does (nil from it lets the
// message through). Unary calls are not affected.
func WithMessageCost(f MessageCostFunc) Option {
	return func(c *config) { c.msgCost = f }
}

// clocked is a limiter that tells which clock it reads, as
// [ratelimit.Store] and [ratelimit.Composite] do.
type clocked interface {
	Clock() ratelimit.Clock
}

// checker is the state both server interceptors share.
type checker struct {
	config
	lim     ratelimit.KeyedLimiter
	withCtx ratelimit.ContextChecker // lim, if it takes a context
	layered layered                  // lim, if it tells its layers' Decisions
	clock   ratelimit.Clock          // the clock a Delay is waited out on
}

// layered is a keyed limiter that tells every enforced layer's Decision,
// as [ratelimit.Composite] and [ratelimit.Plans] do: it is asked with
// CheckLayers, so that the fields list every limit, as httplimit's do.
type layered interface {
	CheckLayers(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, dst []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error)
}

func newChecker(lim ratelimit.KeyedLimiter, opts []Option) *checker {
	if isNil(lim) {
		panic(fmt.Sprintf("grpclimit: interceptor given a nil limiter (%T); pass the limiter that ratelimit.NewStore or ratelimit.Compose returned, after checking their error", lim))
	}
	c := &checker{
		config: config{key: PeerAddr{}.Key, cost: FixedCost(ratelimit.Unit), onError: FailOpen},
		lim:    lim,
		clock:  ratelimit.SystemClock(),
	}
	for _, o := range opts {
		if o != nil {
			o(&c.config)
		}
	}
	c.withCtx, _ = lim.(ratelimit.ContextChecker)
	c.layered, _ = lim.(layered)
	if cl, ok := lim.(clocked); ok {
		if clk := cl.Clock(); clk != nil {
			c.clock = clk
		}
	}
	return c
}

// isNil reports whether lim is nil or holds a nil pointer, map, slice,
// channel or function.
func isNil(lim ratelimit.KeyedLimiter) bool {
	if lim == nil {
		return true
	}
	switch v := reflect.ValueOf(lim); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// UnaryServerInterceptor returns a unary server interceptor that checks
// every call against lim, typically a [ratelimit.Store] or a
// [ratelimit.Composite], and runs the handler only if the call is admitted
// (see the package documentation for what each outcome returns). lim must
// be safe for concurrent use. It panics if lim is nil or a nil pointer of a
// limiter type: a mistake in the program, reported when the server is
// built rather than on the first call.
func UnaryServerInterceptor(lim ratelimit.KeyedLimiter, opts ...Option) grpc.UnaryServerInterceptor {
	c := newChecker(lim, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c.skip != nil && c.skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		_, md, err := c.admit(ctx, info.FullMethod)
		if md != nil {
			_ = grpc.SetHeader(ctx, md) // fails only outside a server call
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns a stream server interceptor that checks
// every stream once, when it opens, against lim, with the key and cost of
// its options, exactly as [UnaryServerInterceptor] checks a call; the
// handler runs only if the stream is admitted. The messages on an admitted
// stream are not counted unless [WithMessageCost] asks. It panics as
// UnaryServerInterceptor does.
func StreamServerInterceptor(lim ratelimit.KeyedLimiter, opts ...Option) grpc.StreamServerInterceptor {
	c := newChecker(lim, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if c.skip != nil && c.skip(ss.Context(), info.FullMethod) {
			return handler(srv, ss)
		}
		key, md, err := c.admit(ss.Context(), info.FullMethod)
		if md != nil {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		if c.msgCost != nil && key != "" {
			ss = &meteredStream{ServerStream: ss, c: c, key: key, method: info.FullMethod}
		}
		return handler(srv, ss)
	}
}

// ask asks the limiter, with ctx if it takes one; a layered limiter also
// returns every enforced layer's Decision.
func (c *checker) ask(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, []ratelimit.Decision, error) {
	switch {
	case c.layered != nil:
		return c.layered.CheckLayers(ctx, key, cost, 0, nil)
	case c.withCtx != nil:
		d, err := c.withCtx.CheckContext(ctx, key, cost)
		return d, nil, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, nil, err
	}
	d, err := c.lim.Check(key, cost)
	return d, nil, err
}

// admit decides whether a call may go on. It returns the call's key ("" if
// there is none), the metadata to send (nil for none), and the error to end
// the call with, nil to let it go on.
func (c *checker) admit(ctx context.Context, method string) (string, metadata.MD, error) {
	in, _ := metadata.FromIncomingContext(ctx)
	if in == nil {
		in = metadata.MD{}
	}
	key, err := c.key(ctx, method, in)
	if err != nil {
		if errors.Is(err, ErrNoKey) {
			return "", nil, status.Error(codes.Unauthenticated, err.Error())
		}
		if s, ok := status.FromError(err); ok {
			return "", nil, s.Err()
		}
		return "", nil, c.onError(ctx, method, fmt.Errorf("grpclimit: key: %w", err))
	}
	cost, err := c.cost(ctx, method, in)
	if err != nil {
		return "", nil, status.Error(codes.InvalidArgument, "grpclimit: cost: "+err.Error())
	}
	actx := ctx
	if c.plan != nil {
		actx = ratelimit.ContextWithPlan(ctx, c.plan(ctx, method, in))
	}
	md, err := c.spend(ctx, actx, method, key, cost)
	return key, md, err
}

// spend asks the limiter to spend cost for key, and waits out an admitted
// request's Delay. It returns the metadata to send and the error to end
// the call (or refuse the message) with.
func (c *checker) spend(ctx, actx context.Context, method, key string, cost ratelimit.Units) (metadata.MD, error) {
	d, layers, err := c.ask(actx, key, cost)
	if err != nil {
		switch {
		case errors.Is(err, ratelimit.ErrCostExceedsCapacity):
			md := metadata.MD{PolicyField: {policyValue(d)}}
			return md, status.Errorf(codes.InvalidArgument,
				"grpclimit: this call costs %v, more than the %d that policy %q allows at once; it can never be admitted: %v",
				cost, d.Limit, policyName(d), err)
		case errors.Is(err, ratelimit.ErrInvalidCost):
			return nil, status.Errorf(codes.InvalidArgument, "grpclimit: this call has no positive cost (it costs %v): %v", cost, err)
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case errors.Is(err, ratelimit.ErrDegraded):
			// The limiter's backend failed and its own failure policy
			// decided: the call gets that Decision (see ErrorHandler).
		default:
			return nil, c.onError(ctx, method, fmt.Errorf("grpclimit: limiter: %w", err))
		}
	}
	if !d.Allowed {
		return fields(d, layers, 0), refusal(d)
	}
	if d.Delay > 0 {
		if err := ratelimit.Sleep(ctx, c.clock, d.Delay); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	}
	return fields(d, layers, d.Delay), nil
}

// refusal is the status error for a call over its limit: ResourceExhausted
// with a RetryInfo detail carrying the exact wait.
func refusal(d ratelimit.Decision) error {
	s := status.Newf(codes.ResourceExhausted, "grpclimit: too many requests for policy %q: retry in %v",
		policyName(d), d.RetryAfter)
	if ds, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		s = ds
	}
	return s.Err()
}

// meteredStream charges every message the client sends (WithMessageCost).
type meteredStream struct {
	grpc.ServerStream
	c      *checker
	key    string
	method string
}

func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	cost, err := s.c.msgCost(ctx, s.method, m)
	if err != nil {
		return status.Error(codes.InvalidArgument, "grpclimit: message cost: "+err.Error())
	}
	if cost == 0 {
		return nil
	}
	actx := ctx
	if s.c.plan != nil {
		in, _ := metadata.FromIncomingContext(ctx)
		if in == nil {
			in = metadata.MD{}
		}
		actx = ratelimit.ContextWithPlan(ctx, s.c.plan(ctx, s.method, in))
	}
	md, err := s.c.spend(ctx, actx, s.method, s.key, cost)
	if err != nil && md != nil {
		s.SetTrailer(md)
	}
	return err
}
