package ratelimit

import (
	"strconv"
	"time"
)

// Refund gives back up to cost of what a key whose state is state (see
// [Machine] for the encoding) admitted at the instant at (the admitting
// Decision's At), seen from now, exactly as [Store.Refund] does on a key the
// store holds, and returns how much it gave back and the key's state after
// it. It is a pure function: a backend reads the state, calls Refund and
// writes next back only if the key still holds state.
//
// now is clamped into [0, [MaxTime]] and raised to the state's latest
// instant, which next records, even when nothing is given back (as a
// refused check records its instant); at is clamped into [0, now]. A cost
// above the rule's capacity is capped at it.
//
// The empty state (a fresh key, one the backend does not hold) gives back
// nothing, and next is the empty state: there is nothing to write. A cost
// of zero or less is an error matching [ErrInvalidCost]; a state that does
// not parse, or that the rule could not have produced, is an error matching
// [ErrInvalidState]. On an error nothing is given back and next is state.
func (m *Machine) Refund(state []byte, now, at time.Duration, cost Units) (given Units, next []byte, err error) {
	c, err := refundCost(cost, m.core.capacity(), m.core.policy())
	if err != nil {
		return 0, state, err
	}
	t, fields, err := splitState(state, now)
	if err != nil || len(state) == 0 {
		return 0, state, err
	}
	dst := strconv.AppendInt(make([]byte, 0, len(state)+24), t, 10)
	g, next, err := m.core.refund(fields, t, clampAt(at, t), c, dst)
	if err != nil {
		return 0, state, err
	}
	return Units(g), next, nil
}

// refund is Machine.Refund on the decoded fields at the clamped instant,
// appending the new fields to dst.
func (m machineOf[S, A]) refund(fields []int64, now, at, cost int64, dst []byte) (int64, []byte, error) {
	var s S
	if err := m.alg.decodeAt(fields, &s, now); err != nil {
		return 0, nil, err
	}
	g := m.alg.refund(&s, now, at, cost)
	return g, m.alg.encode(dst, &s), nil
}

// Settle settles, on a key whose state is state (see [Machine] for the
// encoding), a request admitted at the instant at (the admitting
// Decision's At) that was charged charged and turned out to cost actual,
// seen from now, exactly as [Store.Settle] does, and returns the Decision
// a Peek of cost charged gets just after, the cost as settled, and the
// key's state after it. It is a pure function: a backend reads the state,
// calls Settle and writes next back only if the key still holds state.
//
// A cost above charged is charged at now even past the limit, into a debt
// bounded at twice the capacity in use; one below it is a refund of
// charged - actual at at, as [Machine.Refund] gives back. now is clamped
// into [0, [MaxTime]] and raised to the state's latest instant, which next
// records; at is clamped into [0, now].
//
// The empty state (a fresh key) is charged as a fresh key; a refund or a
// settlement of nothing on it gives nothing back, and next is the empty
// state: there is nothing to write. Cost errors are [Store.Settle]'s; a
// state that does not parse, or that the rule could not have produced, is
// an error matching [ErrInvalidState], with a Decision that admits
// nothing. On an error nothing is settled (settled is 0) and next is
// state. Every state Settle returns reads back, up to a bucket's
// theoretical arrival time at the largest int64 instant.
func (m *Machine) Settle(state []byte, now, at time.Duration, charged, actual Units) (d Decision, settled Units, next []byte, err error) {
	if d, err := settleCosts(charged, actual, m.core.capacity(), m.core.policy()); err != nil {
		return d, 0, state, err
	}
	t, fields, err := splitState(state, now)
	if err != nil {
		return m.core.policy().decision(), 0, state, err
	}
	dst := strconv.AppendInt(make([]byte, 0, len(state)+24), t, 10)
	d, x, next, err := m.core.settle(fields, t, int64(charged), int64(actual), at, dst)
	if err != nil {
		return m.core.policy().decision(), 0, state, err
	}
	if len(state) == 0 && actual <= charged {
		return d, charged, state, nil // a key the backend does not hold
	}
	return d, Units(x), next, nil
}

// settle is Machine.Settle on the decoded fields at the clamped instant,
// appending the new fields to dst.
func (m machineOf[S, A]) settle(fields []int64, now, charged, actual int64, at time.Duration, dst []byte) (Decision, int64, []byte, error) {
	var s S
	if err := m.alg.decodeAt(fields, &s, now); err != nil {
		return Decision{}, 0, nil, err
	}
	x := settleState(m.alg, &s, now, charged, actual, at)
	d := m.alg.step(&s, now, charged, stepPeek)
	return d, x, m.alg.encode(dst, &s), nil
}
