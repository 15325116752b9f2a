// Package grpclimit is gRPC server and client interceptors over the limiters
// of package ratelimit. The server interceptors refuse a call over its limit
// with codes.ResourceExhausted and a google.rpc.RetryInfo detail carrying
// the exact wait, and tell every client its quota in the ratelimit-policy
// and ratelimit metadata fields; the client interceptors pace outbound
// calls and wait out a server's RetryInfo before trying again.
//
//	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"})
//	...
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(store, grpclimit.WithKey(grpclimit.MetadataKey("x-api-key", nil)))),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(store, grpclimit.WithKey(grpclimit.MetadataKey("x-api-key", nil)))),
//	)
//
// It is a module of its own, so that the core module depends on nothing
// outside the standard library. Its choices are those of package httplimit,
// in gRPC's terms.
//
// # What a call gets
//
// For each call the key ([WithKey]; the peer's address by default) and the
// cost ([WithCost]; one [ratelimit.Unit] by default, or per method with
// [MethodCosts]) are computed and the limiter decides. It is asked with
// CheckContext and the call's context when it is a
// [ratelimit.ContextChecker] (a Store, a Composite, Plans, a Redis-backed
// limiter), so that a limiter that waits on a network gives up with the
// call; otherwise with Check. Then:
//
//   - admitted: the handler runs, after the Decision's Delay (a leaky
//     bucket's place in its queue) has been waited out on the limiter's own
//     clock when it has a method Clock() [ratelimit.Clock], as a Store has.
//     A call whose context ends during that wait ends with codes.Canceled or
//     codes.DeadlineExceeded; its allowance stays spent.
//   - denied: codes.ResourceExhausted, with a RetryInfo whose retry_delay is
//     the Decision's RetryAfter to the nanosecond. The handler does not run.
//   - no key ([ErrNoKey], such as a required API key left out):
//     codes.Unauthenticated. This never fails open.
//   - a cost that is not positive or that exceeds the rule's capacity, or an
//     error from the [CostFunc]: codes.InvalidArgument, never
//     ResourceExhausted, since waiting would not help.
//   - any other error from the key function or the limiter: the
//     [ErrorHandler] decides, [FailOpen] (the call goes on) by default, or
//     [FailClosed] (codes.Unavailable).
//   - a context that ended before or during the check: codes.Canceled or
//     codes.DeadlineExceeded.
//
// # Metadata fields
//
// Every admitted or denied call carries, in its response header metadata,
//
//	ratelimit-policy: "<name>";q=<quota>;w=<window in seconds>
//	ratelimit: "<name>";r=<Remaining>;t=<ResetAfter in seconds, rounded up>
//
// with the same values as httplimit's RateLimit-Policy and RateLimit HTTP
// fields for the same Decision (the name is the rule's Name, or "default"):
// a [ratelimit.Composite] or a [ratelimit.Plans] plan of layers, asked with
// CheckLayers, lists every enforced layer in both, as httplimit does.
// A denied call has not run its handler, so its header is sent just before
// its status; a client reads it with grpc.Header. A call refused for a
// cost above the capacity carries ratelimit-policy alone.
//
// # Streams
//
// A stream is checked once, when it opens, with the key and cost of its
// method, exactly as a unary call; a refused stream's handler never runs,
// and the client sees the refusal on its first RecvMsg. An admitted stream
// may then carry any number of messages for as long as it lasts, unless
// [WithMessageCost] charges each message the client sends as well, on the
// key the stream was admitted under.
//
// # Clients
//
// [UnaryClientInterceptor] paces calls with a limiter's Wait ([WithPacer],
// [WithKeyedPacer]) and retries a call refused with RetryInfo after the
// delay the server gave (exactly for a rate limit's refusal; for a shed
// call, plus a random jitter of up to half the delay, so that clients shed
// together do not return together), never past the call's deadline, up to
// [WithRetries] times. [StreamClientInterceptor] paces the opening of
// streams.
//
// # Tests
//
// The interceptors start no goroutines and read time only through the
// limiter (and, for a client, [WithClock], and the call's deadline), so a service behind them is
// tested on virtual time by building the store with
// ratelimit.WithClock(ratelimit.NewManualClock(0)) and moving the clock on.
package grpclimit
