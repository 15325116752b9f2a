package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/ratekit/ratelimit"
)

// Slots is an in-flight limit that [InFlight] takes its slots from: a
// [*ratelimit.InFlight], or one whose slots live outside the process and
// are shared by every replica (redisstore's InFlight). Each method keeps
// the contract of [ratelimit.InFlight]'s method of the same name; an
// error matching [ratelimit.ErrDegraded] comes with the Decision (and the
// Release) of the limit's own failure policy.
type Slots interface {
	AcquireContext(ctx context.Context, key string) (ratelimit.Release, ratelimit.Decision, error)
	AcquireWith(ctx context.Context, key string, rate ratelimit.KeyedLimiter, cost ratelimit.Units) (ratelimit.Release, ratelimit.Decision, error)
	Clock() ratelimit.Clock
}

// InFlight returns net/http middleware that lets at most lim's Limit
// requests of each key be in progress at once, and also checks rate if it
// is not nil. A request is forwarded only with a slot, which it holds
// until the handler returns, panics included; a request refused a slot is
// answered as one over its limit, 429 by default.
//
// With rate, each request takes its slot with AcquireWith ([ratelimit.InFlight.AcquireWith]):
// all or nothing, so a request that rate refuses takes no slot and one
// refused a slot spends nothing from rate. The request's cost ([WithCost])
// is what rate is asked about; a slot is one request whatever its cost.
//
// It is [Middleware] over that acquisition, with the same options and
// answers: [WithKey], [WithCost], [WithDeniedHandler], [WithErrorHandler],
// [WithLogger], [WithLegacyHeaders] and [WithPlan] (the plan reaches rate),
// and [WithShadowMode], under which a request without a slot is forwarded
// too and reported. With [WithMaxDelay], a request whose rate admission
// would wait too long is refused: without spending when rate tells its
// layers (a [ratelimit.Composite], [ratelimit.Plans], redisstore's
// Composite: it is asked with its CheckLayers and the cap), otherwise as
// Middleware refuses it for a limiter without CheckWithin, its rate
// allowance spent.
//
// Responses: a request refused by rate gets the fields, Retry-After and
// body of rate's Decision, as from Middleware. A request refused a slot
// gets no RateLimit fields (an in-flight limit is not a quota over time,
// and its Decision has no Window), a Retry-After of 1 (a slot frees as
// soon as any request of the key ends, which cannot be known in advance:
// the Decision's RetryAfter is 0), and the [DeniedHandler]'s answer. An
// admitted request carries rate's fields (every enforced layer of a rate
// that tells its layers, as from Middleware), or none without rate.
//
// A rate limiter whose backend failed answers with an error matching
// [ratelimit.ErrDegraded] and the Decision its failure policy made (a Redis
// store failing open, or its fallback): that Decision decides the rate, as
// it does in Middleware, and never the slot. An admission so decided takes
// a slot like any other (see [ratelimit.InFlight.AcquireWith]; a Slots of
// another backend keeps the same contract), and a request is forwarded
// only with one.
//
// InFlight panics if lim is nil, or if rate is a nil pointer of a limiter
// type (a *ratelimit.Store left nil after NewStore failed; a nil interface
// means no rate limit), as Middleware does for its limiter, and the
// function it returns panics for a nil handler.
func InFlight(lim Slots, rate ratelimit.KeyedLimiter, opts ...Option) func(http.Handler) http.Handler {
	if isNil(lim) {
		panic("httplimit: InFlight given a nil in-flight limit; pass the limiter that ratelimit.NewInFlight returned, after checking its error")
	}
	if rate != nil && isNil(rate) {
		panic(fmt.Sprintf("httplimit: InFlight given a nil rate limiter (%T); pass the limiter that ratelimit.NewStore or ratelimit.Compose returned, after checking their error, or a nil interface for no rate limit", rate))
	}
	var slots ratelimit.KeyedLimiter = &slotLimiter{lim: lim, rate: rate}
	if lr, ok := rate.(layered); ok {
		slots = &layeredSlots{slotLimiter{lim: lim, rate: layersAsker{lr}}}
	}
	wrap := Middleware(slots, opts...)
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit: nil handler")
		}
		limited := wrap(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The acquisition happens inside Middleware; it leaves its
			// Release here, and the slot is given back when everything,
			// the handler included, has returned or panicked.
			s := &heldSlot{Context: r.Context()}
			defer s.release()
			limited.ServeHTTP(w, r.WithContext(s))
		})
	}
}

// heldSlotKey is the context key of a request's heldSlot.
type heldSlotKey struct{}

// heldSlot is a request's context, and where its acquisition leaves its
// Release: one allocation for both, where context.WithValue would take
// another.
type heldSlot struct {
	context.Context
	rel ratelimit.Release
	// For a rate that tells its layers (see layeredSlots): the cap its
	// check is asked with, and where it appends its layers' Decisions.
	maxDelay time.Duration
	layers   []ratelimit.Decision
}

// Value returns the heldSlot itself for heldSlotKey, and the parent's
// values otherwise.
func (s *heldSlot) Value(key any) any {
	if key == (heldSlotKey{}) {
		return s
	}
	return s.Context.Value(key)
}

func (s *heldSlot) release() {
	if s.rel != nil {
		s.rel()
	}
}

// slotLimiter is an in-flight limit, with rate limits or without, as the
// keyed limiter Middleware asks. Each check takes a slot and leaves its
// Release in the request's heldSlot.
type slotLimiter struct {
	lim  Slots
	rate ratelimit.KeyedLimiter // nil: the in-flight limit alone
}

func (l *slotLimiter) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return l.CheckContext(context.Background(), key, cost)
}

func (l *slotLimiter) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	var (
		rel ratelimit.Release
		d   ratelimit.Decision
		err error
	)
	if l.rate == nil {
		rel, d, err = l.lim.AcquireContext(ctx, key)
	} else {
		rel, d, err = l.lim.AcquireWith(ctx, key, l.rate, cost)
	}
	s, ok := ctx.Value(heldSlotKey{}).(*heldSlot)
	if ok && s.rel == nil {
		s.rel = rel
	} else {
		rel() // no request to hold it for: never keep a slot nobody releases
	}
	// An admission rate's failure policy made comes with its slot and
	// its error (ErrDegraded), which Middleware reports and forwards.
	return d, err
}

// Clock is the clock a leaky bucket's Delay is waited out on: rate's.
func (l *slotLimiter) Clock() ratelimit.Clock {
	if c, ok := l.rate.(clocked); ok {
		if clk := c.Clock(); clk != nil {
			return clk
		}
	}
	return l.lim.Clock()
}

// layeredSlots is the slot limiter over a rate limiter that tells its
// layers' Decisions (a Composite, Plans, redisstore's Composite): it tells
// them too, so that Middleware lists every layer of the rate in the fields
// of a request that rate decided, and a request whose rate admission would
// wait past WithMaxDelay is refused without spending (CheckLayers's cap).
// Its rate is a layersAsker, which asks with the cap and the buffer the
// request's heldSlot carries, so that asking allocates nothing more.
type layeredSlots struct{ slotLimiter }

func (l *layeredSlots) CheckLayers(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, dst []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error) {
	s, ok := ctx.Value(heldSlotKey{}).(*heldSlot)
	if !ok {
		d, err := l.CheckContext(ctx, key, cost)
		return d, dst, err
	}
	s.maxDelay, s.layers = maxDelay, dst
	d, err := l.CheckContext(ctx, key, cost)
	layers := s.layers // dst as it was if no slot was free: rate not asked
	s.layers = nil
	return d, layers, err
}

// layersAsker asks a layered rate limiter with the cap and buffer of the
// request's heldSlot (see layeredSlots), keeping its layers' Decisions
// there.
type layersAsker struct{ rate layered }

func (a layersAsker) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return a.CheckContext(context.Background(), key, cost)
}

func (a layersAsker) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	s, ok := ctx.Value(heldSlotKey{}).(*heldSlot)
	if !ok {
		d, _, err := a.rate.CheckLayers(ctx, key, cost, 0, nil)
		return d, err
	}
	d, layers, err := a.rate.CheckLayers(ctx, key, cost, s.maxDelay, s.layers)
	s.layers = layers
	return d, err
}

// Clock is the rate's clock, for a leaky bucket's Delay.
func (a layersAsker) Clock() ratelimit.Clock {
	if c, ok := a.rate.(clocked); ok {
		return c.Clock()
	}
	return nil
}
