package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Moved is a key's state after [MoveState] moved it to another rule.
type Moved struct {
	// State is the key's state under the new rule, encoded as a
	// [Machine]'s; empty if the key starts fresh under it (there is then
	// nothing to write).
	State []byte

	// Whole is the instant from which State is as good as a fresh state if
	// nothing more is spent: when a backend may let it expire. Zero for an
	// empty State.
	Whole time.Duration

	// Record is the move record after the move (see [MoveState]): what a
	// move of the key's first layer carried in, to pass to its next move.
	// Empty if it carried nothing.
	Record []byte

	// At is the instant the move was made at: now, raised to the old
	// state's latest instant and the record's. A backend checks the key at
	// no earlier instant.
	At time.Duration
}

// MoveState moves a key's state from the rule of from to the rule of to
// under policy, exactly as [Plans] moves a key when its plan changes or an
// Update changes its plan's rule, with the same code: the state it gives
// is, field for field, what the in-process store of the new rule holds for
// the key after the move, so a backend that keeps a Plans' keys outside
// the process (redisstore keeps them in Redis) gives the Plans' Decisions.
//
// state is the key's state under from (a [Machine] state; empty for a
// fresh one, or one a backend let expire once it was as good as fresh); now
// the instant of the move (clamped into [0, MaxTime] and raised to the
// state's latest instant and the record's). A key with an empty state and
// an empty record starts fresh under to; with a record, what the record
// says is still to be given back moves, as it does from a fresh state of
// the in-process store.
//
// record is the key's move record: what the key's last move carried into
// the first layer of the plan that holds it (see [Migration]), as
// "at until x held until0 x0", six decimal integers separated by single
// spaces (the move's instant; when what it carried in is given back in
// full, and the amount given back then, before the new capacity's cap;
// what the state it was given held at the move; and an earlier amount it
// carried in, x0, given back at until0, or 0), or empty if that move
// carried nothing. A Plans keeps it for the first layer of each plan only:
// for any other layer pass an empty record and ignore the one returned. A
// move of the key resets its record: after moving a key, keep the first
// layer's Moved.Record, or an empty record if the first layer did not move
// (its old state was empty, its new key already held a state, or the rule
// did not change).
//
// A state or record that does not parse, or that the rules could not have
// produced, is an error matching [ErrInvalidState]; a policy that is not
// one of the four is an error matching [ErrInvalidOption].
func MoveState(from, to *Machine, policy Migration, state, record []byte, now time.Duration) (Moved, error) {
	if !policy.valid() {
		return Moved{}, fmt.Errorf("%w: MoveState: %v is not a migration policy", ErrInvalidOption, policy)
	}
	src, ok1 := from.core.(mover)
	dst, ok2 := to.core.(mover)
	if !ok1 || !ok2 {
		return Moved{}, fmt.Errorf("%w: MoveState: a machine not built by NewMachine", ErrInvalidOption)
	}
	r, err := parseMoveRecord(record, from.core.capacity())
	if err != nil {
		return Moved{}, err
	}
	t, fields, err := splitState(state, now)
	if err != nil {
		return Moved{}, err
	}
	t = max(t, r.at)
	if len(state) == 0 && len(record) == 0 {
		return Moved{At: time.Duration(t)}, nil
	}
	spent, whole := int64(0), t // an empty state is a fresh one
	if len(state) > 0 {
		if spent, whole, err = src.take(fields, t); err != nil {
			return Moved{}, err
		}
	}
	ts := moveAmounts(&r, src, spent, whole, t, policy, from.core.capacity(), to.core.capacity())
	x, whole := satAdd(ts[0].x, ts[1].x), ts[1].until
	if x <= 0 || whole <= t {
		return Moved{At: time.Duration(t)}, nil
	}
	held := min(x, to.core.capacity())
	next := dst.put(t, held, whole, strconv.AppendInt(nil, t, 10))
	// When the state is as good as a fresh one: its ResetAfter after the
	// least cost, which a state that holds a count in a later window (a
	// fixed window's, see fwAlgo.withSpent) reports to that window's end.
	d, err := to.Look(next, time.Duration(t), 1)
	if err != nil {
		return Moved{}, err // a state put wrote that its rule cannot read: a bug
	}
	rec := appendInts(strconv.AppendInt(nil, t, 10), whole, ts[1].x, held, ts[0].until, ts[0].x)
	return Moved{State: next, Whole: time.Duration(t) + d.ResetAfter, Record: rec, At: time.Duration(t)}, nil
}

// parseMoveRecord reads a move record (see MoveState) of a state under a
// rule of capacity capMilli: held is at most that capacity, since it is
// what the move put in a state of that rule, and at most the two amounts.
func parseMoveRecord(b []byte, capMilli int64) (moveRecord, error) {
	f, err := parseState(b)
	switch {
	case err != nil:
		return moveRecord{}, fmt.Errorf("%w: move record: %w", ErrInvalidState, err)
	case len(f) == 0:
		return moveRecord{}, nil
	case len(f) != 6:
		return moveRecord{}, fmt.Errorf("%w: move record %q: wants six integers", ErrInvalidState, clip(b))
	}
	r := moveRecord{at: f[0], until: f[1], x: f[2], held: f[3], until0: f[4], x0: f[5]}
	switch {
	case r.at > int64(MaxTime) || r.until <= r.at || r.until0 < 0 || r.until0 >= r.until || r.x0 > 0 && r.until0 <= r.at:
		return moveRecord{}, fmt.Errorf("%w: move record %q: its instants are out of order or range", ErrInvalidState, clip(b))
	case r.x < 0 || r.x0 < 0 || r.held <= 0 || r.held > satAdd(r.x0, r.x) || r.held > capMilli || r.x > 1<<62 || r.x0 > 1<<62:
		return moveRecord{}, fmt.Errorf("%w: move record %q: its amounts are beyond the rule's", ErrInvalidState, clip(b))
	}
	return r, nil
}

// mover is what MoveState needs of a machine's algorithm: a store's take,
// setSpent and heldAt (see keyedStore) on an encoded state.
type mover interface {
	// take reads an algorithm state (the fields after the latest instant)
	// and returns what it has in use at now and when it is whole again.
	take(fields []int64, now int64) (spent, whole int64, err error)
	// put appends to dst the fields of a state with x in use at now, whole
	// again by until (see migrator.withSpent).
	put(now, x, until int64, dst []byte) []byte
	heldAt(at, x, until, now int64) int64
	// fresh reads an algorithm state and reports whether it is as good as
	// the zero state at now.
	fresh(fields []int64, now int64) (bool, error)
}

func (m machineOf[S, A]) fresh(fields []int64, now int64) (bool, error) {
	var s S
	if err := m.alg.decodeAt(fields, &s, now); err != nil {
		return false, err
	}
	return m.alg.fresh(&s, now), nil
}

func (m machineOf[S, A]) take(fields []int64, now int64) (int64, int64, error) {
	var s S
	if err := m.alg.decodeAt(fields, &s, now); err != nil {
		return 0, 0, err
	}
	return m.alg.spentAt(&s, now), m.alg.wholeAt(&s, now), nil
}

func (m machineOf[S, A]) put(now, x, until int64, dst []byte) []byte {
	var s S
	m.alg.withSpent(&s, now, x, until)
	return m.alg.encode(dst, &s)
}

func (m machineOf[S, A]) heldAt(at, x, until, now int64) int64 {
	return heldAt[S](m.alg, at, x, until, now)
}

// holder is what moveRecord.carry needs of the rule that holds a key: what
// a state it was given holds later. Stores and machines have it.
type holder interface {
	heldAt(at, x, until, now int64) int64
}

// heldAt returns what a state of alg given x at at, whole again by until,
// holds at now: the one computation of it for stores and machines.
func heldAt[S any](alg migrator[S], at, x, until, now int64) int64 {
	if x <= 0 || until <= at {
		return 0
	}
	var s S
	alg.withSpent(&s, at, x, until)
	return alg.spentAt(&s, now)
}

// Fresh reports whether state (a [Machine] state of m's rule) is as good
// as a fresh key's at now: what a move into it may write over, as [Plans]
// moves a key into a store whose entry for it holds nothing (see
// [MoveState]). A state that does not parse is an error matching
// [ErrInvalidState].
func (m *Machine) Fresh(state []byte, now time.Duration) (bool, error) {
	t, fields, err := splitState(state, now)
	if err != nil {
		return false, err
	}
	mv, ok := m.core.(mover)
	if !ok {
		return false, fmt.Errorf("%w: Fresh: a machine not built by NewMachine", ErrInvalidOption)
	}
	return mv.fresh(fields, t)
}

// PlanFromContext returns the plan name ctx carries (see
// [ContextWithPlan]) and whether it carries one: what a backend's plans
// read to put a request's key on the plan the request names, as [Plans]
// does.
func PlanFromContext(ctx context.Context) (plan string, ok bool) {
	plan, ok = ctx.Value(planKey{}).(string)
	return plan, ok
}
