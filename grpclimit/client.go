package grpclimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratekit/ratelimit"
)

// KeyedWaiter is a keyed limiter that can wait for allowance, such as a
// [ratelimit.Store], a [ratelimit.Composite] or a [ratelimit.Plans].
type KeyedWaiter interface {
	Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error)
}

// ClientOption configures the client interceptors.
type ClientOption func(*clientConfig)

type clientConfig struct {
	pace     func(ctx context.Context, method string, cost ratelimit.Units) error
	cost     func(fullMethod string) ratelimit.Units
	clock    ratelimit.Clock
	retries  int
	maxDelay time.Duration
	randN    func(n int64) int64 // the jitter's random source
}

// WithPacer paces outbound calls with lim: each call, and each retry,
// waits with lim.Wait until lim admits it. With a single-key limiter from
// [ratelimit.New], give its clock with [WithClock] if it is not the system
// clock.
func WithPacer(lim ratelimit.Limiter) ClientOption {
	return func(c *clientConfig) {
		if lim == nil {
			return
		}
		c.pace = func(ctx context.Context, _ string, cost ratelimit.Units) error {
			_, err := lim.Wait(ctx, cost)
			return err
		}
		if c.clock == nil {
			if cl, ok := lim.(clocked); ok {
				c.clock = cl.Clock()
			}
		}
	}
}

// WithKeyedPacer paces outbound calls with lim, each under the key that
// key returns for it (its method, say, or the tenant it is made for): each
// call, and each retry, waits with lim.Wait until lim admits it.
func WithKeyedPacer(lim KeyedWaiter, key func(ctx context.Context, fullMethod string) string) ClientOption {
	return func(c *clientConfig) {
		if lim == nil || key == nil {
			return
		}
		c.pace = func(ctx context.Context, method string, cost ratelimit.Units) error {
			_, err := lim.Wait(ctx, key(ctx, method), cost)
			return err
		}
		if c.clock == nil {
			if cl, ok := lim.(clocked); ok {
				c.clock = cl.Clock()
			}
		}
	}
}

// WithPaceCost sets what each outbound call costs the pacer. The default
// is one [ratelimit.Unit].
func WithPaceCost(f func(fullMethod string) ratelimit.Units) ClientOption {
	return func(c *clientConfig) {
		if f != nil {
			c.cost = f
		}
	}
}

// WithClock sets the clock a server's retry delay is waited out on. The
// default is the pacer's own clock when it has a method Clock() (a
// [ratelimit.Store] does), and [ratelimit.SystemClock] otherwise; a test
// gives a [ratelimit.ManualClock] and moves it on.
func WithClock(clk ratelimit.Clock) ClientOption {
	return func(c *clientConfig) {
		if clk != nil {
			c.clock = clk
		}
	}
}

// WithRetries sets how many times a call refused with a RetryInfo detail
// (codes.ResourceExhausted from a rate limit, codes.Unavailable from a
// load shedder) is tried again after the delay the server asks for. The
// default is 2; 0 or less never retries.
func WithRetries(n int) ClientOption {
	return func(c *clientConfig) { c.retries = max(0, n) }
}

// WithMaxRetryDelay caps the retry delay the client interceptor waits out:
// a refusal asking for longer is returned to the caller at once. d <= 0,
// the default, means no cap but the call's deadline.
func WithMaxRetryDelay(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.maxDelay = d }
}

func newClientConfig(opts []ClientOption) *clientConfig {
	c := &clientConfig{retries: 2, cost: func(string) ratelimit.Units { return ratelimit.Unit }, randN: rand.Int64N}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.clock == nil {
		c.clock = ratelimit.SystemClock()
	}
	return c
}

// UnaryClientInterceptor returns a unary client interceptor that paces
// outbound calls and honours a server's request to retry later.
//
// With a pacer ([WithPacer], [WithKeyedPacer]) every call first waits its
// turn; a wait that could not end before the call's deadline fails at
// once with codes.DeadlineExceeded, spending nothing, and a cost the pacer
// can never admit fails with codes.InvalidArgument. Any other error from
// the pacer fails the call with codes.Unavailable.
//
// A call refused with a google.rpc.RetryInfo detail and codes.ResourceExhausted
// (over its quota, as [UnaryServerInterceptor] refuses) or
// codes.Unavailable (shed by an overloaded server, as
// [UnaryShedInterceptor] refuses) is tried again after the delay it
// carries, waited out on the interceptor's clock (see [WithClock]), up to
// [WithRetries] times (2 by default), pacing each try. A rate limit's
// delay is exact for its client, and is waited exactly. A shed call's is
// the same for every client the server shed at that moment, so its retry
// waits that delay plus a jitter drawn uniformly from zero to half the
// delay ("full jitter" over that half): never earlier than the server
// asked, at most half as long again, so that the clients shed together do
// not all come back together. The retry is never made past the call's
// deadline: a delay that would reach the deadline, or exceed
// [WithMaxRetryDelay], returns the refusal at once; the jitter is cut
// short to keep the retry before the deadline and within
// WithMaxRetryDelay; and a context that ends during the delay ends the
// call with its status.
// A refusal without RetryInfo (codes.Unavailable from a broken connection
// or a [FailClosed] server, say), and every other error, is returned as it
// is. Retrying is safe for refusals from [UnaryServerInterceptor] and
// [UnaryShedInterceptor], which never run the handler of a call they
// refuse. A shed call's delay is the shedder's hint, not an exact wait:
// each retry of it is one more call to a server that is shedding load, so
// keep [WithRetries] low where many clients call one server.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := newClientConfig(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		for try := 0; ; try++ {
			if err := c.paceCall(ctx, method); err != nil {
				return err
			}
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || try >= c.retries {
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok || (c.maxDelay > 0 && delay > c.maxDelay) {
				return err
			}
			room := c.maxDelay - delay // how much later than delay the retry may go
			if c.maxDelay <= 0 {
				room = delay
			}
			if dl, ok := ctx.Deadline(); ok {
				left := time.Until(dl)
				if left <= delay {
					return err
				}
				room = min(room, left-delay-1)
			}
			if status.Code(err) == codes.Unavailable {
				delay += c.jitter(delay, room)
			}
			if serr := ratelimit.Sleep(ctx, c.clock, delay); serr != nil {
				return status.FromContextError(serr).Err()
			}
		}
	}
}

// jitter returns the time a shed call's retry waits beyond the server's
// delay: drawn uniformly from 0 to half the delay, and at most room.
func (c *clientConfig) jitter(delay, room time.Duration) time.Duration {
	bound := min(delay/2, room)
	if bound <= 0 {
		return 0
	}
	return time.Duration(c.randN(int64(bound) + 1))
}

// StreamClientInterceptor returns a stream client interceptor that paces
// the opening of outbound streams as [UnaryClientInterceptor] paces calls.
// It does not retry: a stream's refusal reaches the caller on its first
// RecvMsg, after the stream has been handed over. [RetryDelay] reads the
// delay from that error for a caller that retries by itself.
func StreamClientInterceptor(opts ...ClientOption) grpc.StreamClientInterceptor {
	c := newClientConfig(opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := c.paceCall(ctx, method); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, callOpts...)
	}
}

// paceCall waits for the pacer to admit a call, and turns its error into a
// status error.
func (c *clientConfig) paceCall(ctx context.Context, method string) error {
	if c.pace == nil {
		return nil
	}
	err := c.pace(ctx, method, c.cost(method))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return status.Error(status.FromContextError(err).Code(), "grpclimit: pacing: "+err.Error())
	case errors.Is(err, ratelimit.ErrInvalidCost) || errors.Is(err, ratelimit.ErrCostExceedsCapacity):
		return status.Error(codes.InvalidArgument, "grpclimit: pacing: "+err.Error())
	default:
		return status.Error(codes.Unavailable, "grpclimit: pacing: "+err.Error())
	}
}

// RetryDelay returns the delay of the google.rpc.RetryInfo detail of a
// status error with codes.ResourceExhausted (a rate limit's refusal) or
// codes.Unavailable (a load shedder's), and false for any other error, a
// refusal without RetryInfo, or a delay that is missing, malformed or
// negative.
func RetryDelay(err error) (time.Duration, bool) {
	s, ok := status.FromError(err)
	if !ok || (s.Code() != codes.ResourceExhausted && s.Code() != codes.Unavailable) {
		return 0, false
	}
	for _, d := range s.Details() {
		ri, ok := d.(*errdetails.RetryInfo)
		if !ok || ri.GetRetryDelay() == nil {
			continue
		}
		if ri.GetRetryDelay().CheckValid() != nil {
			return 0, false
		}
		delay := ri.GetRetryDelay().AsDuration()
		if delay < 0 {
			return 0, false
		}
		return delay, true
	}
	return 0, false
}
