package ratelimit

import (
	"context"
	"math"
	"time"

	"github.com/ratekit/ratelimit/internal/wide"
)

// Settle charges the difference between what a request admitted by lim
// was charged (the estimate it was checked with) and what it turned out to
// cost, by the rules [Store.Settle] describes, and returns the Decision
// that tells when to come back and the request's cost as now settled.
//
// lim must be a limiter built by [New]; any other is an error matching
// [errors.ErrUnsupported].
func Settle(lim Limiter, charged, actual Units, at time.Duration) (Decision, Units, error) {
	s, ok := lim.(settling)
	if !ok {
		return Decision{}, 0, unsupported("Settle", lim)
	}
	return s.settle(charged, actual, at)
}

// settling is what the single-key limiters of this package offer for
// Settle.
type settling interface {
	settle(charged, actual Units, at time.Duration) (Decision, Units, error)
}

// settleCosts validates a settlement's costs: charged as a Check's cost
// (it was admitted, so it is from 1 to the capacity), actual positive.
func settleCosts(charged, actual Units, capacity int64, p *policy) (Decision, error) {
	if d, err := checkCost(charged, capacity, p); err != nil {
		return d, err
	}
	if actual <= 0 {
		return checkCost(actual, capacity, p)
	}
	return Decision{}, nil
}

// settleState settles on one state at now, for a charged cost within the
// rule's capacity, and returns the cost as settled: charged plus what was
// charged on top, or less what was given back.
func settleState[S any, A algorithm[S]](alg A, s *S, now, charged, actual int64, at time.Duration) int64 {
	if actual >= charged {
		return charged + alg.charge(s, now, actual-charged) // actual > 0: no overflow
	}
	// charged - actual < charged <= capacity: a refund's cost as it is.
	return charged - alg.refund(s, now, clampAt(at, now), charged-actual)
}

func (l *single[S, A]) settle(charged, actual Units, at time.Duration) (Decision, Units, error) {
	if d, err := settleCosts(charged, actual, l.capMil, l.pol); err != nil {
		return d, 0, err
	}
	now := l.tl.lock(clampTime(l.clock.Now()))
	settled := settleState(l.alg, &l.state, now, int64(charged), int64(actual), at)
	d := l.alg.step(&l.state, now, int64(charged), stepPeek)
	l.tl.unlock()
	return d, Units(settled), nil
}

func (l *atomicGCRA) settle(charged, actual Units, at time.Duration) (Decision, Units, error) {
	if d, err := settleCosts(charged, actual, l.alg.capMilli, &l.alg.pol); err != nil {
		return d, 0, err
	}
	var (
		d       Decision
		settled int64
	)
	l.update(l.now(), func(s *vtime, t int64) bool {
		was := *s
		settled = settleState(l.alg, s, t, int64(charged), int64(actual), at)
		l.decide(&d, s, t, int64(charged))
		return *s != was
	})
	return d, Units(settled), nil
}

// Settle settles a request admitted for key at the instant at (the
// admitting Decision's At) that was charged an estimate, charged, and
// turned out to cost actual: an API call reserved at 1,000 tokens that
// used 2,400. It returns the Decision that says when key may come back and
// the request's cost as now settled, which is actual when the whole
// difference was settled.
//
// A request that cost more is charged the difference now, even past the
// limit: the key goes into debt, and its next requests wait it off. One
// that cost less is refunded the difference, exactly as [Store.Refund]
// gives back cost admitted at at (so the settled cost is more than actual
// when the refund rules give back less).
//
// A key can owe at most one capacity beyond empty: what it has in use
// never goes past twice Limit. What that bound stops is not charged, and
// shows as a settled cost below actual. Per algorithm, what is in use and
// where the debt sits:
//
//   - [TokenBucket] and [GCRA]: the theoretical arrival time moves on by
//     the difference's time at Rate, from now if it lies behind, to at
//     most now + 2 x Burst/Rate: the bucket holds as little as -Burst,
//     refilling at Rate. (It also never passes the largest int64
//     nanosecond, which only a rule with Burst/Rate over 73 years comes
//     near.)
//   - [LeakyBucket]: the difference joins the queue at its end, to at most
//     2 x Capacity queued: the instant the queue is empty moves on as a
//     request of that cost would move it. Requests already admitted keep
//     their Delay; later ones are admitted once the queue has drained to
//     Capacity less their cost, and wait behind what is queued as always.
//   - [FixedWindow]: the current window's count, to at most 2 x Limit.
//     Debt does not carry over: it ends with the window, as every count
//     does.
//   - [SlidingLog]: an entry of the difference at now, leaving the window
//     at now + Window, while the cost in the window is at most 2 x Limit.
//   - [SlidingCounter]: the current window's count, while the estimate is
//     at most 2 x Limit; the count then weighs on the next window as the
//     previous one, as any count does. With CountRefused a refusal adds
//     nothing to a count already at or above Limit.
//   - [SubWindow]: the current bucket's count, while the window's count is
//     at most 2 x Limit; it leaves the window with its bucket. CountRefused
//     as for SlidingCounter.
//
// The Decision is the one [Store.Peek] would give a request of cost
// charged just after the settlement, at the same instant: Allowed tells
// whether such a request would be admitted now, and RetryAfter, if not,
// how long until it would be; Remaining is 0 while the key is in debt (as
// in every Decision), and ResetAfter is how long until the key is as good
// as a fresh one. The Decision of a Check, a Peek or a Refund likewise
// reports Remaining 0 while a key is in debt.
//
// A key the store does not hold is added to be charged (a fresh key, in
// debt if the difference exceeds Limit), and gives nothing back for a
// refund. charged and actual must be positive ([ErrInvalidCost]), and
// charged, which a Check admitted, at most the capacity
// ([ErrCostExceedsCapacity]); actual may be any positive cost, the bound
// above applying. An at later than the store's current time is taken as
// that time; at only matters to a refund.
func (s *Store) Settle(key string, charged, actual Units, at time.Duration) (Decision, Units, error) {
	if d, err := settleCosts(charged, actual, s.core.capacity(), s.core.policy()); err != nil {
		return d, 0, err
	}
	layers := [1]compositeLayer{{store: s.core, counts: true}}
	return settleLayers(layers[:], 1, s.core.clock(), key, int64(charged), int64(actual), at)
}

// Settle settles a request admitted for key at the instant at, charged
// charged and costing actual, in every enforced layer at one instant, as
// [Store.Settle] does in each layer's store for the layer's own key: all
// of it or nothing (an error). Shadow layers keep what they spent, as
// [Composite.Refund] leaves them. The Decision is [Composite.Peek]'s for
// cost charged just after, and the settled cost is the one furthest from
// actual of the enforced layers' (the least charged, or the least given
// back); a composite of shadow layers only settles nothing and reports
// charged. Its cost errors are [Composite.Check]'s for charged, and for an
// actual of zero or less [ErrInvalidCost].
func (c *Composite) Settle(key string, charged, actual Units, at time.Duration) (Decision, Units, error) {
	if d, err := c.settleCosts(charged, actual); err != nil {
		return d, 0, err
	}
	return settleLayers(c.layers, c.enforced, c.clock, key, int64(charged), int64(actual), at)
}

// settleCosts is settleCosts for a Composite's enforced layers.
func (c *Composite) settleCosts(charged, actual Units) (Decision, error) {
	if d, err := c.checkCost(charged); err != nil {
		return d, err
	}
	if actual <= 0 {
		return c.checkCost(actual)
	}
	return Decision{}, nil
}

// Settle settles a request admitted for key at the instant at, charged
// charged and costing actual, in the stores of key's plan, as
// [Composite.Settle] does. A key whose plan has changed since its last
// check is moved to its new plan's stores first, as its next check would
// move it, and settles there. (A key in debt that moves keeps, by its
// [Migration], at most a whole capacity in use.)
func (p *Plans) Settle(key string, charged, actual Units, at time.Duration) (Decision, Units, error) {
	var f fence
	defer f.lift()
	for ; ; p.again(&f) {
		g := p.gen.Load()
		bp := p.plan(context.Background(), g, key)
		if d, err := bp.comp.settleCosts(charged, actual); err != nil {
			bp.name.fill(&d)
			return d, 0, err
		}
		layers := bp.comp.layers
		var buf [inlineLayers]layerTurn
		turns := prepareTurns(layers, key, int64(charged), buf[:0])
		var lbuf [inlineLayers]shardLock
		locks, now, ok := p.lockPlan(g, bp, key, turns, lbuf[:0], false, true)
		if !ok {
			continue
		}
		d, settled, err := settleLocked(layers, turns, bp.comp.enforced, now, int64(charged), int64(actual), at)
		unlockAll(locks)
		bp.name.fill(&d)
		return d, Units(settled), err
	}
}

// settleLayers settles in every layer at one instant, with every layer's
// shard locked in tryLayers' order.
func settleLayers(layers []compositeLayer, enforced int, clock Clock, key string, charged, actual int64, at time.Duration) (Decision, Units, error) {
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, charged, buf[:0])
	now := lockTurns(layers, turns, clock)
	d, settled, err := settleLocked(layers, turns, enforced, now, charged, actual, at)
	unlockTurns(layers, turns)
	return d, Units(settled), err
}

// settleLocked settles in every enforced layer, with their shards locked at
// now, and returns the Decision for cost charged after it and the settled
// cost furthest from actual. A charge first acquires every layer's entry,
// so that it is made in all of them or, if a store has no room, in none.
func settleLocked(layers []compositeLayer, turns []layerTurn, enforced int, now, charged, actual int64, at time.Duration) (Decision, int64, error) {
	if actual > charged {
		for i := range turns {
			if !layers[i].shadow && !layers[i].store.acquire(turns[i].k, now) {
				return peekLocked(layers, turns, enforced, now, charged), 0, errNoRoom
			}
		}
	}
	settled := charged
	first := true
	for i := range turns {
		if layers[i].shadow {
			continue
		}
		x := layers[i].store.settleAt(turns[i].k, now, charged, actual, at)
		if first || abs(x-actual) > abs(settled-actual) {
			settled, first = x, false
		}
	}
	return peekLocked(layers, turns, enforced, now, charged), settled, nil
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// settleAt settles on k's entry, with its shard locked: a charge needs the
// entry acquired; a refund on a key the store does not hold gives nothing.
func (c *storeCore[S, A]) settleAt(k storeKey, now, charged, actual int64, at time.Duration) int64 {
	t := &c.shards[k.h&c.mask].t
	s := t.Lookup(k.key, k.tag)
	if s == nil {
		return charged
	}
	return settleState(c.alg, s, now, charged, actual, at)
}

// The algorithms' charges: charge spends up to extra milli-units (extra
// > 0) at now even past the limit, as far as the debt bound allows (see
// Store.Settle), and returns how many it spent.

// maxTAT is the latest theoretical arrival time a charge moves a bucket to:
// the largest instant an int64 holds.
const maxTAT = math.MaxInt64

// charge for the buckets: the schedule moves on by the time extra is worth,
// from now if it lies behind, to at most 2 tau ahead of now (in use: at
// most twice the capacity) and never past maxTAT.
func (m *meter) charge(s *vtime, now, extra int64) int64 {
	g := min(extra, 2*m.capMilli-m.spentAt(s, now)) // spentAt rounds up: g rounds down
	if g <= 0 {
		return 0
	}
	base := *s
	if base.t < now {
		base = vtime{t: now}
	}
	// The time left to maxTAT, maxTAT - base.t - base.frac/n, in
	// milli-units rounded down.
	var room uint64
	ok := true
	switch {
	case base.t == maxTAT:
		room = 0
	case base.frac == 0:
		room, _, ok = wide.MulDiv(uint64(maxTAT-base.t), m.n, m.p)
	default:
		room, _, ok = wide.MulAddDiv(uint64(maxTAT-base.t-1), m.n, m.n-base.frac, m.p)
	}
	if ok && room < uint64(g) {
		if g = int64(room); g == 0 {
			return 0
		}
	}
	// g <= 2 capMilli: its span is at most 2 tau < 2^63, and base plus it
	// at most maxTAT.
	sn, sf, _ := wide.MulDiv(uint64(g), m.p, m.n)
	t, f := base.t+int64(sn), base.frac+sf
	if f >= m.n {
		t, f = t+1, f-m.n
	}
	*s = vtime{t: t, frac: f}
	return g
}

func (a *fwAlgo) charge(s *fwState, now, extra int64) int64 {
	win, _, count := a.at(s, now)
	g := min(extra, 2*a.capMilli-count)
	if g <= 0 {
		return 0
	}
	*s = fwState{win: win, count: count + g}
	return g
}

func (a *scAlgo) charge(s *scState, now, extra int64) int64 {
	// The estimate at now, rounded up: what is in use.
	g := min(extra, 2*a.capMilli-a.spentAt(s, now))
	if g <= 0 {
		return 0
	}
	win, _, prev, cur := a.at(s, now)
	*s = scState{win: win, prev: prev, cur: cur + g}
	return g
}

func (a *scCompactAlgo) charge(s *scCompact, now, extra int64) int64 {
	w := s.wide()
	g := a.scAlgo.charge(&w, now, extra)
	*s = w.compact()
	return g
}

func (a *slAlgo) charge(s *slState, now, extra int64) int64 {
	n := len(s.buf)
	if n > 0 {
		now = max(now, s.at(n-1).t)
	}
	g := min(extra, 2*a.capMilli-a.spentAt(s, now))
	if g <= 0 {
		return 0
	}
	s.admit(a.expired(s, now), now, g)
	return g
}

func (a *swAlgo[A]) charge(s *swState[A], now, extra int64) int64 {
	c, _ := a.at(s, now)
	g := min(extra, 2*a.capMilli-a.sum(s, c)) // sum saturates at 2 capMilli + 1
	if g <= 0 {
		return 0
	}
	a.put(s, c, a.count(s, c, c)+g)
	return g
}
