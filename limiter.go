package ratelimit

import (
	"context"
	"hash/maphash"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter is the one interface every algorithm is used through.
//
// Check asks to spend cost at the limiter's current time. It returns the
// [Decision] and a nil error whether the request was admitted or not; an
// error is returned only for a cost that can never be admitted: zero or less
// ([ErrInvalidCost]) or more than the rule's capacity
// ([ErrCostExceedsCapacity]). On an error nothing is spent and the Decision
// carries only the rule's Limit, Policy and Window.
//
// Wait blocks until cost is admitted and returns the admitting Decision.
// After a denial it sleeps on the limiter's clock for exactly the denial's
// RetryAfter and asks again; it never polls. A [LeakyBucket] request also
// waits out its Delay before Wait returns. Wait gives up at once, spending
// nothing, when ctx ends or when ctx's deadline would come before the
// request could go on (an error matching [ErrWouldExceedDeadline] and
// [context.DeadlineExceeded]). A leaky-bucket request whose ctx ends during
// its Delay has already been admitted and stays spent, as a request that
// has joined a queue: Wait returns its admitting Decision with ctx's error.
// Its cost errors are Check's.
//
// Implementations in this package are safe for concurrent use, and
// concurrent checks are linearizable: they behave as if they happened one at
// a time, in some order consistent with real time. One refinement: the
// lock-free GCRA, token bucket and leaky bucket read the clock before they
// compete for the state, so a check overtaken in between is judged at the
// latest instant the state proves was already used, which may be a little
// earlier than the overtaking check's; it can then be refused where a
// later instant would admit it, never the other way round.
type Limiter interface {
	Check(cost Units) (Decision, error)
	Wait(ctx context.Context, cost Units) (Decision, error)
}

// Rule is a rate-limiting rule: one of [TokenBucket], [GCRA],
// [LeakyBucket], [FixedWindow], [SlidingLog], [SlidingCounter] and
// [SubWindow]. Rules are
// plain values, validated when a limiter is built from them; a limiter
// keeps what it derived from its rule, so changing or reusing the rule value
// afterwards affects nothing already built. The zero value of every rule
// type is invalid ([ErrInvalidRule]). The interface is sealed: only this
// package's rule types implement it.
type Rule interface {
	// bind validates the rule and compiles it, binding its algorithm to the
	// algorithm's state type.
	bind() (binding, error)
}

// KeyedLimiter is a limiter with one allowance per key, such as a [Store].
// Check has exactly the single-key semantics of [Limiter.Check] for each key.
type KeyedLimiter interface {
	Check(key string, cost Units) (Decision, error)
}

// binding is a compiled rule with its state type bound: what every container
// needs to build itself around the rule's algorithm, without knowing which
// algorithm it is.
type binding interface {
	newLimiter(o *options) Limiter
	newStore(o *options) keyedStore
	newMachine() machineCore
}

// bound is the binding of an algorithm A with state S.
type bound[S any, A algorithm[S]] struct{ alg A }

func (b bound[S, A]) newLimiter(o *options) Limiter { return newSingle[S](b.alg, o) }

func (b bound[S, A]) newStore(o *options) keyedStore { return newStoreCore[S](b.alg, o) }

func (b bound[S, A]) newMachine() machineCore { return machineOf[S, A](b) }

// Option configures a limiter or store built by [New] or [NewStore].
type Option func(*options)

type options struct {
	clock Clock
	store storeOptions // read by NewStore only (store.go)
	obs   Observer     // nil: none (observer.go)
	// label is the policy a store reports for an unnamed rule (a plan's
	// name); set by NewPlans only.
	label string
	// seed, if set, is the seed a store hashes keys with, instead of one
	// of its own: a Plans' stores and its records share one (set by
	// NewPlans only), so that a key is hashed once for its record and the
	// store of its plan.
	seed *maphash.Seed
	// logger takes the warnings given once per process (planwarn.go);
	// nil: slog.Default(). quiet silences them.
	logger *slog.Logger
	quiet  bool
}

// WithLogger makes a limiter write the warnings it gives once per process,
// never per check, to l instead of [slog.Default]; a nil l silences them.
// Today the one such warning is a [Plans] whose plan function names no plan
// of its set for many distinct keys (see [NewPlans]).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		o.logger = l
		o.quiet = l == nil
	}
}

// WithClock makes the limiter read time from c instead of [SystemClock]. A
// nil c leaves the default in place.
func WithClock(c Clock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

func buildOptions(opts []Option) *options {
	o := &options{clock: SystemClock()}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	return o
}

// New validates rule and returns a single-key [Limiter] for it, starting
// full (as a fresh key). A malformed rule is an error that matches
// [ErrInvalidRule]. The limiter is safe for concurrent use, starts no
// goroutines and needs no Close.
func New(rule Rule, opts ...Option) (Limiter, error) {
	if isNil(rule) {
		return nil, nilRuleError("rule")
	}
	b, err := rule.bind()
	if err != nil {
		return nil, err
	}
	return b.newLimiter(buildOptions(opts)), nil
}

// isNil reports whether v (a rule, a keyed limiter) is nil or a nil
// pointer, which the constructors refuse instead of dereferencing.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// nilRuleError is the error for a nil rule in the field named field.
func nilRuleError(field string) error {
	return &RuleError{Rule: "Rule", Field: field, Reason: "is nil"}
}

// algorithm is a compiled rule: everything derived from the rule is computed
// once, and step is the rule's one pure state transition, shared by every
// container (the single-key limiter, the keyed store, composites).
//
// S is the per-key state: a small value whose zero value is a fresh key.
type algorithm[S any] interface {
	// step decides whether cost (in milli-units, 1 <= cost <= capacity) can
	// be admitted at now (in ns, 0 <= now <= MaxTime). With m stepCheck it
	// updates *s when the request is admitted or the rule counts refused
	// cost too (CountRefused); the other modes are pure looks (see
	// stepMode). A now earlier than the state's own notion of time is
	// clamped to it.
	step(s *S, now, cost int64, m stepMode) Decision
	// fresh reports whether s at now is as good as the zero state, so that
	// dropping it loses nothing.
	fresh(s *S, now int64) bool
	// capacity is the largest cost in milli-units.
	capacity() int64
	// policy describes the rule: Decision's Limit, Policy and Window.
	policy() *policy
	// migrator moves a key between rules (see Migration).
	migrator[S]
	// codec reads and writes the state for a Machine.
	codec[S]
	// refunder gives back admitted cost (see refund.go).
	refunder[S]
}

// stepMode is what a step does with a key's state, and how it reports a
// refusal that the rule counts (CountRefused of [SlidingCounter] and
// [SubWindow]). Only a check counts one (a Check of a limiter, a store or
// a plan of one rule); every other caller, a Wait, a CheckWithin, a
// [Composite] or a plan of layers, spends only what it admits, so its
// refusal leaves the key as it was and its RetryAfter is when this same
// request passes.
type stepMode uint8

const (
	// stepCheck decides and records the outcome: an admitted cost and, under
	// CountRefused, a refused one.
	stepCheck stepMode = iota
	// stepPeek decides as stepCheck would and changes nothing: a refusal the
	// rule counts is reported as counted, as the check reports it (Peek and
	// the Decision after a settlement, for a caller whose checks count).
	stepPeek
	// stepLook decides for a caller that never counts a refusal and changes
	// nothing: a refusal is reported on the key as it stands. It differs
	// from stepPeek only for a refusal under CountRefused.
	stepLook
)

// commits reports whether the step records its outcome.
func (m stepMode) commits() bool { return m == stepCheck }

// counts reports whether a refusal the rule counts is counted, in the
// state (stepCheck) or in the Decision alone (stepPeek).
func (m stepMode) counts() bool { return m != stepLook }

// policy is the part of every Decision that describes the rule rather than
// the request: Limit, Policy and Window.
type policy struct {
	name   string
	limit  int64
	window time.Duration
}

// decision returns a Decision carrying the policy's fields.
func (p *policy) decision() Decision {
	return Decision{Limit: p.limit, Policy: p.name, Window: p.window}
}

// checkCost validates a cost against a capacity in milli-units. On an error
// the Decision carries only the policy's fields.
func checkCost(cost Units, capacity int64, p *policy) (Decision, error) {
	if cost <= 0 {
		return p.decision(), &CostError{Cost: cost, Capacity: Units(capacity), Policy: p.name}
	}
	if int64(cost) > capacity {
		return p.decision(), &CostError{Cost: cost, Capacity: Units(capacity), Policy: p.name}
	}
	return Decision{}, nil
}

// timeLock is a mutex together with the latest instant used under it. The
// clock is read before the lock is taken; inside it, a reading earlier than
// that instant is taken as that instant, so the states it guards only ever
// see time move forwards. The single-key limiter and every store shard use
// it.
type timeLock struct {
	mu   sync.Mutex
	last int64
}

// lock takes the lock and returns now clamped as described, recording it.
func (l *timeLock) lock(now int64) int64 {
	l.mu.Lock()
	return l.advance(now)
}

// advance, with the lock held, clamps now to the latest instant used and
// records it.
func (l *timeLock) advance(now int64) int64 {
	if now < l.last {
		now = l.last
	}
	l.last = now
	return now
}

func (l *timeLock) unlock() { l.mu.Unlock() }

// single is the single-key limiter for any algorithm: one state guarded by a
// timeLock.
type single[S any, A algorithm[S]] struct {
	alg    A
	capMil int64   // alg.capacity(), read once: no call on the hot path
	pol    *policy // alg.policy()
	clock  Clock
	obs    Observer
	tl     timeLock
	state  S
}

func newSingle[S any, A algorithm[S]](alg A, o *options) *single[S, A] {
	return &single[S, A]{alg: alg, capMil: alg.capacity(), pol: alg.policy(), clock: o.clock, obs: o.obs}
}

func (l *single[S, A]) Check(cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.capMil, l.pol); err != nil {
		return d, err
	}
	now := l.tl.lock(clampTime(l.clock.Now()))
	d := l.alg.step(&l.state, now, int64(cost), stepCheck)
	l.tl.unlock()
	if l.obs != nil {
		l.obs.Decided(d, cost, outcomeOf(&d))
	}
	return d, nil
}

// monotonic wraps a clock that is not known to be monotonic, clamping its
// readings so that they never go backwards.
type monotonic struct {
	clock Clock
	last  atomic.Int64
}

func (m *monotonic) now() int64 {
	t := clampTime(m.clock.Now())
	for {
		last := m.last.Load()
		if t <= last {
			return last
		}
		if m.last.CompareAndSwap(last, t) {
			return t
		}
	}
}
