// Package httplimit is net/http middleware over a keyed rate limiter such as
// a [ratelimit.Store]. It answers a client over its limit with 429 Too Many
// Requests and a Retry-After in whole seconds, tells every client its quota
// in the RateLimit-Policy and RateLimit fields of the IETF draft "RateLimit
// header fields for HTTP", finds client addresses safely behind reverse
// proxies ([ClientIP]), delays leaky-bucket traffic, and can run in shadow
// mode to measure a limit before enforcing it.
//
//	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"})
//	...
//	http.ListenAndServe(addr, httplimit.Middleware(store)(mux))
//
// It is a package of its own so that programs using the limiter without
// HTTP (workers, gRPC services, clients pacing themselves) do not link
// net/http, and so that the HTTP vocabulary (keys, costs, proxies, hooks)
// stays out of the core package's documentation.
//
// # Response fields
//
// Every response to a checked request, admitted or not, carries
//
//	RateLimit-Policy: "<name>";q=<quota>;w=<window in seconds>
//	RateLimit: "<name>";r=<Remaining>;t=<ResetAfter in seconds, rounded up>
//
// from the request's [ratelimit.Decision], unless the Decision is an
// in-flight limit's, which is not a quota over time (see [InFlight]). The
// values are structured-field Lists (RFC 9651) of one item per limit: a
// limiter of several layers, a [ratelimit.Composite] or a [ratelimit.Plans]
// plan of Layers, lists every enforced layer, in layer order, in both
// fields (shadow layers are not listed), so that a client sees its
// per-second and its per-day allowance together:
//
//	RateLimit-Policy: "burst";q=20;w=2, "daily";q=10000;w=86400
//	RateLimit: "burst";r=19;t=1, "daily";r=9999;t=86400
//
// It asks such a limiter with its CheckLayers method; each layer's r and t
// are that layer's own, as it stands after the request (a layer that a
// refused request was not spent in shows what it has left). Give the
// layers distinct Names, which is what tells them apart. Under
// [WithShadowMode], and for other limiters, the one Decision is listed.
// [WithPartitionKey] adds the draft's pk parameter to every item.
//
// The name is the rule's Name, or "default" for an unnamed rule. The
// policy is the Decision's Limit over its Window: for a window algorithm
// the Limit and the window; for a token
// bucket or GCRA the Burst, and for a leaky bucket the Capacity, over the
// time to earn that whole capacity back at the rule's rate. The field
// carries whole seconds, so:
//
//   - when the Window is a whole number of seconds, q is the Limit and w
//     the Window: q/w is exactly the rule's rate and q the most a client
//     can spend at once (TokenBucket{Rate: 10/s, Burst: 20} sends q=20;w=2);
//   - otherwise w is the Window rounded up to whole seconds (at least 1)
//     and q the quota the rule grants over w, Limit x w / Window rounded to
//     the nearest integer, so that q/w is still the rule's rate, to within
//     half a request over w (GCRA{Rate: 100/s, Burst: 5}, whose Window is
//     50 ms, sends q=100;w=1, not q=5;w=1, which would read as 5 a second).
//     q is then more than a client can spend at once; r says what it can.
//
// r is what the client could spend right now, and t the seconds until its
// allowance is whole again if it sends nothing more. A denied request also
// gets Retry-After (the exact wait for the same request to pass, rounded up
// to whole seconds, at least 1), Cache-Control: no-store, and a JSON body.
// [WithLegacyHeaders] adds the older X-RateLimit-Limit, -Remaining and
// -Reset (delta seconds) fields.
//
// t is the time until the allowance is whole, so on a denial it can exceed
// Retry-After: a sliding log of 5 per 10 s that is full admits again when
// its oldest entry expires, seconds before the last one does. Clients
// should honour Retry-After, which the draft says takes precedence, and can
// read t as the longest they might have to wait for a full allowance.
//
// # Misconfiguration
//
// The middleware warns, once per process and never per request, about
// configurations that make clients share a limit without anyone noticing:
// requests that carry X-Forwarded-For or Forwarded but are keyed by the
// address of the peer that sent them (no proxy trusted, so every client
// behind a proxy shares the proxy's limit), and one client address taking
// most requests from many user agents. See [WithWarnings], which also
// turns them off.
//
// # Client addresses
//
// The default key is [ClientIP]{}.Key: the immediate peer's address, IPv4
// whole, IPv6 by its /64 (the block one subscriber is usually given), and
// IPv4-mapped IPv6 addresses as the IPv4 addresses they carry. Set
// ClientIP.IPv6Prefix for another grouping (express-rate-limit groups by
// /56) and ClientIP.TrustedProxies behind a reverse proxy.
//
// # Logging, shadow mode and tests
//
// By default the middleware writes no log line per request, so that a
// client over its limit cannot flood the logs; [WithLogger] turns the lines
// on. Errors of the key function and the limiter are logged, capped (see
// [WithLogger]).
//
// [WithShadowMode] measures a limit without enforcing it, exactly as
// [ratelimit.ShadowKeyed] and a shadow [ratelimit.Layer] do.
//
// A leaky bucket's Delay is waited out on the limiter's own clock, so a
// handler behind the middleware is tested on virtual time by giving its
// store a [ratelimit.ManualClock] (see the example).
package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/wide"
)

// KeyFunc returns the key a request is limited by, such as a client address
// or an API key. An error matching [ErrNoKey] means the request lacks what
// it must be keyed by, which is the client's doing: it is answered 400 Bad
// Request. Any other error means the request's limit cannot be checked; it
// goes to the [ErrorHandler].
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is what a [KeyFunc] returns, wrapped with detail if it likes,
// for a request that does not carry what it is limited by, such as an API
// key header that is required and missing. The request is the client's
// fault, so the middleware answers it 400 Bad Request with a JSON body
// {"error":"missing_key","message":...} carrying the error's text, and never
// hands it to the [ErrorHandler]: under [FailOpen] a client could otherwise
// skip its limit by leaving the key out. Return other errors for failures
// the client does not control (a session store that is down), which the
// ErrorHandler should decide about.
var ErrNoKey = errors.New("httplimit: the request has no key")

// CostFunc returns what a request costs, such as 10*[ratelimit.Unit] for a
// bulk call. An error, a cost of zero or less, and a cost above the rule's
// capacity (a request that could never pass) are the client's fault: they
// are answered 400 Bad Request with a JSON body saying why, never 429.
type CostFunc func(*http.Request) (ratelimit.Units, error)

// DeniedHandler writes the response to a request over its limit. When it is
// called, the RateLimit, RateLimit-Policy, Retry-After and Cache-Control
// fields are already set on w; it writes the status (429 unless there is a
// reason for another) and the body. d.RetryAfter is the exact wait.
type DeniedHandler func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision)

// ErrorHandler decides what happens to a request whose limit could not be
// checked: its key function or the limiter failed. It returns true to
// forward the request anyway (fail open), or writes a response and returns
// false (fail closed). The middleware has already logged err (see
// [WithLogger]). A request without its key ([ErrNoKey]) never comes here,
// nor, outside shadow mode, does a limiter error matching
// [ratelimit.ErrDegraded]: it comes with the Decision the limiter's own
// failure policy made (a Redis store's fail closed, say), and the request
// gets that Decision, admitted or refused, with its fields.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error) (forward bool)

// FailOpen is the default [ErrorHandler]: it forwards the request, so that a
// broken limiter degrades to no limit rather than to an outage.
func FailOpen(http.ResponseWriter, *http.Request, error) bool { return true }

// FailClosed is an [ErrorHandler] that refuses the request with 503 Service
// Unavailable and a JSON body. The error itself is not disclosed.
func FailClosed(w http.ResponseWriter, _ *http.Request, _ error) bool {
	writeJSON(w, http.StatusServiceUnavailable, problem{
		Error:   "limiter_unavailable",
		Message: "the rate limiter is unavailable; try again later",
	})
	return false
}

// FixedCost returns a [CostFunc] charging every request c.
func FixedCost(c ratelimit.Units) CostFunc {
	return func(*http.Request) (ratelimit.Units, error) { return c, nil }
}

// HeaderKey returns a [KeyFunc] keying requests by the value of the header
// name, such as an API key, and by fallback (often [ClientIP.Key]) when the
// header is absent or empty. The key is "hdr:" and the first 16 bytes of the
// value's SHA-256 in hex, so that every key has the same small size however
// long the value, and secrets are neither held by the store nor logged. The
// "hdr:" prefix keeps these keys apart from [ClientIP.Key]'s "ip:" ones, so
// a client cannot spend another client's address allowance by sending it as
// a header value.
//
// With a nil fallback the header is required: a request without it gets
// an error matching [ErrNoKey], which the middleware answers 400, so that
// leaving the header out is no way round the limit.
//
// The header is not authenticated: anyone may send any value. Check keys
// before limiting by them, or limit by client address as well.
//
// HeaderKey panics if name is empty: a request cannot be keyed by no
// header.
func HeaderKey(name string, fallback KeyFunc) KeyFunc {
	if name == "" {
		panic("httplimit: HeaderKey with an empty header name; name the header that carries the key, such as \"X-API-Key\"")
	}
	// Canonical once here, so that looking it up allocates nothing.
	name = http.CanonicalHeaderKey(name)
	missing := fmt.Errorf("%w: the %s header is missing", ErrNoKey, name)
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			if fallback == nil {
				return "", missing
			}
			return fallback(r)
		}
		return SecretKey(v), nil
	}
}

// SecretKey returns the key [HeaderKey] makes for a header's value: "hdr:"
// and the first 16 bytes of the value's SHA-256 in hex. Code that limits
// the same API keys elsewhere (gRPC metadata, a map of keys to plans) uses
// it to reach the same allowances. The string may be one it returned
// before for the same value (see [Middleware] on the cost of keys).
func SecretKey(value string) string {
	var sum [sha256.Size]byte
	if len(value) <= 1024 {
		// Hashed from a copy on the stack: converting value itself
		// would allocate for all but the shortest values.
		var b [1024]byte
		sum = sha256.Sum256(b[:copy(b[:], value)])
	} else {
		sum = sha256.Sum256([]byte(value))
	}
	var buf [len("hdr:") + 32]byte
	copy(buf[:], "hdr:")
	hex.Encode(buf[len("hdr:"):], sum[:16])
	return keys.intern(buf[:])
}

// Option configures [Middleware].
type Option func(*config)

type config struct {
	key      KeyFunc
	cost     CostFunc
	denied   DeniedHandler
	onError  ErrorHandler
	logger   *slog.Logger
	logAll   bool // log every request refused, or that a shadow limit would refuse
	shadow   bool
	report   ratelimit.ShadowFunc
	legacy   bool
	maxDelay time.Duration
	plan     func(*http.Request) string
	// countOnly chooses the responses that count (WithCountOnly); nil:
	// all of them.
	countOnly func(status int) bool
	// defaultDenied: denied is deny, whose body refuse builds itself.
	defaultDenied bool
	pk            *partition // WithPartitionKey; nil: no pk
	// warn receives the misconfiguration warnings (WithWarnings); nil
	// with warnSet: none.
	warn    *slog.Logger
	warnSet bool
	// memo keeps the RateLimit-Policy values made (see memoPolicy).
	memo *policyMemos
}

// WithKey sets how requests are keyed. The default is [ClientIP]{}.Key: the
// immediate peer's address, trusting no forwarded header.
func WithKey(f KeyFunc) Option {
	return func(c *config) {
		if f != nil {
			c.key = f
		}
	}
}

// WithCost sets what each request costs. The default is one
// [ratelimit.Unit].
func WithCost(f CostFunc) Option {
	return func(c *config) {
		if f != nil {
			c.cost = f
		}
	}
}

// WithDeniedHandler replaces the default response to a request over its
// limit: 429 with a JSON body {"error":"rate_limited","policy":...,
// "retry_after_ms":...,"message":...}.
func WithDeniedHandler(h DeniedHandler) Option {
	return func(c *config) {
		if h != nil {
			c.denied = h
		}
	}
}

// WithErrorHandler sets what happens when a request's limit cannot be
// checked. The default is [FailOpen]; [FailClosed] refuses with 503.
func WithErrorHandler(h ErrorHandler) Option {
	return func(c *config) {
		if h != nil {
			c.onError = h
		}
	}
}

// WithLogger turns on one log line for every request that is refused or
// cut short, written to l: "httplimit: rate limited" (level Info, with the
// key, policy and wait), "httplimit: would limit request" (Info, for a
// request admitted only because a limit runs in shadow mode, that is with
// Decision.Shadowed set), "httplimit: wait abandoned" (Info), "httplimit:
// no key" (Info, for [ErrNoKey]) and "httplimit: would reject cost" (Warn,
// in shadow mode). It also sends the middleware's error lines to l.
//
// Without it, the middleware logs no line per request: refusals are what
// a client over its limit causes, and a client flooding the server would
// otherwise flood its logs too. It then logs only the errors of its key
// function and limiter ("httplimit: limit not checked", level Error), to
// [slog.Default]. Error lines are capped whatever the logger: at most 10 at
// once and one a second after that, each middleware on its own; the next
// line written after some were dropped says how many in its "dropped"
// attribute.
//
// To send the error lines to l without the per-request ones, give l a
// handler whose level is Warn or above. A nil l changes nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
			c.logAll = true
		}
	}
}

// WithShadowMode runs the limit in shadow mode, to measure it on real
// traffic before enforcing it: the limiter is asked about every request
// and spends exactly as it would if it enforced, but no request is refused
// or delayed for it. report, if not nil, receives the limiter's own answer
// on every request it decides (see [ratelimit.ShadowReport]: the key, and
// the Decision as if enforced, with its exact RetryAfter).
//
// It is the core's shadow mode, [ratelimit.ShadowKeyed], applied to the
// middleware's limiter, so these three behave the same way:
//
//	httplimit.Middleware(lim, httplimit.WithShadowMode(report))
//	httplimit.Middleware(ratelimit.ShadowKeyed(lim, report))
//	httplimit.Middleware(composite) // whose every Layer has Shadow set and OnShadow: report
//
// Each request gets the RateLimit fields of its Decision made into an
// admission, as any admitted request does; Decision.Shadowed is set when
// the limit would have refused it, and with [WithLogger] such a request is
// logged as "httplimit: would limit request". A cost above the limit's
// capacity is admitted and reported with [ratelimit.ErrCostExceedsCapacity],
// as ShadowKeyed does. The limiter ShadowKeyed returns keeps lim's
// CheckContext, CheckWithin and Clock, so the middleware asks it in the
// same form it would ask lim (see [Middleware] and [WithMaxDelay]).
//
// Beyond what ShadowKeyed covers, shadow mode forwards every request the
// middleware cannot check, whatever the [ErrorHandler]: a missing key
// ([ErrNoKey]), a cost the [CostFunc] rejects, a cost of zero or less, and
// an error from the key function. Those get no RateLimit fields.
func WithShadowMode(report ratelimit.ShadowFunc) Option {
	return func(c *config) { c.shadow, c.report = true, report }
}

// WithPlan chooses the plan of each request, for a [ratelimit.Plans]
// limiter, from the request itself (a claim of its verified credentials,
// say) rather than from its key: the limiter is asked with
// [ratelimit.ContextWithPlan]. It needs a limiter that takes a context
// ([ratelimit.ContextChecker]); Plans does, and with [WithMaxDelay] too,
// since it is asked with CheckLayers, which takes the context. It does not
// reach another limiter asked with CheckWithin ([WithMaxDelay]), which
// takes no context. Without it a Plans limiter puts each key on the plan
// its plan function names. The RateLimit-Policy field names the plan's
// rule, or the plan when the rule has no name.
func WithPlan(f func(*http.Request) string) Option {
	return func(c *config) { c.plan = f }
}

// WithLegacyHeaders adds X-RateLimit-Limit (the Limit), X-RateLimit-Remaining
// (Remaining) and X-RateLimit-Reset (seconds until the allowance is whole
// again, rounded up: a delay, not a timestamp, so that it needs no clock
// agreement) to every response that carries the RateLimit fields.
func WithLegacyHeaders() Option {
	return func(c *config) { c.legacy = true }
}

// WithPartitionKey adds the draft's partition key parameter, pk, to every
// item of the RateLimit-Policy and RateLimit fields: a short keyed hash of
// the request's key (the first 8 bytes of its HMAC-SHA256 under secret, as
// a structured-field Byte Sequence, such as pk=:3q2+7wAAAAE=:), so that
// clients that share a quota (behind one address, or on one API key) can
// tell that they do, and clients on different keys can tell that they do
// not, without the key itself being revealed. The same secret on every
// replica gives a key the same pk everywhere; without it, pk could not be
// told from a digest of a guessable key such as an address. It is off by
// default.
//
// WithPartitionKey panics if secret is empty: a hash without a secret
// would let anyone confirm a guessed key.
func WithPartitionKey(secret []byte) Option {
	if len(secret) == 0 {
		panic("httplimit: WithPartitionKey with an empty secret; give a random secret of 32 bytes, the same on every replica")
	}
	p := newPartition(secret)
	return func(c *config) { c.pk = p }
}

// WithMaxDelay caps how long an admitted request may wait for its turn
// (its [ratelimit.Decision] Delay, set by a [ratelimit.LeakyBucket]); d <= 0
// means no cap, the default. A request that would wait longer than d is
// answered like one over its limit, with a Retry-After after which a request
// of the same cost would wait at most d.
//
// If the limiter has a method
//
//	CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error)
//
// as [ratelimit.Store] and [ratelimit.Composite] do, the middleware asks it
// instead of Check: a request refused for waiting too long then spends
// nothing, and its Decision is exact, RetryAfter and Policy being those of
// the rule whose queue is too long, even when several rules are combined.
//
// Other limiters can only be asked with Check, which has already admitted
// the request when the middleware sees its Delay, and a keyed limiter cannot
// take an admission back: the refused request's place in the queue stays
// taken, and drains at the rule's rate as if it had been served. The
// Retry-After is then worked out from the Decision's Delay, Limit and
// Window, which is exact when the Decision describes the queue itself, and
// a client that keeps sending while its queue is longer than d keeps it
// that long, and is refused until it backs off.
func WithMaxDelay(d time.Duration) Option {
	return func(c *config) { c.maxDelay = d }
}

// Middleware returns net/http middleware that checks every request against
// lim and forwards it only if it is admitted. lim is typically a
// [ratelimit.Store] or a [ratelimit.Composite]; it must be safe for
// concurrent use.
//
// Middleware panics if lim is nil, or a nil pointer (or other nil value) of
// a limiter type, such as a *ratelimit.Store left nil after NewStore
// failed: a mistake in the program, reported when the middleware is built
// rather than on the first request, as [http.Handle] reports its own.
// Likewise the function it returns panics for a nil handler.
//
// For each request the key and the cost are computed, and lim decides. The
// middleware asks in the most exact form lim offers: CheckLayers, with the
// request's context and the [WithMaxDelay] cap, if lim has it, as a
// [ratelimit.Composite] and a [ratelimit.Plans] do (outside shadow mode),
// so that the fields list every layer; CheckWithin when
// [WithMaxDelay] is set and lim has it (see there); otherwise CheckContext
// with the request's context if lim is a [ratelimit.ContextChecker], so that
// a limiter that waits on a network gives up with the request; otherwise
// Check. Then:
//
//   - admitted: the RateLimit fields are set and the request is forwarded,
//     after waiting out the Decision's Delay if it has one (a leaky bucket).
//     The wait is on lim's own clock if lim has a method Clock()
//     [ratelimit.Clock], as a Store and a Composite have, and on the system
//     clock otherwise; so a store given a [ratelimit.ManualClock] makes
//     the middleware wait on virtual time, and a test moves it on.
//     If the request's context ends during the wait (or has ended before
//     its check) the request is answered 503 Service Unavailable, not 429:
//     it was within its limit, and it is the request's own deadline or
//     cancellation that cut it short. An admitted request's allowance stays
//     spent.
//   - denied: the fields, Retry-After and Cache-Control: no-store are set,
//     and the [DeniedHandler] answers (429 by default). A client over its
//     own limit never gets 503. It is logged only if [WithLogger] asks.
//   - bad cost, or no key ([ErrNoKey]): 400 Bad Request with a JSON body.
//   - any other error from the key function or the limiter: logged (see
//     [WithLogger]), then the [ErrorHandler] decides ([FailOpen] by
//     default).
//
// The middleware starts no goroutines; the returned function and the
// handlers it builds are safe for concurrent use.
//
// An admitted request costs the middleware one allocation, for its
// RateLimit fields, when its key comes from [ClientIP.Key] or [HeaderKey]
// and has been made recently: the last keys [AddrKey] and [SecretKey] made
// are kept for reuse in a bounded table of 1024 entries. A key made afresh
// costs one more. A refusal with the default [DeniedHandler] costs one
// too: its fields, Retry-After and JSON body share it (two for a policy
// name of more than about 20 bytes). The RateLimit-Policy value of a rule
// is made once and kept (the last few rules' values), since it changes
// only with the rule.
func Middleware(lim ratelimit.KeyedLimiter, opts ...Option) func(http.Handler) http.Handler {
	if isNil(lim) {
		panic(fmt.Sprintf("httplimit: Middleware given a nil limiter (%T); pass the limiter that ratelimit.NewStore or ratelimit.Compose returned, after checking their error", lim))
	}
	c := config{
		key:     ClientIP{}.Key,
		cost:    FixedCost(ratelimit.Unit),
		onError: FailOpen,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.denied == nil {
		c.denied, c.defaultDenied = deny, true
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if !c.warnSet {
		c.warn = c.logger
	}
	c.memo = new(policyMemos)
	refund := c.refunderOf(lim)
	if c.shadow {
		// ShadowKeyed keeps the forms lim offers: CheckContext, and
		// CheckWithin and Clock where lim has them.
		lim = ratelimit.ShadowKeyed(lim, c.report)
	}
	base := handler{config: c, lim: lim, clock: ratelimit.SystemClock(), errs: newErrorLog(), refund: refund}
	base.withCtx, _ = lim.(ratelimit.ContextChecker)
	base.layered, _ = lim.(layered)
	if c.maxDelay > 0 {
		base.within, _ = lim.(withinChecker)
	}
	if c.warn != nil {
		base.watch = newWatch(c.warn)
	}
	if cl, ok := lim.(clocked); ok {
		if clk := cl.Clock(); clk != nil {
			base.clock = clk
		}
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit: nil handler")
		}
		h := base
		h.next = next
		return &h
	}
}

// isNil reports whether lim (a limiter) is nil or holds a nil pointer, map, slice,
// channel or function.
func isNil(lim any) bool {
	if lim == nil {
		return true
	}
	switch v := reflect.ValueOf(lim); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// withinChecker is a keyed limiter that can refuse a request that would
// wait too long for its turn without spending anything, as
// [ratelimit.Store] and [ratelimit.Composite] can.
type withinChecker interface {
	CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error)
}

// clocked is a limiter that tells which clock it reads, as
// [ratelimit.Store] and [ratelimit.Composite] do.
type clocked interface {
	Clock() ratelimit.Clock
}

type handler struct {
	config
	lim     ratelimit.KeyedLimiter
	withCtx ratelimit.ContextChecker // lim, if it takes a context
	layered layered                  // lim, if it tells its layers' Decisions
	within  withinChecker            // lim, if it has CheckWithin and maxDelay > 0
	watch   *watch                   // the misconfiguration checks; nil: off
	clock   ratelimit.Clock          // the clock a Delay is waited out on
	errs    *errorLog
	next    http.Handler
	refund  refunder // lim's Refund, for WithCountOnly; nil: every request counts
}

// ask asks the limiter, in the most exact form it offers; a layered
// limiter appends its layers' Decisions to layers.
func (h *handler) ask(ctx context.Context, key string, cost ratelimit.Units, layers []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error) {
	if h.layered != nil {
		return h.layered.CheckLayers(ctx, key, cost, h.maxDelay, layers)
	}
	d, err := h.askOne(ctx, key, cost)
	return d, nil, err
}

// askOne asks a limiter that does not tell its layers.
func (h *handler) askOne(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	switch {
	case h.within != nil:
		if err := ctx.Err(); err != nil {
			return ratelimit.Decision{}, err
		}
		return h.within.CheckWithin(key, cost, h.maxDelay)
	case h.withCtx != nil:
		return h.withCtx.CheckContext(ctx, key, cost)
	}
	return h.lim.Check(key, cost)
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, err := h.key(r)
	if err != nil {
		if errors.Is(err, ErrNoKey) {
			h.logRequest(r, slog.LevelInfo, "httplimit: no key", slog.Any("error", err),
				slog.String("method", r.Method), slog.String("path", r.URL.Path))
			if h.shadow {
				h.next.ServeHTTP(w, r)
			} else {
				writeJSON(w, http.StatusBadRequest, problem{Error: "missing_key", Message: err.Error()})
			}
			return
		}
		h.fail(w, r, fmt.Errorf("httplimit: key: %w", err))
		return
	}
	cost, err := h.cost(r)
	if err != nil {
		h.badCost(w, r, key, 0, nil, nil, err)
		return
	}
	if h.watch != nil && h.watch.sampled() {
		h.watch.observe(r, key)
	}
	ctx := r.Context()
	if h.plan != nil {
		ctx = ratelimit.ContextWithPlan(ctx, h.plan(r))
	}
	var lent *[8]ratelimit.Decision
	var layers []ratelimit.Decision
	if h.layered != nil {
		lent = layerBufs.Get().(*[8]ratelimit.Decision)
		defer layerBufs.Put(lent)
		layers = lent[:0]
	}
	d, layers, err := h.ask(ctx, key, cost, layers)
	var pk *[pkLen]byte
	if h.pk != nil {
		sum := h.pk.sum(key)
		pk = &sum
	}
	if err != nil {
		switch {
		case errors.Is(err, ratelimit.ErrInvalidCost) || errors.Is(err, ratelimit.ErrCostExceedsCapacity):
			h.badCost(w, r, key, cost, &d, pk, err)
			return
		case r.Context().Err() != nil:
			h.ended(w, r, key, d, 0)
			return
		case errors.Is(err, ratelimit.ErrDegraded) && !h.shadow:
			// The limiter's backend failed and its own failure policy
			// decided: the request gets that Decision (see ErrorHandler).
			h.errs.log(r.Context(), h.logger, "httplimit: limiter failed; its failure policy decided",
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		default:
			h.fail(w, r, fmt.Errorf("httplimit: limiter: %w", err))
			return
		}
	}
	if h.within == nil && h.layered == nil && d.Allowed && h.maxDelay > 0 && d.Delay > h.maxDelay {
		d = h.overCap(d, cost)
	}
	if !d.Allowed {
		if h.logAll {
			h.logger.LogAttrs(r.Context(), slog.LevelInfo, "httplimit: rate limited", limitAttrs(r, key, d)...)
		}
		h.refuse(w, r, d, layers, pk)
		return
	}
	if d.Shadowed && h.logAll {
		h.logger.LogAttrs(r.Context(), slog.LevelInfo, "httplimit: would limit request",
			slog.String("key", key), slog.String("policy", policyName(d)),
			slog.String("method", r.Method), slog.String("path", r.URL.Path))
	}
	if d.Delay > 0 {
		if err := ratelimit.Sleep(r.Context(), h.clock, d.Delay); err != nil {
			h.ended(w, r, key, d, d.Delay)
			return
		}
	}
	h.setFields(w.Header(), d, layers, pk, d.Delay)
	if h.refund != nil {
		h.serveCounted(w, r, key, cost, d)
		return
	}
	h.next.ServeHTTP(w, r)
}

// overCap turns an admission that would wait longer than maxDelay into a
// denial. The admission is spent (see WithMaxDelay): a request of the same
// cost sent at now+x would wait Delay + cost/rate - x, so it waits at most
// maxDelay from x = Delay + cost/rate - maxDelay. cost/rate is cost x
// Window / Limit, Window being the time to earn Limit.
func (h *handler) overCap(d ratelimit.Decision, cost ratelimit.Units) ratelimit.Decision {
	span := time.Duration(0)
	if d.Limit > 0 {
		q, r, ok := wide.MulDiv(uint64(cost), uint64(d.Window), uint64(d.Limit)*uint64(ratelimit.Unit))
		if r != 0 {
			q++
		}
		span = ratelimit.MaxTime
		if ok {
			span = time.Duration(min(q, uint64(ratelimit.MaxTime)))
		}
	}
	d.Allowed = false
	d.RetryAfter = min(d.Delay-h.maxDelay+span, ratelimit.MaxTime)
	d.Delay = 0
	return d
}

// ended answers a request whose context ended before it could go on:
// during its check, or while it waited delay for its turn.
func (h *handler) ended(w http.ResponseWriter, r *http.Request, key string, d ratelimit.Decision, delay time.Duration) {
	h.logRequest(r, slog.LevelInfo, "httplimit: wait abandoned",
		slog.String("key", key), slog.Duration("delay", delay), slog.Any("error", context.Cause(r.Context())))
	writeJSON(w, http.StatusServiceUnavailable, problem{
		Error:   "wait_abandoned",
		Policy:  policyName(d),
		Message: "the request ended while waiting for its turn",
	})
}

// fail handles an error from the key function or the limiter.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.errs.log(r.Context(), h.logger, "httplimit: limit not checked",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	if h.shadow || h.onError(w, r, err) {
		h.next.ServeHTTP(w, r)
	}
}

// badCost answers a request whose cost can never be admitted: err is the
// cost function's error (d is nil), shown to the client as it is, or one of
// the limiter's cost errors, with d carrying the policy. A cost above the
// policy's capacity names the policy in RateLimit-Policy, with the key's
// pk if there is one (WithPartitionKey puts it on every item of the
// field): the client learns which quota its request can never fit, and
// that it is the one its other answers name.
func (h *handler) badCost(w http.ResponseWriter, r *http.Request, key string, cost ratelimit.Units, d *ratelimit.Decision, pk *[pkLen]byte, err error) {
	if h.shadow {
		h.logRequest(r, slog.LevelWarn, "httplimit: would reject cost",
			slog.String("key", key), slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Any("error", err))
		h.next.ServeHTTP(w, r)
		return
	}
	p := problem{Error: "invalid_cost", Message: err.Error()}
	switch {
	case d == nil:
	case errors.Is(err, ratelimit.ErrCostExceedsCapacity):
		p = problem{
			Error:  "cost_exceeds_limit",
			Policy: policyName(*d),
			Message: fmt.Sprintf("this request costs %v, more than the %d that policy %q allows at once; it can never be admitted",
				cost, d.Limit, policyName(*d)),
			Detail: err.Error(),
		}
		w.Header().Set("RateLimit-Policy", string(appendPK([]byte(policyField(*d)), pk)))
	default:
		p.Policy = policyName(*d)
		p.Message = fmt.Sprintf("this request has no positive cost (it costs %v)", cost)
		p.Detail = err.Error()
	}
	writeJSON(w, http.StatusBadRequest, p)
}

// logRequest writes a line about one request, if WithLogger asked for
// them.
func (h *handler) logRequest(r *http.Request, level slog.Level, msg string, attrs ...slog.Attr) {
	if h.logAll {
		h.logger.LogAttrs(r.Context(), level, msg, attrs...)
	}
}

// errorLog caps the middleware's error lines: an outage of the limiter
// fails every request, and one line for each would bury everything else.
type errorLog struct {
	lim     ratelimit.Limiter
	dropped atomic.Int64
}

func newErrorLog() *errorLog {
	lim, err := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 10})
	if err != nil {
		panic(err) // a constant, valid rule
	}
	return &errorLog{lim: lim}
}

// log writes an error line unless too many have been written lately.
func (e *errorLog) log(ctx context.Context, l *slog.Logger, msg string, attrs ...slog.Attr) {
	if d, _ := e.lim.Check(ratelimit.Unit); !d.Allowed {
		e.dropped.Add(1)
		return
	}
	if n := e.dropped.Swap(0); n > 0 {
		attrs = append(attrs, slog.Int64("dropped", n))
	}
	l.LogAttrs(ctx, slog.LevelError, msg, attrs...)
}

func limitAttrs(r *http.Request, key string, d ratelimit.Decision) []slog.Attr {
	return []slog.Attr{
		slog.String("key", key),
		slog.String("policy", policyName(d)),
		slog.Duration("retry_after", d.RetryAfter),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
	}
}

// problem is the JSON body of the middleware's own error responses.
type problem struct {
	Error   string `json:"error"`
	Policy  string `json:"policy,omitempty"`
	Message string `json:"message"`
	// Detail is the limiter's own error, for a cost it refused.
	Detail string `json:"detail,omitempty"`
}

// denial is the JSON body of the default 429 response.
type denial struct {
	Error        string `json:"error"`
	Policy       string `json:"policy"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

// deny is the default DeniedHandler.
func deny(w http.ResponseWriter, _ *http.Request, d ratelimit.Decision) {
	ms := ceilDiv(d.RetryAfter, time.Millisecond)
	// The message is fmt.Sprintf("too many requests for policy %q: retry
	// in %v", ...), built without boxing its arguments.
	var buf [128]byte
	msg := append(buf[:0], "too many requests for policy "...)
	msg = strconv.AppendQuote(msg, policyName(d))
	msg = append(msg, ": retry in "...)
	msg = append(msg, (time.Duration(ms) * time.Millisecond).String()...)
	writeJSON(w, http.StatusTooManyRequests, denial{
		Error:        "rate_limited",
		Policy:       policyName(d),
		RetryAfterMs: ms,
		Message:      string(msg),
	})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	b, err := json.Marshal(body)
	if err != nil { // cannot happen for the types above
		b = []byte(`{"error":"internal"}`)
	}
	setHeaders(w.Header(), "Content-Type", "application/json", "X-Content-Type-Options", "nosniff",
		"Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// setHeaders sets each field of kv (canonical names, each followed by its
// value) to its value, replacing what h held, as h.Set would, with the
// one-element slices for all of them in one allocation.
func setHeaders(h http.Header, kv ...string) {
	vals := make([]string, len(kv)/2)
	for i := range vals {
		vals[i] = kv[2*i+1]
		h[kv[2*i]] = vals[i : i+1 : i+1]
	}
}

// ceilDiv returns d/unit rounded up, for d >= 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/unit + 1)
}
