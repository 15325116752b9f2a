package ratelimit

import (
	"fmt"

	"github.com/ratekit/ratelimit/internal/wide"
)

// Migration says what a key keeps when its rule changes: when the rule of
// its plan is updated, or when it moves to another plan (see [Plans]). It
// is defined through what the key has spent at the instant it moves: the
// milli-units of its capacity in use, rounded up (for a bucket, what it
// would take to refill or drain; for a fixed window, the window's count;
// for a sliding counter, its estimate; for a sliding log, the cost still in
// its window). The key then starts under its new rule with the amount the
// policy gives spent at that instant, and nothing else remembered: a bucket
// refills (or a queue drains) it at the new rate, a fixed or sliding
// counter counts it in the current window, a sliding log as one request
// admitted at that instant.
//
// Every policy rounds in the key's disfavour, so no change of rule is a way
// to a fresh allowance except [MigrateReset].
type Migration uint8

const (
	// MigrateProportional keeps the fraction of capacity in use: a key with
	// 15 of 20 spent that moves to a capacity of 200 has 150 spent (50
	// left), and back again 15 (5 left). It is the default.
	MigrateProportional Migration = iota
	// MigrateAsIs keeps the units left, capped at the new capacity: 5 left
	// of 20 stays 5 left of 200 (195 spent). A key with nothing spent is
	// fresh under its new rule, as under every policy: a store may drop a
	// fresh key at any time, and the key must fare the same either way.
	MigrateAsIs
	// MigrateAdditive keeps the units spent, capped at the new capacity: 15
	// spent of 20 is 15 spent of 200 (185 left). What the cap cuts off is
	// forgotten: 20 spent of 20, moved to a capacity of 10 (10 spent) and
	// back by this policy, has 10 spent of 20. Proportional and as-is never
	// give back anything spent, over any sequence of changes.
	MigrateAdditive
	// MigrateReset starts the key fresh, whatever it had spent: the only
	// policy that hands out a fresh allowance, to be asked for on purpose.
	MigrateReset
)

// String returns the policy's name as rule-set documents write it:
// "proportional", "as_is", "additive" or "reset".
func (m Migration) String() string {
	switch m {
	case MigrateProportional:
		return "proportional"
	case MigrateAsIs:
		return "as_is"
	case MigrateAdditive:
		return "additive"
	case MigrateReset:
		return "reset"
	}
	return fmt.Sprintf("Migration(%d)", uint8(m))
}

// valid reports whether m is one of the four policies.
func (m Migration) valid() bool { return m <= MigrateReset }

// carry returns what a key that has spent milli-units of a capacity of
// from milli-units has spent under a capacity of to, by policy m.
func (m Migration) carry(spent, from, to int64) int64 {
	spent = min(max(spent, 0), from)
	if spent == 0 {
		return 0 // a fresh key stays fresh, as a store may drop it anyway
	}
	switch m {
	case MigrateAsIs:
		return to - min(from-spent, to)
	case MigrateAdditive:
		return min(spent, to)
	case MigrateReset:
		return 0
	}
	// Proportional: ceil(spent*to/from), at most to.
	q, r, _ := wide.MulDiv(uint64(spent), uint64(to), uint64(from)) // < 2^64: spent <= from
	if r != 0 {
		q++
	}
	return int64(q)
}

// migrator is what an algorithm offers to move a key between rules: what a
// state has spent at now, and a state that has spent a given amount at now.
type migrator[S any] interface {
	// spentAt returns the milli-units s has in use at now, rounded up.
	spentAt(s *S, now int64) int64
	// withSpent sets *s to a state with x milli-units (at most the
	// capacity) in use at now and no other history.
	withSpent(s *S, now, x int64)
}

func (m *meter) spentAt(s *vtime, now int64) int64 {
	dn, df := m.debt(s, now)
	return int64(m.milliCeil(dn, df))
}

func (m *meter) withSpent(s *vtime, now, x int64) {
	ns, frac, _ := m.span(uint64(x)) // x <= capacity: within the span
	*s = vtime{t: now + int64(ns), frac: frac}
}

func (a *fwAlgo) spentAt(s *fwState, now int64) int64 {
	_, _, count := a.at(s, now)
	return count
}

func (a *fwAlgo) withSpent(s *fwState, now, x int64) { *s = fwState{win: now / a.w, count: x} }

func (a *scAlgo) spentAt(s *scState, now int64) int64 {
	_, e, prev, cur := a.at(s, now)
	q, r, _ := wide.MulDiv(uint64(prev), uint64(a.w-e), uint64(a.w)) // <= prev
	if r != 0 {
		q++
	}
	return int64(q) + cur
}

func (a *scAlgo) withSpent(s *scState, now, x int64) { *s = scState{win: now / a.w, cur: x} }

func (a *scCompactAlgo) spentAt(s *scCompact, now int64) int64 {
	w := s.wide()
	return a.scAlgo.spentAt(&w, now)
}

func (a *scCompactAlgo) withSpent(s *scCompact, now, x int64) {
	var w scState
	a.scAlgo.withSpent(&w, now, x)
	*s = w.compact()
}

func (a *slAlgo) spentAt(s *slState, now int64) int64 {
	n := len(s.buf)
	if n == 0 {
		return 0
	}
	now = max(now, s.at(n-1).t)
	k := a.expired(s, now)
	if k == n {
		return 0
	}
	prev := s.base
	if k > 0 {
		prev = s.at(k - 1).cum
	}
	return int64(s.at(n-1).cum - prev)
}

func (a *slAlgo) withSpent(s *slState, now, x int64) {
	*s = slState{}
	if x > 0 {
		s.admit(0, now, x)
	}
}

func (a *swAlgo[A]) spentAt(s *swState[A], now int64) int64 {
	c, _ := a.at(s, now)
	return min(a.sum(s, c), a.capMilli)
}

func (a *swAlgo[A]) withSpent(s *swState[A], now, x int64) {
	*s = swState[A]{}
	if x > 0 {
		a.put(s, now/a.g, x)
	}
}
