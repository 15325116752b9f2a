package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// ContextChecker is a keyed limiter whose check can be cancelled: one that
// may wait on a network, such as a limiter whose state lives in Redis.
// [Store] and [Composite] implement it too (they never block, and return
// ctx's error only if ctx has already ended), so code that takes a
// ContextChecker, like the HTTP middleware, works with either. The middleware
// uses CheckContext, with the request's context, whenever its limiter has it.
type ContextChecker interface {
	CheckContext(ctx context.Context, key string, cost Units) (Decision, error)
}

// ErrInvalidState is returned by [Machine.Step] for an encoded state that
// is malformed, or that no sequence of checks and settlements under the
// machine's rule could have produced (a count above twice the limit, the
// most a key in debt holds: see [Store.Settle]; a fraction out of range).
// A backend that stores states should treat it as a corrupted key: report
// it, and never admit on it.
var ErrInvalidState = errors.New("ratelimit: invalid limiter state")

// ErrDegraded marks an error that a limiter returns together with a
// Decision its failure policy made: its backend failed (did not answer in
// time, refused, or returned a corrupted state), and the Decision is what
// the limiter was configured to answer then (fail open's fresh-key
// Decision, fail closed's refusal, or a local fallback's Decision). A
// caller that sees it should act on the Decision, which the limiter's
// owner chose for exactly this case, and report the error; a caller that
// treats every error alike would replace that choice with its own. An
// error that does not match ErrDegraded comes with no usable Decision.
var ErrDegraded = errors.New("ratelimit: decided by the failure policy")

// Params are a rule's exact compiled parameters: the integers every
// Decision is computed from. A backend that keeps state outside the process
// (a Redis script, say) computes with these and nothing else, so that its
// decisions can be the same as the in-process limiter's.
type Params struct {
	// Algorithm is the rule's algorithm by its JSON name (see [RuleSpec]):
	// "token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_log",
	// "sliding_counter" or "sub_window".
	Algorithm string

	// Policy, Limit and Window are what every Decision of the rule carries.
	Policy string
	Limit  int64
	Window time.Duration

	// Capacity is the largest cost, Limit whole units in milli-units.
	Capacity Units

	// The buckets (token_bucket, gcra, leaky_bucket): the pace is exactly
	// RateUnits milli-units every RateNanos nanoseconds, in lowest terms,
	// and Tau, the time the whole Capacity takes at that pace, is TauNanos
	// plus TauFrac/RateUnits nanoseconds. Zero for the window rules.
	RateUnits, RateNanos uint64
	TauNanos, TauFrac    uint64

	// WindowNanos is the window of the window rules (fixed_window,
	// sliding_log, sliding_counter, sub_window) in nanoseconds; zero for the
	// buckets.
	WindowNanos int64

	// Buckets is a sub_window's number of buckets, each WindowNanos/Buckets
	// long; zero for every other rule.
	Buckets int64

	// CountRefused is the option of sliding_counter and sub_window that
	// counts a denied request's cost too (see [SlidingCounter]).
	CountRefused bool

	// DelayNanos plus DelayFrac/RateUnits ns is the span of a leaky_bucket's
	// Delay option: the queued work an admitted request may find ahead of
	// it and still go on at once (see [LeakyBucket]). Zero otherwise.
	DelayNanos, DelayFrac uint64
}

// Machine is a rule's state transition as a pure function of an encoded
// state: what a backend that keeps each key's state outside the process
// needs to give exactly the decisions of the in-process limiters. It is
// built by [NewMachine], is immutable and is safe for concurrent use.
//
// # State encoding
//
// A state is ASCII: decimal integers without sign or leading zeros,
// separated by single spaces. The empty state is a fresh key. The first
// integer is the latest instant (ns) the key was checked at; Step clamps
// an earlier now to it, as the in-process limiters clamp their clocks, so
// a key never sees time go back. A key in debt (see [Store.Settle]) may
// hold up to twice its capacity: its arrival time may run up to twice the
// capacity's span ahead, its counts reach twice the limit. The rest depends
// on the algorithm:
//
//   - token_bucket, gcra and leaky_bucket: "t f", the theoretical arrival
//     time (the instant the key's spent allowance has all come back, or for
//     the leaky bucket the instant its queue is empty) as t + f/RateUnits
//     ns, with f < RateUnits. A token bucket is kept in GCRA's state (see
//     [TokenBucket]).
//   - fixed_window: "w c", the index of the window [wW, (w+1)W) and the
//     milli-units admitted in it.
//   - sliding_counter: "w p c", the window's index and the milli-units
//     admitted in the window before it and in it.
//   - sub_window: "c n...", the index of the latest bucket [cG, (c+1)G)
//     counted into (G the window over Buckets) and the milli-units counted
//     in the Buckets buckets ending with it, oldest first.
//   - sliding_log: pairs "t c", one per instant at which cost c
//     (milli-units) was admitted, oldest first, with strictly increasing t.
//     Entries that have left the window may remain until the next
//     admission drops them.
//
// Everything a Step writes reads back, and Step(state) on a state read back
// decides as the in-process limiter does on the state it came from.
type Machine struct {
	params Params
	core   machineCore
}

// machineCore is a Machine's algorithm with its state type bound.
type machineCore interface {
	// step decides on an encoded algorithm state (the fields after last),
	// appending the state after it to dst if m commits.
	step(fields []int64, now, cost int64, m stepMode, dst []byte) (Decision, []byte, error)
	// refund and settle are Machine.Refund's and Machine.Settle's, as step
	// is Step's (see backendops.go).
	refund(fields []int64, now, at, cost int64, dst []byte) (int64, []byte, error)
	settle(fields []int64, now, charged, actual int64, at time.Duration, dst []byte) (Decision, int64, []byte, error)
	capacity() int64
	policy() *policy
	params() Params
}

// NewMachine validates rule and returns its [Machine]. A malformed rule is
// an error matching [ErrInvalidRule].
func NewMachine(rule Rule) (*Machine, error) {
	if isNil(rule) {
		return nil, nilRuleError("rule")
	}
	b, err := rule.bind()
	if err != nil {
		return nil, err
	}
	name := algorithmName(rule)
	core := b.newMachine()
	p := core.params()
	p.Algorithm = name
	return &Machine{params: p, core: core}, nil
}

// Params returns the rule's compiled parameters.
func (m *Machine) Params() Params { return m.params }

// Span returns the time cost takes at a bucket rule's pace, as ns plus
// frac/RateUnits ns: how far an admitted request moves the theoretical
// arrival time. It is zero for the window rules, and for a cost outside 1 to
// Capacity.
func (m *Machine) Span(cost Units) (ns, frac uint64) {
	mp, ok := m.core.(interface {
		span(uint64) (uint64, uint64, bool)
	})
	if !ok || cost <= 0 || cost > m.params.Capacity {
		return 0, 0
	}
	ns, frac, _ = mp.span(uint64(cost))
	return ns, frac
}

// Step decides whether cost can be admitted at now on a key whose state is
// state (see [Machine] for the encoding; empty is a fresh key), exactly as
// [Limiter.Check] would on that key. It returns the Decision and the key's
// state after it: with commit false, state itself, unchanged; with commit
// true, the new state, which records now as the key's latest instant even
// when the request is denied. now is clamped into [0, [MaxTime]].
//
// Cost errors are [Limiter.Check]'s, with the state returned unchanged. A
// state that does not parse, or that the rule could not have produced, is
// an error matching [ErrInvalidState], with a Decision that admits nothing.
func (m *Machine) Step(state []byte, now time.Duration, cost Units, commit bool) (Decision, []byte, error) {
	if commit {
		return m.step(state, now, cost, stepCheck)
	}
	return m.step(state, now, cost, stepPeek)
}

// Look returns the Decision that a caller who never counts a refusal gets
// for cost at now on a key whose state is state, changing nothing: what
// [Limiter.Wait], CheckWithin and a [Composite]'s layers decide on. Such
// a caller spends only what it admits, so a refusal is reported on the key
// as it stands, and its RetryAfter is when this same request passes. It
// is Step's Decision with commit false, but for a refusal under a rule
// with CountRefused, which Step reports as the check that counts it would.
// Its errors are Step's.
func (m *Machine) Look(state []byte, now time.Duration, cost Units) (Decision, error) {
	d, _, err := m.step(state, now, cost, stepLook)
	return d, err
}

// step is Step and Look: a step of mode md, returning the new state if md
// commits and state itself otherwise.
func (m *Machine) step(state []byte, now time.Duration, cost Units, md stepMode) (Decision, []byte, error) {
	if d, err := checkCost(cost, m.core.capacity(), m.core.policy()); err != nil {
		return d, state, err
	}
	t, fields, err := splitState(state, now)
	if err != nil {
		return m.core.policy().decision(), state, err
	}
	var dst []byte
	if md.commits() {
		dst = strconv.AppendInt(make([]byte, 0, len(state)+24), t, 10)
	}
	d, next, err := m.core.step(fields, t, int64(cost), md, dst)
	if err != nil {
		return m.core.policy().decision(), state, err
	}
	if !md.commits() {
		return d, state, nil
	}
	return d, next, nil
}

// splitState parses an encoded state into the instant a step at now uses
// (now clamped into [0, MaxTime] and raised to the state's latest instant)
// and the algorithm's fields after it (none for a fresh key).
func splitState(state []byte, now time.Duration) (int64, []int64, error) {
	fields, err := parseState(state)
	if err != nil {
		return 0, nil, err
	}
	t := clampTime(now)
	if len(fields) == 0 {
		return t, nil, nil
	}
	last := fields[0]
	if last > int64(MaxTime) {
		return 0, nil, fmt.Errorf("%w: latest instant %d is beyond MaxTime", ErrInvalidState, last)
	}
	return max(t, last), fields[1:], nil
}

// parseState splits an encoded state into its integers.
func parseState(b []byte) ([]int64, error) {
	if len(b) == 0 {
		return nil, nil
	}
	fields := make([]int64, 0, 4)
	for i := 0; ; {
		j := i
		var v int64
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			d := int64(b[j] - '0')
			if v > (math.MaxInt64-d)/10 {
				return nil, fmt.Errorf("%w: a number is out of range", ErrInvalidState)
			}
			v = v*10 + d
			j++
		}
		if j == i || (b[i] == '0' && j-i > 1) {
			return nil, fmt.Errorf("%w: %q is not a list of decimal integers", ErrInvalidState, clip(b))
		}
		fields = append(fields, v)
		if j == len(b) {
			return fields, nil
		}
		if b[j] != ' ' {
			return nil, fmt.Errorf("%w: %q is not a list of decimal integers", ErrInvalidState, clip(b))
		}
		i = j + 1
	}
}

// clip shortens a state for an error message.
func clip(b []byte) []byte {
	if len(b) > 40 {
		return append(b[:40:40], "..."...)
	}
	return b
}

// appendInts appends each v as " <v>".
func appendInts(dst []byte, vs ...int64) []byte {
	for _, v := range vs {
		dst = strconv.AppendInt(append(dst, ' '), v, 10)
	}
	return dst
}

// badState is the error for a state whose values no check could produce.
func badState(alg, why string) error {
	return fmt.Errorf("%w: %s state: %s", ErrInvalidState, alg, why)
}

// codec converts an algorithm's state S to and from its encoding.
type codec[S any] interface {
	// decodeAt reads fields (none for a fresh key) into *s, checking that
	// the rule could have produced them by now, the key's clamped instant.
	decodeAt(fields []int64, s *S, now int64) error
	// encode appends s's fields, each as " <v>".
	encode(dst []byte, s *S) []byte
	// params returns the rule's compiled parameters, but for Algorithm.
	params() Params
}

// machineOf is the machineCore of an algorithm A with state S.
type machineOf[S any, A algorithm[S]] struct{ alg A }

func (m machineOf[S, A]) step(fields []int64, now, cost int64, md stepMode, dst []byte) (Decision, []byte, error) {
	var s S
	if err := m.alg.decodeAt(fields, &s, now); err != nil {
		return Decision{}, nil, err
	}
	d := m.alg.step(&s, now, cost, md)
	if md.commits() {
		dst = m.alg.encode(dst, &s)
	}
	return d, dst, nil
}

func (m machineOf[S, A]) capacity() int64 { return m.alg.capacity() }
func (m machineOf[S, A]) policy() *policy { return m.alg.policy() }
func (m machineOf[S, A]) params() Params  { return m.alg.params() }

// span is the pace's, for Machine.Span; ok is false for the window rules.
func (m machineOf[S, A]) span(x uint64) (uint64, uint64, bool) {
	if sp, ok := any(m.alg).(interface {
		span(uint64) (uint64, uint64, bool)
	}); ok {
		return sp.span(x)
	}
	return 0, 0, false
}

// algorithmName returns the JSON name of a rule's algorithm.
func algorithmName(rule Rule) string {
	if row, _ := algorithmOf(deref(rule)); row != nil {
		return row.name
	}
	return ""
}
