package ratelimit

import (
	"strconv"
	"time"
)

// LockoutMachine is a [LockoutRule]'s state transition on an encoded
// state, for a backend that keeps a [Lockout]'s keys outside the process
// (redisstore keeps them in Redis): [LockoutMachine.Step] on a key's
// encoded state gives the Decision the in-process Lockout gives on the
// same key at the same instant, and the state after it.
//
// A state is decimal integers separated by single spaces, as a [Machine]'s
// are (empty is a fresh key): "last until block t1 ... tn", the key's
// latest instant, when its latest block ends (0 if none ever began), that
// block's length (0 once its streak is forgotten or if none began), and
// the failures within the span as pairs "t c", oldest first: c/1000
// failures at instant t (a [SlidingLog]'s entries, one Unit a failure). A
// LockoutMachine is immutable and safe for concurrent use.
type LockoutMachine struct {
	a *lockAlgo
}

// NewLockoutMachine validates rule as [NewLockout] does and returns its
// [LockoutMachine].
func NewLockoutMachine(rule LockoutRule) (*LockoutMachine, error) {
	a, err := rule.compile()
	if err != nil {
		return nil, err
	}
	return &LockoutMachine{a: a}, nil
}

// Step decides on a key whose state is state at now (clamped into [0,
// MaxTime] and raised to the state's latest instant). With fail false it
// is [Lockout.Check]: the state is returned unchanged. With fail true it is
// [Lockout.Fail]: the failure is counted, next is the state after it, and
// started reports that this failure started a block.
//
// A state that does not parse, or that the rule could not have produced,
// is an error matching [ErrInvalidState], with a Decision that refuses
// (a lockout that cannot read a key's state treats the key as blocked).
func (m *LockoutMachine) Step(state []byte, now time.Duration, fail bool) (d Decision, next []byte, started bool, err error) {
	t, fields, err := splitState(state, now)
	if err != nil {
		return m.a.pol.decision(), state, false, err
	}
	var s lockState
	if err := m.decodeAt(fields, &s, t); err != nil {
		return m.a.pol.decision(), state, false, err
	}
	if !fail {
		return m.a.step(&s, t, int64(Unit), stepPeek), state, false, nil
	}
	before := m.a.step(&s, t, int64(Unit), stepPeek)
	d = m.a.step(&s, t, int64(Unit), stepCheck)
	next = strconv.AppendInt(make([]byte, 0, len(state)+24), t, 10)
	next = appendInts(next, s.until, s.last)
	next = m.a.log.encode(next, &s.log)
	return d, next, before.Allowed && !d.Allowed, nil
}

// decodeAt reads the fields after the latest instant into *s, checking
// that the rule could have produced them by now.
func (m *LockoutMachine) decodeAt(fields []int64, s *lockState, now int64) error {
	if len(fields) == 0 {
		return nil
	}
	if len(fields) < 2 {
		return badState("lockout", "wants the block's end and length after the instant")
	}
	until, last := fields[0], fields[1]
	switch {
	case until > now+m.a.maxBlock || until > int64(MaxTime):
		return badState("lockout", "the block ends later than any block could")
	case last > m.a.maxBlock || (last == 0) != (until == 0):
		return badState("lockout", "the block's length is beyond the rule's")
	}
	var failed int64
	for i := 3; i < len(fields); i += 2 {
		if c := fields[i]; c%int64(Unit) != 0 || c > m.a.log.capMilli {
			return badState("lockout", "a failure count is not a whole number of failures below the rule's")
		}
		if failed += fields[i]; failed >= m.a.log.capMilli {
			return badState("lockout", "more failures than the rule counts before a block")
		}
	}
	s.until, s.last = until, last
	return m.a.log.decodeAt(fields[2:], &s.log, now)
}

// Params returns the rule's compiled parameters: Capacity is one failure,
// WindowNanos is Within, and Policy and Limit are the Decisions'.
func (m *LockoutMachine) Params() Params {
	p := m.a.params()
	p.Algorithm = "lockout"
	p.WindowNanos = m.a.log.window
	return p
}
