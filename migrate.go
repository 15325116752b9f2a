package ratelimit

import (
	"fmt"

	"github.com/ratekit/ratelimit/internal/wide"
)

// Migration says what a key keeps when its rule changes: when the rule of
// its plan is updated, or when it moves to another plan (see [Plans]).
//
// A move carries two things from the old rule: what the key has in use at
// that instant, in milli-units rounded up (for a bucket, what it would take
// to refill or drain; for a fixed window, the window's count; for a sliding
// counter, its estimate; for a sliding log, the cost still in its window;
// for a [SubWindow], the cost its buckets still count, at most its Limit),
// and the instant the old rule would make the key whole again if nothing
// more were spent. The policy says what part of the amount the new rule
// starts with; the new rule then gives it back no later than that instant,
// as nearly as it can count:
//
//   - a bucket refills it at its own rate, or, where that would end later,
//     starts so that it is full at that instant (it then has less in use);
//   - a fixed window counts it in now's window or, if the instant is past
//     that window's end, in the next window, where it counts from now on
//     (so that a move just before a window's end is no fresh window);
//   - a sliding counter counts what would be left at the end of now's
//     window in that window and the rest in the window before, so that its
//     estimate falls as an even giving-back would;
//   - a sliding log logs it as up to eight admissions that leave the window
//     one after another, and a sub-window spreads it over its buckets, so
//     that what counts at every instant is at least what an even giving-back
//     would leave (all of it gone by the instant, or a window from now if
//     that is sooner, but not before a window from the clock's zero, since
//     neither counts anything before zero).
//
// The key's record (which the rule set keeps beside the key's state) also
// keeps the amount before the new capacity's cap, and holds it in full
// until that instant, as a fixed window holds its count to the window's
// end, whatever the rule that holds the key meanwhile gives back sooner:
// when the key moves again, it carries what of it is not yet given back,
// plus what its state shows beyond what it was given (what it was admitted
// since, held until that state would be whole), rather than what the rule
// in between rounded up or down (see moveRecord, which keeps two such
// amounts, merging the nearest of three). So, with MigrateProportional or
// MigrateAdditive, moving at a window's edge is no fresh window (the debt a
// bucket carries past it is counted in the next one); hopping off a plan
// and back, however often, gives nothing back sooner than the plan would
// have; moving back and forth at one instant gives back at most once what
// a bucket moved into gives back early to be full by the old rule's
// instant; and a key is never stuck: what it spent ages out no later than
// the rule it was spent under would have made it whole, give or take two
// windows or sub-window buckets of the rules it moves through, however it
// moves afterwards.
//
// What a moving key is admitted over any span is at most what the plans it
// is checked on in that span admit together over the span, plus the
// largest of their capacities: hopping between plans gets no more than
// one key on each plan would. It is not held to what the most generous of
// them admits plus one capacity: a bucket that a move brings debt into must
// be full by when the rule it came from would have made the key whole
// (never stuck), so a key that hops from a window's plan to a bucket's
// plan at the last instant of each window is given the bucket's capacity
// back at once, each window, on top of the window's count. The first bound
// is tested on random traces and schedules, not proved; the second's
// excess is shown by a test of that schedule (plans_migrate_test.go).
//
// What moves is the key's own: the state of each layer without a Key. A
// layer with a Key ([Layer.Key]: a global limit, a customer's limit over
// the keys of its routes) holds a state its plan's keys share, which is the
// plan's, not the key's: a key that moves to another plan leaves it where
// it is, counted for the keys still on the old plan, and finds the new
// plan's layer as that plan's keys left it (each plan's layer is a limit of
// its own, even with the same rule and Key). A layer that is a key's own on
// one side and shared on the other moves nothing either way. Only an
// Update that changes the rule of a plan's layer with a Key moves that
// layer's state, once and whole, with the Update's policy, to the layer
// with a Key at the same place in the plan that replaces it: when the
// first of the plan's keys whose record names the replaced plan is checked
// under the new rules. A key with no such record (new to the rule set, one
// whose first checks were all refused before it was spent anywhere, or one
// that moved onto a plan of shared layers only, below) that is checked
// first finds the new layer fresh; redisstore's records differ from a
// Plans' for such keys.
//
// A plan whose every layer has a Key holds nothing of a key's own. A key's
// move onto it moves nothing of the key's own and, if the plan it came from
// has a layer without a Key, leaves the key's record naming that plan,
// whose layers without a Key keep the key's own state: back on that plan
// the key finds it as it left it, a move on to a third plan carries from
// it, and a Reset resets it. A key whose first check is on such a plan gets
// a record naming it, as on any plan.
//
// Policies round in the key's disfavour. MigrateAsIs keeps the units left,
// so a key that moves to a plan whose capacity is at most what it has left
// starts full there; MigrateReset starts it fresh: neither suits plans a
// client can pick. The properties are checked in plans_migrate_test.go.
type Migration uint8

const (
	// MigrateProportional keeps the fraction of capacity in use: a key with
	// 15 of 20 spent that moves to a capacity of 200 has 150 spent (50
	// left; less if 200 would not be whole by when 20 would), and back again
	// 15 (5 left). It is the default.
	MigrateProportional Migration = iota
	// MigrateAsIs keeps the units left, capped at the new capacity: 5 left
	// of 20 stays 5 left of 200 (195 spent, less if 200 would not be
	// whole by when 20 would). A key with nothing spent is fresh under its
	// new rule, as under every policy: a store may drop a fresh key at any
	// time, and the key must fare the same either way.
	MigrateAsIs
	// MigrateAdditive keeps the units spent, capped at the new capacity: 15
	// spent of 20 is 15 spent of 200 (185 left). What the cap cuts off is
	// kept in the key's record until the old rule would have given it back:
	// 20 spent of 20, moved to a capacity of 10 (10 spent) and back at once,
	// has 20 spent of 20 again. A key in debt (more than its capacity in
	// use, after a Settle) moves with its whole debt as the amount, so that
	// it has its whole capacity in use under the new rule, and what is
	// above it is kept in the record in the same way.
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
// from milli-units has spent under a capacity of to, by policy m. spent may
// exceed from (an amount a cap cut off before, see moveRecord); the result
// is not capped at to, which the caller does, keeping the rest.
func (m Migration) carry(spent, from, to int64) int64 {
	spent = max(spent, 0)
	if spent == 0 {
		return 0 // a fresh key stays fresh, as a store may drop it anyway
	}
	switch m {
	case MigrateAsIs:
		return to - min(from-min(spent, from), to)
	case MigrateAdditive:
		return spent
	case MigrateReset:
		return 0
	}
	// Proportional: ceil(spent*to/from).
	q, r, ok := wide.MulDiv(uint64(spent), uint64(to), uint64(from))
	if !ok || q >= 1<<62 {
		return 1 << 62
	}
	if r != 0 {
		q++
	}
	return int64(q)
}

// migrator is what an algorithm offers to move a key between rules: what a
// state has in use at now and when it will be whole again, and a state that
// has a given amount in use at now and is whole again no later than a given
// instant.
type migrator[S any] interface {
	// spentAt returns the milli-units s has in use at now, rounded up.
	spentAt(s *S, now int64) int64
	// wholeAt returns the instant from which s, given no new spending, is
	// as good as a fresh state: now or earlier if it already is.
	wholeAt(s *S, now int64) int64
	// withSpent sets *s to a state with x milli-units (0 < x <= the
	// capacity) in use at now and no other history, that is whole again
	// by until (until > now) or, where the rule cannot end its count that
	// instant, by the end of the window or bucket that holds it (see
	// Migration).
	withSpent(s *S, now, x, until int64)
}

func (m *meter) spentAt(s *vtime, now int64) int64 {
	dn, df := m.debt(s, now)
	return int64(m.milliCeil(dn, df))
}

func (m *meter) wholeAt(s *vtime, now int64) int64 {
	if s.frac != 0 {
		return s.t + 1
	}
	return s.t
}

// withSpent starts the bucket x short of full, refilling at its own rate,
// or, if that would end after until, full again at until: less in use now
// than x, which the key's record keeps for its next move (see moveRecord).
func (m *meter) withSpent(s *vtime, now, x, until int64) {
	ns, frac, _ := m.span(uint64(x)) // x <= capacity: within the span
	*s = vtime{t: now + int64(ns), frac: frac}
	if until < s.t || until == s.t && frac != 0 {
		*s = vtime{t: until}
	}
}

func (a *fwAlgo) spentAt(s *fwState, now int64) int64 {
	_, _, count := a.at(s, now)
	return count
}

// wholeAt is the end of the state's window or, for a count in a later
// window than now's (see withSpent), that window's start: what a key moved
// in carried past it is in its record (see moveRecord), and what it was
// admitted since would have been whole by then under this rule.
func (a *fwAlgo) wholeAt(s *fwState, now int64) int64 {
	win, _, count := a.at(s, now)
	switch {
	case count == 0:
		return now
	case win > now/a.w:
		return win*a.w + 1
	}
	return (win + 1) * a.w
}

// withSpent counts x in now's window if until is in it, and otherwise in
// the next window: a count in a later window than now's applies from now on
// (see fwAlgo.at), and what is admitted meanwhile counts in that window, so
// that debt the old rule held past this window's end is not wiped out by it.
func (a *fwAlgo) withSpent(s *fwState, now, x, until int64) {
	win := now / a.w
	if until > (win+1)*a.w {
		win++
	}
	*s = fwState{win: win, count: x}
}

func (a *scAlgo) spentAt(s *scState, now int64) int64 {
	_, e, prev, cur := a.at(s, now)
	q, r, _ := wide.MulDiv(uint64(prev), uint64(a.w-e), uint64(a.w)) // <= prev
	if r != 0 {
		q++
	}
	return int64(q) + cur
}

func (a *scAlgo) wholeAt(s *scState, now int64) int64 {
	win, _, prev, cur := a.at(s, now)
	switch {
	case cur > 0:
		return (win + 2) * a.w
	case prev > 0:
		return (win + 1) * a.w
	}
	return now
}

// withSpent releases x as the old rule would by until if it released it
// evenly: what is still in use at the end of now's window is counted in
// it, and the rest in the window before, whose weight falls to zero at that
// end. The window before counts at most twice the capacity (a debt's
// bound); what that leaves over is counted in now's window.
func (a *scAlgo) withSpent(s *scState, now, x, until int64) {
	win := now / a.w
	end := (win + 1) * a.w
	left := a.w - (now - win*a.w) // > 0
	var cur int64
	if until > end {
		cur = ceilMulDiv(x, until-end, until-now) // <= x
	}
	prev := ceilMulDiv(x-cur, a.w, left)
	if prev > 2*a.capMilli {
		prev = 2 * a.capMilli
		q, _, _ := wide.MulDiv(uint64(prev), uint64(left), uint64(a.w))
		cur = max(cur, x-int64(q))
	}
	*s = scState{win: win, prev: prev, cur: cur}
}

// ceilMulDiv returns ceil(x*y/z) for 0 <= x, y and 0 < z with the result
// known to fit an int64.
func ceilMulDiv(x, y, z int64) int64 {
	q, r, _ := wide.MulDiv(uint64(x), uint64(y), uint64(z))
	if r != 0 {
		q++
	}
	return int64(q)
}

func (a *scCompactAlgo) spentAt(s *scCompact, now int64) int64 {
	w := s.wide()
	return a.scAlgo.spentAt(&w, now)
}

func (a *scCompactAlgo) wholeAt(s *scCompact, now int64) int64 {
	w := s.wide()
	return a.scAlgo.wholeAt(&w, now)
}

func (a *scCompactAlgo) withSpent(s *scCompact, now, x, until int64) {
	var w scState
	a.scAlgo.withSpent(&w, now, x, until)
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

func (a *slAlgo) wholeAt(s *slState, now int64) int64 {
	if n := len(s.buf); n > 0 {
		return max(now, s.at(n-1).t+a.window)
	}
	return now
}

// withSpent logs x as a few admissions that leave the window one after
// another, so that what is still logged at every instant is at least what
// the old rule would still hold if it gave x back evenly by until, and
// nothing is left at until (or a window from now, if until is later).
// Within a window of the clock's zero, an admission that would be logged
// before it is logged at it, as no state holds an earlier instant (see
// parseState): it then leaves the window later, at the window's length
// from zero, which holds the key to less, never more.
func (a *slAlgo) withSpent(s *slState, now, x, until int64) {
	*s = slState{}
	end := min(until, now+a.window)
	steps := min(x, migrationSteps)
	var logged int64
	for j := int64(1); j <= steps; j++ {
		// What remains once step j's admission leaves, at now + j/steps
		// of the way to end, is at least x * (steps - j) / steps.
		left := ceilMulDiv(x, steps-j, steps)
		t := max(now+ceilMulDiv(end-now, j, steps)-a.window, 0)
		s.admit(0, min(t, now), x-left-logged)
		logged = x - left
	}
}

// migrationSteps is how many admissions a sliding log spreads a moved-in
// amount over (see slAlgo.withSpent).
const migrationSteps = 8

func (a *swAlgo[A]) spentAt(s *swState[A], now int64) int64 {
	c, _ := a.at(s, now)
	return min(a.sum(s, c), a.capMilli)
}

func (a *swAlgo[A]) wholeAt(s *swState[A], now int64) int64 {
	c, _ := a.at(s, now)
	for j := min(c, s.last); j > c-a.k && j >= 0; j-- {
		if a.count(s, c, j) != 0 {
			return (j + a.k) * a.g
		}
	}
	return now
}

// withSpent spreads x over the buckets of the window so that what still
// counts when each bucket leaves it is at least what the old rule would
// still hold if it gave x back evenly by until (or a window from now, if
// until is later); now's bucket holds the rest, which leaves with it.
func (a *swAlgo[A]) withSpent(s *swState[A], now, x, until int64) {
	*s = swState[A]{}
	c := now / a.g
	a.put(s, c, 0)
	end := min(until, now+a.k*a.g)
	left := x // what the buckets from j on hold
	for j := max(c-a.k+1, 0); j <= c && left > 0; j++ {
		out := (j + a.k) * a.g // when bucket j leaves the window
		var after int64        // what must still count once it has
		if out < end && j < c {
			after = ceilMulDiv(x, end-out, end-now)
		}
		s.n[j%a.k] = left - after
		left = after
	}
}
