package redisstore

import (
	"fmt"
	"time"

	"github.com/ratekit/ratelimit"
)

// Option configures a [Store].
type Option func(*options)

type options struct {
	prefix    string
	clock     ratelimit.Clock
	timeout   time.Duration
	margin    time.Duration
	mode      FailureMode
	fallback  ratelimit.KeyedLimiter
	failures  int
	pause     time.Duration
	denyCache int
	observer  ratelimit.Observer
	hashTag   func(string) string // NewComposite only

	lockFallback     *ratelimit.Lockout  // NewLockout only
	inflightFallback *ratelimit.InFlight // NewInFlight only
}

// buildOptions applies opts over the defaults and validates the result.
func buildOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return o, o.validate()
}

func defaultOptions() options {
	return options{
		prefix:    "ratelimit:",
		timeout:   100 * time.Millisecond,
		margin:    time.Second,
		failures:  5,
		pause:     250 * time.Millisecond,
		denyCache: 10_000,
	}
}

func (o *options) validate() error {
	switch {
	case o.timeout <= 0:
		return fmt.Errorf("%w: the timeout must be positive", ratelimit.ErrInvalidOption)
	case o.margin < 0:
		return fmt.Errorf("%w: the expiry margin must not be negative", ratelimit.ErrInvalidOption)
	case o.failures < 1 || o.pause <= 0:
		return fmt.Errorf("%w: the circuit needs at least one failure and a positive pause", ratelimit.ErrInvalidOption)
	case o.mode != FailOpen && o.mode != FailClosed:
		return fmt.Errorf("%w: unknown failure mode %d", ratelimit.ErrInvalidOption, o.mode)
	}
	return nil
}

// WithPrefix sets the prefix of every Redis key the store writes; the
// default is "ratelimit:". Stores with different rules never share keys
// whatever their prefixes (see [Store.Key]).
//
// In Redis Cluster (and on a [redis.Ring]) a '{' in the prefix moves the
// keys' hash tag, which Redis reads from the key's first '{' to the next
// '}'. A prefix with a whole tag of its own, such as "{rl}:", puts every
// key in that tag's slot, on one master. A '{' with no '}' after it in the
// prefix, or an empty "{}", makes the tag take in the rest of the key: a
// Store's keys (one per check) still work, each in a slot of its own, but
// a Composite's layers would be in different slots, so [NewComposite]
// refuses such a prefix with [ErrCrossSlot] on those clients.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithClock makes the store decide at the times c reads, nanoseconds since
// the Unix epoch (such as [UnixClock], or a [ratelimit.ManualClock] in
// tests), instead of at the Redis server's TIME. Every process using the
// same keys must then share that time base: a key clamps to the latest
// instant it was checked at, so a clock that runs behind only delays its
// own requests, but one that runs ahead spends the allowance early for all.
func WithClock(c ratelimit.Clock) Option { return func(o *options) { o.clock = c } }

// WithTimeout bounds a check whose context has no deadline; the default is
// 100 ms. Checks whose context can never end (Check's) share a deadline
// with those that started within a tenth of d before them, so each gets
// between nine tenths of d and d.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithExpiryMargin sets how long past the instant its state is as good as a
// fresh key's a key is kept in Redis; the default is one second. The
// expiry runs on the server's clock and the decisions on the store's, so
// the margin covers the skew between them.
func WithExpiryMargin(d time.Duration) Option { return func(o *options) { o.margin = d } }

// FailureMode is what a check answers when Redis cannot decide.
type FailureMode int

const (
	// FailOpen, the default, admits: the Decision is the one a fresh key
	// would get, as if the key's state had been lost.
	FailOpen FailureMode = iota
	// FailClosed denies, with RetryAfter set to the circuit's pause.
	FailClosed
)

// WithFailureMode sets what a check answers when Redis cannot decide. The
// error is returned in either case.
func WithFailureMode(m FailureMode) Option { return func(o *options) { o.mode = m } }

// WithFallback makes a check that Redis cannot decide go to local, an
// in-process limiter such as a [ratelimit.Store] with the same rule (for a
// [Composite], a [ratelimit.Composite] of the same layers): each process
// then limits on its own until Redis is back, and the Decision is local's.
// A CheckWithin, or an attempt of Wait with a deadline, asks local's
// CheckWithin with its cap if local has one. The error saying Redis failed
// is still returned. It takes precedence over [WithFailureMode].
func WithFallback(local ratelimit.KeyedLimiter) Option {
	return func(o *options) { o.fallback = local }
}

// WithCircuit sets the circuit breaker: after failures consecutive checks
// that Redis did not decide, checks stop trying Redis (and so stop waiting
// out a deadline each) and go straight to the failure policy; after pause,
// one check tries Redis again and, if it succeeds, checks resume. The
// default is 5 failures and a 250 ms pause. On a [redis.ClusterClient] each
// master has a circuit of its own, counting the failures of the keys in
// its slots.
func WithCircuit(failures int, pause time.Duration) Option {
	return func(o *options) { o.failures, o.pause = failures, pause }
}

// WithDenyCache sets how many keys' refusals the store keeps, to answer
// without a round trip a request that Redis would refuse; the default is
// 10,000, and n <= 0 turns it off. A rule with CountRefused has no deny
// cache: each of its refusals spends, so each goes to Redis. A [Composite]
// keeps refusals by request key, each with every layer's state, and has
// none if a layer is in shadow mode (see the package documentation for
// how its answers may differ from Redis's); Wait asks Redis, not the
// cache (see [Store.Wait]).
//
// What a cached answer is. The cache keeps the key's state as Redis's last
// refusal left it. A request is refused from the cache only if that state
// refuses it at the latest instant Redis's time can be now; checks by any
// process only spend, so Redis, whose state holds at least as much spent,
// refuses it too: Allowed is always Redis's. With a client clock that
// instant is the clock's reading. On the server's clock Redis's time is
// known only to lie between the instant of that refusal plus the local
// time since its reply came back (the earliest) and plus the time since
// its request was sent (the latest): the refusal is decided at the latest
// and reported from the earliest (its At, and RetryAfter and ResetAfter
// counted from there), so that its At never runs ahead of an answer Redis
// gives after it, and a client that waits its RetryAfter out is never
// early.
//
// What may differ from Redis's answer at the same instant. Other processes
// may have been admitted on the key since the cached refusal, up to what
// the kept state could admit; the cache cannot see how much. A cached
// refusal therefore reports the worst case, as if all of that had been
// spent at the latest instant: its RetryAfter and ResetAfter are never
// shorter than Redis's and its Remaining is 0, never higher. They are
// Redis's exactly when the kept state could have admitted nothing since
// (so that nobody could have spent), and otherwise may be longer, by up to
// what the worst case adds (for a bucket, the time to earn the request's
// cost; for a window, until its count ages out). On the server's clock
// RetryAfter and ResetAfter are, besides, counted from the earliest
// instant: longer than Redis's by at most the round trip of the refusal
// Redis made. A client that waits out the RetryAfter Redis gave never
// meets the cache; one that comes back early is told the longest wait
// Redis could tell it.
//
// Where a cached refusal can be wrong: when the key's state was taken
// back or cleared behind the store's back since: a refund, settlement or
// reset made by another process (this store's own [Store.Refund],
// [Store.Reset] and refunding [Store.Settle] drop the key's entry, and a
// charging Settle replaces it by the settled state), or a Redis that lost
// the key (eviction, a restart without persistence). The cache then keeps
// refusing requests its kept state refuses, at most until that state would
// admit them, although Redis would admit them sooner. A charge settled by
// another process can put the key in debt beyond what the kept state could
// admit: Redis then refuses for longer than the cached RetryAfter, and
// once the kept state admits, the request goes to Redis, which refuses it.
// Turn the cache off if those matter more than the round trips saved.
func WithDenyCache(n int) Option { return func(o *options) { o.denyCache = n } }

// WithObserver tells o of every check's outcome (see [ratelimit.Observer]):
// Decided for each Decision returned without an error (one answered by the
// deny cache included), and Failed, with the rule's policy, for each error
// that is not a cost error (Redis unavailable, a corrupted state, a
// disagreement with the Machine), before the failure policy's Decision is
// returned with it.
func WithObserver(o ratelimit.Observer) Option { return func(opts *options) { opts.observer = o } }
