package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// Errors returned with a Decision when Redis could not decide. Match them
// with [errors.Is]; the error returned wraps the cause as well.
var (
	// ErrUnavailable means Redis did not answer in time or answered with an
	// error: the Decision returned is the failure policy's (see
	// [WithFailureMode] and [WithFallback]).
	ErrUnavailable = errors.New("redisstore: redis unavailable")

	// ErrCircuitOpen means the store did not try Redis because recent calls
	// failed; it also matches [ErrUnavailable].
	ErrCircuitOpen = fmt.Errorf("%w: circuit open after repeated failures", ErrUnavailable)

	// ErrMismatch means the script's new state is not the one the rule's
	// [ratelimit.Machine] computes from the same old state and instant. It
	// would be a bug; the request is denied.
	ErrMismatch = errors.New("redisstore: script and machine disagree")
)

// Store is a keyed rate limiter whose per-key state lives in Redis, so that
// every process sharing the Redis sees one allowance per key. For every rule
// [ratelimit.New] accepts it gives, field for field, the Decision the
// in-process limiter gives on the same trace at the same instants; a
// refusal answered by its deny cache is refused alike, but may report a
// longer RetryAfter and ResetAfter and a lower Remaining (see
// [WithDenyCache]).
//
// Each check is one script call (EVALSHA), atomic on the server: the script
// reads the key's state, decides with exact integer arithmetic, writes the
// new state with an expiry and returns the old state, the instant and the
// new state. The Decision is then computed in Go by the rule's
// [ratelimit.Machine] from that old state and instant, and the Machine's new
// state must equal the script's, so every Decision field has one definition.
//
// A Store is safe for concurrent use, starts no goroutines of its own (but
// see [New] on clients that ignore deadlines) and has nothing to close; the
// client stays the caller's.
type Store struct {
	rdb      redis.UniversalClient
	m        *ratelimit.Machine
	p        ratelimit.Params
	alg      *algorithm // the rule's entry in the table of algorithms
	keyHead  string     // prefix and rule tag
	clock    ratelimit.Clock
	o        options
	guard    bool     // the client may not stop at a context's deadline
	marginMs int64    // expiry margin in ms
	stepArgs stepArgs // the rule's arguments to the check's step
	lookArgs stepArgs // and those of a check whose refusal spends nothing
	packed   atomic.Pointer[packedCheck]
	script   scriptRunner
	br       *circuit
	dl       atomic.Pointer[deadline]

	counters

	deny  *denyCache // nil when off
	judge oneKey     // what the deny cache decides with

	// layered is the rule as one layer, for a rule whose admissions may
	// carry a Delay (a leaky bucket, see algorithm.delays), which a check
	// with a bound must know to fit before it spends: such a check decides
	// with its StepWithin.
	layered *ratelimit.LayeredMachine
}

// counters are a Store's or a Composite's Stats.
type counters struct {
	failures, circuitRefusals, invalid, mismatches, localDenials atomic.Uint64
}

// failed counts a check that Redis did not decide because of err, an
// error matching ErrUnavailable.
func (s *counters) failed(err error) {
	s.failures.Add(1)
	if errors.Is(err, ErrCircuitOpen) {
		s.circuitRefusals.Add(1)
	}
}

// New returns a Store for rule on the Redis that rdb talks to. rule is
// validated as by [ratelimit.New]; a bad rule or option is an error.
//
// Every call has a deadline: the caller's context's, else the timeout of
// [WithTimeout]. A client built with ContextTimeoutEnabled (a
// [redis.Client], [redis.ClusterClient] or [redis.Ring]) stops at that
// deadline by itself; for any other client each call runs on a goroutine
// the check stops waiting for at the deadline, which then lives on until
// the client's own read timeout.
func New(rdb redis.UniversalClient, rule ratelimit.Rule, opts ...Option) (*Store, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil client", ratelimit.ErrInvalidOption)
	}
	m, err := ratelimit.NewMachine(rule)
	if err != nil {
		return nil, err
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	p := m.Params()
	s := &Store{
		rdb:      rdb,
		m:        m,
		p:        p,
		clock:    o.clock,
		o:        o,
		guard:    !honoursContext(rdb),
		script:   stepScript,
		deny:     newDenyCache(o.denyCache),
		judge:    oneKey{m},
		marginMs: max(1, ceilMs(o.margin)),
	}
	if _, ok := rdb.(*redis.Client); ok {
		// One server: the step runs as a function where the server has
		// Redis Functions (see functionCaller). A Cluster or a Ring keeps
		// EVALSHA, which each of its servers loads as it is first called.
		s.script = &functionCaller{lib: stepLibrary, fn: stepFunction, fallback: stepScript}
	}
	s.br = newCircuit(rdb, s.guard)
	a, ok := algorithmFor(p.Algorithm)
	if !ok {
		return nil, fmt.Errorf("%w: algorithm %q has no Redis script", ratelimit.ErrInvalidRule, p.Algorithm)
	}
	if p.CountRefused && !a.step.takes(argRefused) {
		// The step does not know the option: refuse rather than decide
		// without it.
		return nil, fmt.Errorf("%w: %s with CountRefused has no Redis script", ratelimit.ErrInvalidRule, p.Algorithm)
	}
	if p.CountRefused {
		// A refusal spends: the script writes it, and the deny cache, which
		// answers refusals without telling Redis, would lose it.
		s.deny = nil
	}
	s.alg = a
	if a.delays {
		if s.layered, err = ratelimit.NewLayeredMachine([]ratelimit.Layer{{Rule: rule}}); err != nil {
			return nil, err
		}
	}
	s.stepArgs = newStepArgs(a.step, p, s.marginMs)
	s.lookArgs = s.stepArgs.look(p)
	s.keyHead = o.prefix + ruleTag(p) + ":{"
	return s, nil
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// ruleTag names the rule's numbers (not its Name) in every key, so that
// a rule with other numbers never reads a state written under this one: it
// starts its keys fresh instead. The options are named only when set, so
// that a rule without them keeps the keys it always had.
func ruleTag(p ratelimit.Params) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %d %d %d %d %d %d", p.Algorithm, p.Capacity, p.RateUnits, p.RateNanos, p.TauNanos, p.TauFrac, p.WindowNanos)
	if p.DelayNanos != 0 || p.DelayFrac != 0 {
		fmt.Fprintf(h, " delay %d %d", p.DelayNanos, p.DelayFrac)
	}
	if p.CountRefused {
		fmt.Fprint(h, " refused")
	}
	if p.Buckets != 0 {
		fmt.Fprintf(h, " buckets %d", p.Buckets)
	}
	return hex.EncodeToString(h.Sum(nil)[:4])
}

// Key returns the Redis key that holds key's state: the prefix, the rule's
// tag, and in braces (the Cluster hash tag) the hex of a hash of key, so
// that keys of any length or bytes make short keys that are safe to route.
func (s *Store) Key(key string) string { return hashedKey(s.keyHead, key) }

// Params returns the rule's compiled parameters.
func (s *Store) Params() ratelimit.Params { return s.p }

// Clock returns the clock Wait sleeps on: the client clock given with
// [WithClock], or Unix time when the server's clock decides.
func (s *Store) Clock() ratelimit.Clock {
	if s.clock == nil {
		return UnixClock()
	}
	return s.clock
}

// Check is CheckContext with a background context: the store's timeout
// bounds it (see CheckContext).
func (s *Store) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return s.CheckContext(context.Background(), key, cost)
}

// CheckContext checks cost for key as [ratelimit.Store.Check] does, with its
// state in Redis. ctx bounds the call; without a deadline, the store's
// timeout does (for a context that can never end, such as
// context.Background(), the deadline is between nine tenths of the timeout
// and the whole of it: concurrent checks share a timer).
//
// Cost errors are the core's ([ratelimit.ErrInvalidCost],
// [ratelimit.ErrCostExceedsCapacity]) and reach no server. When Redis fails
// or does not answer by the deadline, the error wraps [ErrUnavailable] and
// the cause, and the Decision is the failure policy's. A key whose stored
// state is corrupted (see [ratelimit.ErrInvalidState]) is denied with that
// error, whatever the policy: no admission is ever made on a state that
// cannot be trusted.
func (s *Store) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return s.checkContext(ctx, key, cost, false)
}

// checkContext is CheckContext; look says a refusal spends nothing even
// under CountRefused (Wait's checks, as in process).
func (s *Store) checkContext(ctx context.Context, key string, cost ratelimit.Units, look bool) (ratelimit.Decision, error) {
	d, err := s.check(ctx, key, cost, look)
	s.observe(d, cost, err)
	return d, err
}

// observe tells the observer, if any, of a check's Decision d for cost, or
// of its error.
func (s *Store) observe(d ratelimit.Decision, cost ratelimit.Units, err error) {
	observe(s.o.observer, s.p.Policy, d, cost, err)
}

// observe tells obs, if not nil, of a check's Decision d for cost, or of
// its error, counted against policy. Errors of the caller's own making
// (an invalid cost, one over the capacity) are not reported.
func observe(obs ratelimit.Observer, policy string, d ratelimit.Decision, cost ratelimit.Units, err error) {
	if obs == nil {
		return
	}
	switch {
	case err == nil:
		o := ratelimit.OutcomeRefused
		if d.Allowed {
			o = ratelimit.OutcomeAllowed
		}
		obs.Decided(d, cost, o)
	case errors.Is(err, ratelimit.ErrInvalidCost), errors.Is(err, ratelimit.ErrCostExceedsCapacity):
		// The caller's mistake, not a decision.
	default:
		obs.Failed(policy, err)
	}
}

// check is CheckContext without the observer. Every error but a cost error
// comes with the Decision the store chose for it, and says so by matching
// [ratelimit.ErrDegraded].
func (s *Store) check(ctx context.Context, key string, cost ratelimit.Units, look bool) (ratelimit.Decision, error) {
	d, err := s.decide(ctx, key, cost, look)
	return d, degradedError(err)
}

// degradedError marks err, an error a check returned with a Decision of the
// store's choosing (the failure policy's, or the refusal of a corrupted
// state), as matching [ratelimit.ErrDegraded]. Cost errors, which come with
// no such Decision, are left as they are.
func degradedError(err error) error {
	if err == nil || errors.Is(err, ratelimit.ErrInvalidCost) || errors.Is(err, ratelimit.ErrCostExceedsCapacity) {
		return err
	}
	return fmt.Errorf("%w: %w", ratelimit.ErrDegraded, err)
}

// decide is check without marking its errors.
func (s *Store) decide(ctx context.Context, key string, cost ratelimit.Units, look bool) (ratelimit.Decision, error) {
	if cost <= 0 || cost > s.p.Capacity {
		d, _, err := s.m.Step(nil, 0, cost, false)
		return d, err
	}
	rk := s.Key(key)
	var floor int64
	var gen uint64
	if s.deny != nil {
		gen = s.deny.generation()
		if look {
			// Wait's checks go to Redis (see Wait).
			floor = s.deny.floor(rk)
		} else {
			d, ok, latest := s.deny.answer(s.judge, s.clock, rk, cost)
			if ok {
				s.localDenials.Add(1)
				return d, nil
			}
			floor = latest
		}
	}
	now := time.Now()
	ctx, cancel := s.bound(ctx, now)
	defer cancel()
	look = look && s.p.CountRefused
	reply, err := s.call(ctx, key, rk, now, s.checkArgs(cost, floor, look))
	recv := time.Now()
	switch {
	case errors.Is(err, ErrUnavailable):
		return s.degraded(ctx, key, cost, err)
	case err != nil:
		return s.refused(), err
	}
	d, at, state, err := s.verify(key, cost, reply, look)
	if s.deny != nil && err == nil {
		if d.Allowed {
			s.deny.forget(rk)
		} else {
			s.deny.remember(rk, [][]byte{[]byte(state)}, at, now, recv, gen)
		}
	}
	return d, err
}

// call runs the check's script with args on the store's key rk (for key)
// through the circuit breaker, at now by the local clock. A failure is
// counted, and wraps [ErrUnavailable] (or is [ErrCircuitOpen], Redis not
// tried); a state the script refuses, a corrupted one, is counted and
// matches [ratelimit.ErrInvalidState].
func (s *Store) call(ctx context.Context, key, rk string, now time.Time, args []any) ([]any, error) {
	br := s.br.forKey(ctx, rk)
	probe, ok := br.allow(now, s.o.pause)
	if !ok {
		s.failed(ErrCircuitOpen)
		return nil, ErrCircuitOpen
	}
	reply, err := runScript(ctx, s.rdb, s.script, s.guard, []string{rk}, args)
	if err != nil {
		if isStateError(err) {
			// The server answered: it is up, but the key cannot be used.
			br.success(probe)
			s.invalid.Add(1)
			return nil, fmt.Errorf("%w: key %q: %v", ratelimit.ErrInvalidState, clipKey(key), err)
		}
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		s.failed(err)
		br.failure(time.Now(), probe, s.o.failures, s.o.pause)
		return nil, err
	}
	br.success(probe)
	return reply, nil
}

// bound gives ctx, if it has no deadline, the store's timeout from now:
// a deadline shared with other checks for a context that can never end.
func (s *Store) bound(ctx context.Context, now time.Time) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	if ctx.Done() == nil {
		return s.sharedDeadline(now), func() {}
	}
	return context.WithTimeout(ctx, s.o.timeout)
}

// deadline is a context that ends at a deadline, shared by the checks that
// start before renew.
type deadline struct {
	ctx    context.Context
	cancel context.CancelFunc
	renew  time.Time
}

// sharedDeadline returns a context that ends between nine tenths of the
// timeout and the whole timeout after now, for a check whose own context
// can never end (Check's, or context.Background()). Checks starting within
// a tenth of the timeout of each other share one, so that each does not
// start and stop a timer of its own (about 7% of a check's CPU in the
// client). A shared context is never cancelled before its deadline, since
// checks may still use it; it ends, and frees its timer, then.
func (s *Store) sharedDeadline(now time.Time) context.Context {
	if d := s.dl.Load(); d != nil && now.Before(d.renew) {
		return d.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(s.o.timeout))
	s.dl.Store(&deadline{ctx: ctx, cancel: cancel, renew: now.Add(s.o.timeout / 10)})
	return ctx
}

// runScript runs script on rdb, on a goroutine of its own when guard says
// the client might not stop at ctx's deadline, so that the caller never
// waits past it.
func runScript(ctx context.Context, rdb redis.UniversalClient, script scriptRunner, guard bool, keys []string, args []any) ([]any, error) {
	if !guard {
		return replyList(script.Run(ctx, rdb, keys, args...))
	}
	type result struct {
		v   []any
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := replyList(script.Run(ctx, rdb, keys, args...))
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// replyList reads a script's reply as a list; a text (the step's reply,
// its fields joined, see step.lua) is a list of that one text.
func replyList(cmd *redis.Cmd) ([]any, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	if l, ok := v.([]any); ok {
		return l, nil
	}
	if _, ok := v.(string); ok {
		return []any{v}, nil
	}
	return nil, fmt.Errorf("redis: unexpected type=%T for Slice", v)
}

// args are the script's arguments for one check (see step.lua).
//
// floor is the latest instant the store has used for the key without
// telling Redis (a refusal the deny cache answered); with a client clock,
// the instant sent is at least floor, as Redis would have clamped to it.
//
// look, for a rule with CountRefused, asks for a check whose refusal spends
// nothing (see stepArgs.look).
func (s *Store) args(cost ratelimit.Units, floor int64, look bool) []any {
	a := s.ruleArgs(look)
	return a.appendCheck(make([]any, 0, len(a)), s.alg.step, s.m, s.now(floor), cost)
}

// now is the instant a check sends (see args): "" for the server's TIME.
func (s *Store) now(floor int64) string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(max(clamp(s.clock.Now()), floor), 10)
}

// ruleArgs are the rule's arguments to the step, a look's if look (see
// args).
func (s *Store) ruleArgs(look bool) stepArgs {
	if look {
		return s.lookArgs
	}
	return s.stepArgs
}

// packedCheck is the packed text of a check's arguments (see packedArgs)
// for one cost, and whether it is a look's.
type packedCheck struct {
	cost ratelimit.Units
	look bool
	// alone is the arguments of a check on the server's TIME: the text
	// alone, sent as it is by every such check (nothing writes to it).
	alone []any
}

// checkArgs are args, packed (see packedArgs) when the step runs as a
// library's function, which reads each text once. The text of the last
// cost checked is kept: a rule's checks mostly have one cost.
func (s *Store) checkArgs(cost ratelimit.Units, floor int64, look bool) []any {
	if fc, ok := s.script.(*functionCaller); !ok || !fc.calls(s.rdb) {
		return s.args(cost, floor, look) // a script's, which would unpack them
	}
	p := s.packed.Load()
	if p == nil || p.cost != cost || p.look != look {
		p = &packedCheck{cost: cost, look: look, alone: []any{s.ruleArgs(look).packedText(s.alg.step, s.m, cost)}}
		s.packed.Store(p)
	}
	if s.clock == nil {
		return p.alone
	}
	return []any{p.alone[0], s.now(floor)}
}

// withinArgs are the script's arguments for one check of a leaky bucket
// bounded on its Delay: args, and the bound for a request that may wait at
// most budget (see appendBound).
func (s *Store) withinArgs(cost ratelimit.Units, floor int64, budget time.Duration) []any {
	return appendBound(s.args(cost, floor, false), s.p, budget)
}

// clamp maps a clock reading into [0, MaxTime], as the core does.
func clamp(t time.Duration) int64 {
	return int64(min(max(t, 0), ratelimit.MaxTime))
}

// verify turns the script's reply into the Decision, recomputing it with
// the rule's Machine and checking the script wrote the same new state.
// It also returns the instant the script decided at and the state it wrote.
//
// A look (see args) that the script refused wrote the old state at the
// check's instant: the Decision is the Machine's Look, which counts nothing.
func (s *Store) verify(key string, cost ratelimit.Units, reply []any, look bool) (d ratelimit.Decision, at int64, state string, err error) {
	old, at, written, admitted, err := s.parseStep(reply)
	if err != nil {
		return s.refused(), 0, "", err
	}
	look = look && admitted != 1
	var next []byte
	if look {
		d, err = s.m.Look([]byte(old), time.Duration(at), cost)
	} else {
		d, next, err = s.m.Step([]byte(old), time.Duration(at), cost, true)
	}
	if err != nil {
		if errors.Is(err, ratelimit.ErrInvalidState) {
			s.invalid.Add(1)
			return s.refused(), 0, "", fmt.Errorf("key %q: %w", clipKey(key), err)
		}
		return d, 0, "", err
	}
	if look && err == nil {
		// The old state, unchanged but for its latest instant.
		rest, t := "", clamp(time.Duration(at))
		if i := strings.IndexByte(old, ' '); i >= 0 {
			rest = old[i:]
		}
		if len(old) > 0 {
			t = max(t, latestOf([]byte(old)))
		}
		next = []byte(strconv.FormatInt(t, 10) + rest)
	}
	if string(next) != written || d.Allowed != (admitted == 1) {
		s.mismatches.Add(1)
		return s.refused(), 0, "", fmt.Errorf("%w: key %q at %d: script wrote %q, machine %q", ErrMismatch, clipKey(key), at, clipKey(written), clipKey(string(next)))
	}
	return d, at, written, nil
}

// parseStep reads the check script's reply (see step.lua): the old state,
// the instant, the state written and the admission's code, joined in one
// text or, from a composite's layerstep, as a list of four; a reply of
// another shape is an error wrapping ErrMismatch (counted).
func (s *Store) parseStep(reply []any) (old string, at int64, written string, admitted int64, err error) {
	var reading string
	ok := false
	switch len(reply) {
	case 1:
		var rest, code string
		var ok1, ok2, ok3 bool
		rest, ok = reply[0].(string)
		old, rest, ok1 = strings.Cut(rest, ",")
		reading, rest, ok2 = strings.Cut(rest, ",")
		written, code, ok3 = strings.Cut(rest, ",")
		admitted, err = strconv.ParseInt(code, 10, 64)
		ok = ok && ok1 && ok2 && ok3 && err == nil
	case 4:
		var okOld, okNow, okNew bool
		old, okOld = reply[0].(string)
		reading, okNow = reply[1].(string)
		written, okNew = reply[2].(string)
		admitted, _ = reply[3].(int64)
		ok = okOld && okNow && okNew
	}
	if ok {
		at, err = strconv.ParseInt(reading, 10, 64)
	}
	if !ok || err != nil {
		s.mismatches.Add(1)
		return "", 0, "", 0, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	return old, at, written, admitted, nil
}

func str(reply []any, i int) (string, bool) {
	if i >= len(reply) {
		return "", false
	}
	v, ok := reply[i].(string)
	return v, ok
}

// isStateError reports an error that says the key cannot be used, not that
// Redis failed: one the script itself raised (a state that is not well
// formed), or WRONGTYPE, a key that holds a hash, list, set, sorted set or
// stream where a state belongs. Either is a corrupted state: the server
// answered, so it counts as a success for the circuit breaker.
func isStateError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.Contains(msg, "RATELIMIT ") || strings.HasPrefix(msg, "WRONGTYPE")
}

// clipKey shortens a key (or state) for an error message.
func clipKey(k string) string {
	if len(k) > 64 {
		return k[:64] + "..."
	}
	return k
}

// refused is the Decision that admits nothing, for a check that could not
// be trusted.
func (s *Store) refused() ratelimit.Decision {
	return ratelimit.Decision{Limit: s.p.Limit, Policy: s.p.Policy, Window: s.p.Window}
}

// degraded applies the failure policy to a check Redis did not decide.
func (s *Store) degraded(ctx context.Context, key string, cost ratelimit.Units, cause error) (ratelimit.Decision, error) {
	return s.degradedWithin(ctx, key, cost, maxBudget, cause)
}

// degradedWithin is degraded for a request that may wait at most maxDelay
// (maxBudget: any time).
func (s *Store) degradedWithin(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, cause error) (ratelimit.Decision, error) {
	if d, err, ok := fallBack(ctx, s.o.fallback, key, cost, maxDelay, cause); ok {
		return d, err
	}
	return s.failureMode(cost), cause
}

// withinChecker is a limiter with CheckWithin, such as [ratelimit.Store]
// and [ratelimit.Composite].
type withinChecker interface {
	CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error)
}

// fallBack asks fb, the fallback limiter if not nil, about a check that
// Redis did not decide because of cause, for a request that may wait at
// most maxDelay (maxBudget: any time; a fallback without CheckWithin is
// asked with Check whatever maxDelay is). ok is false without a fallback.
func fallBack(ctx context.Context, fb ratelimit.KeyedLimiter, key string, cost ratelimit.Units, maxDelay time.Duration, cause error) (d ratelimit.Decision, err error, ok bool) {
	if fb == nil {
		return d, nil, false
	}
	wc, within := fb.(withinChecker)
	cc, hasCtx := fb.(ratelimit.ContextChecker)
	switch {
	case maxDelay != maxBudget && within:
		d, err = wc.CheckWithin(key, cost, max(maxDelay, 0))
	case hasCtx:
		d, err = cc.CheckContext(context.WithoutCancel(ctx), key, cost)
	default:
		d, err = fb.Check(key, cost)
	}
	if err != nil {
		return d, errors.Join(cause, err), true
	}
	return d, cause, true
}

// failureMode is the failure mode's Decision for cost, with no fallback,
// spending nothing anywhere: fail closed's refusal, or fail open's fresh
// key.
func (s *Store) failureMode(cost ratelimit.Units) ratelimit.Decision {
	if s.o.mode == FailClosed {
		d := s.refused()
		d.RetryAfter = s.o.pause
		return d
	}
	// As if the key were fresh: what losing its state would give.
	d, _, _ := s.m.Step(nil, time.Duration(clamp(s.Clock().Now())), cost, false)
	return d
}

// Stats are a [Store]'s or a [Composite]'s counters since it was built.
type Stats struct {
	// Failures counts checks Redis did not decide (errors, timeouts and
	// refusals of the open circuit), each answered by the failure policy.
	Failures uint64
	// CircuitRefusals counts the checks among Failures that did not try
	// Redis because the circuit was open.
	CircuitRefusals uint64
	// InvalidStates counts checks denied, and peeks, refunds and
	// settlements failed, because the key's stored state was corrupted.
	InvalidStates uint64
	// Mismatches counts checks denied because the script and the Machine
	// disagreed (see [ErrMismatch]), and peeks, refunds and resets that got
	// a reply they could not read; it should stay zero.
	Mismatches uint64
	// LocalDenials counts checks refused by the deny cache without a round
	// trip (see [WithDenyCache]).
	LocalDenials uint64
}

// Stats returns the counters since it was built.
func (s *counters) Stats() Stats {
	return Stats{
		Failures:        s.failures.Load(),
		CircuitRefusals: s.circuitRefusals.Load(),
		InvalidStates:   s.invalid.Load(),
		Mismatches:      s.mismatches.Load(),
		LocalDenials:    s.localDenials.Load(),
	}
}

// honoursContext reports whether rdb stops at a context's deadline by itself.
func honoursContext(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// unixClock is Unix time in nanoseconds.
type unixClock struct{}

func (unixClock) Now() time.Duration { return time.Duration(time.Now().UnixNano()) }

// UnixClock returns a clock of Unix time, nanoseconds since 1970: the time
// base a client clock must share with every other process using the same
// keys, since window boundaries are multiples of the window from the Unix
// epoch.
func UnixClock() ratelimit.Clock { return unixClock{} }

var (
	_ ratelimit.ContextChecker = (*Store)(nil)
	_ ratelimit.KeyedLimiter   = (*Store)(nil)
)
