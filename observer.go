package ratelimit

import "time"

// Observer is told what a limiter does, for metrics: every decision, every
// Wait, every key a store drops to make room, and every failure of a
// backend. Give one to a limiter with [WithObserver]; packages
// ratelimitprom and ratelimitotel (nested modules of this one) turn it
// into Prometheus and OpenTelemetry metrics.
//
// An Observer is called on the goroutine of the request it describes, after
// the decision and outside every lock the limiter holds, so it may be called
// concurrently and must be safe for that. It should be quick (a counter's
// increment): the request waits for it. It must not call back into the
// limiter that called it.
//
// Labels. The policy passed to every method is a rule's Name (a plan's name
// for a rule of a [Plans] without one, "" for an unnamed rule), never a
// key: the values an Observer sees are as few as the rules configured, so
// they are safe to use as metric labels.
//
// Why an interface of four methods, and not a struct of callbacks or one
// method taking an event: a metrics adapter is a value with state (its
// counters) that handles every kind of event, which an interface says
// directly; a nil Observer is "none", so a limiter without one pays one nil
// check per call and nothing else; and each method takes plain values, so a
// call allocates nothing. Events added later will come as separate
// interfaces that an Observer may also implement (found once, when a
// limiter is built), so that this one never grows and no implementation
// breaks.
type Observer interface {
	// Decided is told of one request's outcome: each call of Check,
	// CheckContext or CheckWithin that returns a Decision without an error,
	// and each Wait that made at least one attempt, once, with its final
	// Decision (the admitting one, or the last refusal if it gave up). The
	// retries inside a Wait are not decisions of their own. A cost error
	// (zero or less, or above the capacity) is the caller's mistake, not a
	// decision, and is not reported.
	//
	// For [OutcomeAllowed] and [OutcomeRefused], d is the Decision the
	// caller got. For [OutcomeShadowRefused] (the request was admitted, but
	// a limit in shadow mode would have refused it: [Shadow],
	// [ShadowKeyed], a shadow [Layer]), d is that shadow limit's own
	// answer, so that d.Policy names the limit that would have refused and
	// d.RetryAfter how long it would have held the request back; with
	// several such limits, the first. cost is what the request asked for.
	Decided(d Decision, cost Units, o Outcome)

	// Waited is told of each Wait: [WaitStarted] when it begins (with a
	// valid cost), then exactly one of [WaitAdmitted] and [WaitAbandoned]
	// when it returns, with how long it waited on the limiter's clock
	// (waited is 0 for WaitStarted). A Wait returning an error is
	// abandoned, a [LeakyBucket] request whose context ended during its
	// Delay included (it stays spent: see [Limiter.Wait]). The three
	// events of one Wait carry the same policy: that of the limit first
	// asked (a composite's first enforced layer).
	Waited(policy string, e WaitEvent, waited time.Duration)

	// Evicted is told that a store dropped n keys of the policy's store to
	// make room for others. lossy reports whether they were partly spent,
	// and so start again with a fresh allowance (see [StoreStats]); a
	// store drops both kinds in one go and then makes two calls. It is told
	// once the store's locks are released.
	Evicted(policy string, n uint64, lossy bool)

	// Failed is told that a limiter's backend failed a request with err: a
	// store whose state lives outside the process calls it (with the
	// rule's policy) whenever it returns an error that is not a cost error
	// or the caller's context, before its failure mode applies. The
	// in-process limiters of this package call it only for a broken
	// invariant that they report as an error.
	Failed(policy string, err error)
}

// Outcome is what became of a request, as [Observer.Decided] is told.
type Outcome uint8

// The outcomes of a request.
const (
	// OutcomeAllowed: the request was admitted, and no shadow limit
	// would have refused it.
	OutcomeAllowed Outcome = iota
	// OutcomeRefused: the request was refused.
	OutcomeRefused
	// OutcomeShadowRefused: the request was admitted, but a limit in
	// shadow mode would have refused it.
	OutcomeShadowRefused
)

// String returns "allowed", "refused" or "shadow_refused": the values a
// metric's outcome label takes.
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeRefused:
		return "refused"
	case OutcomeShadowRefused:
		return "shadow_refused"
	}
	return "unknown"
}

// WaitEvent is a step of a Wait, as [Observer.Waited] is told.
type WaitEvent uint8

// The steps of a Wait.
const (
	// WaitStarted: a Wait began, with a valid cost.
	WaitStarted WaitEvent = iota
	// WaitAdmitted: the Wait returned its admitting Decision.
	WaitAdmitted
	// WaitAbandoned: the Wait returned an error: its context ended, its
	// deadline would have come first, or the limiter failed.
	WaitAbandoned
)

// String returns "started", "admitted" or "abandoned".
func (e WaitEvent) String() string {
	switch e {
	case WaitStarted:
		return "started"
	case WaitAdmitted:
		return "admitted"
	case WaitAbandoned:
		return "abandoned"
	}
	return "unknown"
}

// WithObserver makes a limiter report to o (see [Observer]): accepted by
// [New], [NewStore], [Compose] (every layer's store reports its evictions to
// it, unless a layer's own Options name another), [NewPlans], [Shadow],
// [ShadowKeyed], and the load shedders [NewWorkerShedder] and
// [NewFleetShedder] (see [ShedObserver]). A nil o leaves the limiter
// unobserved, which is the default: it then costs nothing but a nil check
// per call.
//
// Observe a shadow limit through the [Shadow] or [ShadowKeyed] wrapped
// around it, not through the limit itself, which would report as refused
// the requests it only watches.
func WithObserver(o Observer) Option {
	return func(opts *options) { opts.obs = o }
}

// outcomeOf is the outcome of a Decision from an enforcing limit.
func outcomeOf(d *Decision) Outcome {
	if d.Allowed {
		return OutcomeAllowed
	}
	return OutcomeRefused
}

// observe tells obs of an attempt's outcome, for a cost already checked:
// the caller's Decision, or the shadow limit's own for a request only a
// shadow would refuse.
func observe(obs Observer, a *attempt, cost int64) {
	switch {
	case a.err != nil:
		if a.err == errNoRoom {
			obs.Failed(a.d.Policy, a.err)
		}
	case a.d.Allowed && a.d.Shadowed:
		obs.Decided(a.shadow, Units(cost), OutcomeShadowRefused)
	default:
		obs.Decided(a.d, Units(cost), outcomeOf(&a.d))
	}
}

// evictions counts keys a store shard dropped to make room, to report to
// the store's Observer once its lock is released: n keys that were fresh,
// lossy keys that were partly spent.
type evictions struct{ n, lossy uint64 }
