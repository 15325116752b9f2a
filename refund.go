package ratelimit

import (
	"context"
	"time"

	"github.com/ratekit/ratelimit/internal/wide"
)

// refunder is an algorithm's refund, in the algorithm interface: it gives
// back at most cost milli-units (1 <= cost <= capacity) of what was
// admitted at at, seen from now (at <= now), and returns how many it gave.
//
// charge is the other way round, for [Store.Settle]: it spends up to extra
// milli-units (extra > 0) at now even past the limit, within the debt
// bound, and returns how many it spent (see settle.go).
type refunder[S any] interface {
	refund(s *S, now, at, cost int64) int64
	charge(s *S, now, extra int64) int64
}

// Refund gives back up to cost of what lim admitted at the instant at (the
// admitting Decision's At), by the rules [Store.Refund] describes, and
// returns how much it gave back.
//
// lim must be a limiter built by [New]; any other is an error matching
// [errors.ErrUnsupported].
func Refund(lim Limiter, cost Units, at time.Duration) (Units, error) {
	r, ok := lim.(refunding)
	if !ok {
		return 0, unsupported("Refund", lim)
	}
	return r.refund(cost, at)
}

// refunding is what the single-key limiters of this package offer for
// Refund.
type refunding interface {
	refund(cost Units, at time.Duration) (Units, error)
}

// refundCost validates a refund's cost and caps it at the capacity.
func refundCost(cost Units, capacity int64, p *policy) (int64, error) {
	if cost <= 0 {
		_, err := checkCost(cost, capacity, p)
		return 0, err
	}
	return min(int64(cost), capacity), nil
}

func (l *single[S, A]) refund(cost Units, at time.Duration) (Units, error) {
	c, err := refundCost(cost, l.capMil, l.pol)
	if err != nil {
		return 0, err
	}
	now := l.tl.lock(clampTime(l.clock.Now()))
	g := l.alg.refund(&l.state, now, clampAt(at, now), c)
	l.tl.unlock()
	return Units(g), nil
}

func (l *atomicGCRA) refund(cost Units, at time.Duration) (Units, error) {
	c, err := refundCost(cost, l.alg.capMilli, &l.alg.pol)
	if err != nil {
		return 0, err
	}
	var g int64
	// As Check: never judge earlier than the TAT proves was used.
	l.update(l.now(), func(s *vtime, t int64) bool {
		g = l.alg.refund(s, t, clampAt(at, t), c)
		return g != 0
	})
	return Units(g), nil
}

// Refund gives back up to cost of what key was admitted at the instant at
// (the admitting Decision's At), for a request that turned out cheaper
// than it was charged or was never carried out, and returns how much it
// gave back. What can be given back depends on when the cost was admitted:
// at most what the key still holds of that admission, per algorithm:
//
//   - [TokenBucket], [GCRA] and [LeakyBucket]: max(0, cost - Rate x (now -
//     at)), and never more than the bucket is short of full (the queue
//     holds): a bucket that has refilled since gains nothing.
//   - [FixedWindow]: cost, if at is in the current window; nothing once
//     that window has passed.
//   - [SlidingCounter]: cost, from the current window's count if at is in
//     the current window, from the previous window's if at is in that one
//     (where it now weighs less), and nothing before.
//   - [SlidingLog]: the cost of the entry admitted at exactly at, while it
//     is still in the window. It costs time linear in the log's entries.
//   - [SubWindow]: the cost of at's bucket, while that bucket still counts.
//
// In every case the amount is capped by what the key holds there (a count
// is never made negative) and rounded down to the milli-unit. A refund
// never leaves a key with more allowance than it would have had if the
// refunded cost had never been admitted, and Check(c) followed at once (at
// the same instant) by a refund of c at its At leaves the key deciding
// every later check exactly as if that Check had never happened. Refund
// only what was admitted: a refund at an instant where nothing of the
// request was admitted may still take from whatever the key holds there,
// within those bounds.
//
// A key the store does not hold gives back nothing and is not added. A
// cost of zero or less is an error matching [ErrInvalidCost]; a cost above
// the rule's capacity is capped at it. An at later than the store's
// current time is taken as that time.
func (s *Store) Refund(key string, cost Units, at time.Duration) (Units, error) {
	c, err := refundCost(cost, s.core.capacity(), s.core.policy())
	if err != nil {
		return 0, err
	}
	layers := [1]compositeLayer{{store: s.core}}
	g, _ := refundLayers(layers[:], s.core.clock(), key, c, int64(at))
	return Units(g), nil
}

// Refund gives back up to cost of what key was admitted at the instant at
// (the admitting Decision's At) in every enforced layer, at one instant, as
// [Store.Refund] does in each layer's store for the layer's own key, and
// returns the least any of them gave back. Shadow layers keep what they
// spent: they may not have spent it. A cost of zero or less
// is an error matching [ErrInvalidCost]; each layer caps a larger cost
// than it can give back.
func (c *Composite) Refund(key string, cost Units, at time.Duration) (Units, error) {
	if cost <= 0 {
		_, err := c.checkCost(cost)
		return 0, err
	}
	_, g := refundLayers(c.layers, c.clock, key, int64(cost), int64(at))
	return Units(g), nil
}

// Refund gives back up to cost of what key was admitted at the instant at
// (the admitting Decision's At) in the stores of key's plan, as
// [Composite.Refund] does. A key whose plan has changed since its last
// check is moved to its new plan's stores first, as its next check (or a
// Settle) would move it, and refunds there.
func (p *Plans) Refund(key string, cost Units, at time.Duration) (Units, error) {
	if cost <= 0 {
		_, err := p.gen.Load().def.comp.checkCost(cost)
		return 0, err
	}
	var f fence
	defer f.lift()
	for ; ; p.again(&f) {
		g := p.gen.Load()
		bp := p.plan(context.Background(), g, key)
		layers := bp.comp.layers
		var buf [inlineLayers]layerTurn
		turns := prepareTurns(layers, key, 1, buf[:0])
		var lbuf [inlineLayers]shardLock
		locks, now, ok := p.lockPlan(g, bp, key, turns, lbuf[:0], false, false)
		if !ok {
			continue
		}
		_, least := refundLocked(layers, turns, now, int64(cost), int64(at))
		unlockAll(locks)
		return Units(least), nil
	}
}

// refundLayers refunds in every layer at one instant, with every layer's
// shard locked in tryLayers' order. It returns what the first layer gave
// (a Store's) and the least any enforced layer gave.
func refundLayers(layers []compositeLayer, clock Clock, key string, cost, at int64) (first, least int64) {
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, 1, buf[:0])
	now := lockTurns(layers, turns, clock) // a cost of 1 is no turn's error
	first, least = refundLocked(layers, turns, now, cost, at)
	unlockTurns(layers, turns)
	return first, least
}

// refundLocked refunds in every layer, with their shards locked at now,
// and returns what the first layer gave back and the least any enforced
// layer did.
func refundLocked(layers []compositeLayer, turns []layerTurn, now, cost, at int64) (first, least int64) {
	least = -1
	for i := range turns {
		if layers[i].shadow {
			// A shadow layer spent only if it would itself have admitted
			// the request: giving back what it may not hold would make it
			// report more leniently than it would enforce.
			continue
		}
		st := layers[i].store
		g := st.refundAt(turns[i].k, now, clampAt(time.Duration(at), now), min(cost, st.capacity()))
		if i == 0 {
			first = g
		}
		if least < 0 || g < least {
			least = g
		}
	}
	return first, max(least, 0)
}

// clampAt clamps a refund's admission instant to [0, now]: nothing was
// admitted before the clock's origin, or after now.
func clampAt(at time.Duration, now int64) int64 {
	return min(max(int64(at), 0), now)
}

// refundAt refunds on k's entry, with its shard locked; a key the store
// does not hold gives back nothing.
func (c *storeCore[S, A]) refundAt(k storeKey, now, at, cost int64) int64 {
	t := &c.shards[k.h&c.mask].t
	s := t.Lookup(k.key, k.tag)
	if s == nil {
		return 0
	}
	return c.alg.refund(s, now, at, cost)
}

// The algorithms' refunds.

// refund for the buckets: the schedule moves back by the time the cost
// given back is worth.
func (m *meter) refund(s *vtime, now, at, cost int64) int64 {
	dn, df := m.debt(s, now)
	// What the bucket is short of full, in milli-units rounded down.
	var held uint64
	if m.n == 1 {
		held = m.pdiv.Div(dn)
	} else {
		held, _, _ = wide.MulAddDiv(dn, m.n, df, m.p) // debt <= the capacity's span: fits
	}
	g := min(cost, int64(held))
	if e := uint64(now - at); e > 0 {
		if e > m.tauNs {
			return 0 // refilled by more than the capacity since
		}
		g = min(g, cost-int64(m.milliCeil(e, 0)))
	}
	if g <= 0 {
		return 0
	}
	sn, sf, _ := m.span(uint64(g)) // <= the debt: s stays at or after now
	t, f := s.t-int64(sn), s.frac
	if f < sf {
		t, f = t-1, f+m.n
	}
	*s = vtime{t: t, frac: f - sf}
	return g
}

func (a *fwAlgo) refund(s *fwState, now, at, cost int64) int64 {
	win, _, count := a.at(s, now)
	if at/a.w != win || count == 0 {
		return 0
	}
	g := min(cost, count)
	*s = fwState{win: win, count: count - g}
	return g
}

func (a *scAlgo) refund(s *scState, now, at, cost int64) int64 {
	win, _, prev, cur := a.at(s, now)
	var g int64
	switch at / a.w {
	case win:
		g = min(cost, cur)
		cur -= g
	case win - 1:
		g = min(cost, prev)
		prev -= g
	}
	if g > 0 {
		*s = scState{win: win, prev: prev, cur: cur}
	}
	return g
}

func (a *scCompactAlgo) refund(s *scCompact, now, at, cost int64) int64 {
	w := s.wide()
	g := a.scAlgo.refund(&w, now, at, cost)
	*s = w.compact()
	return g
}

func (a *slAlgo) refund(s *slState, now, at, cost int64) int64 {
	n := len(s.buf)
	if n == 0 {
		return 0
	}
	now = max(now, s.at(n-1).t)
	if at+a.window <= now {
		return 0 // expired, or never in the log
	}
	k := a.expired(s, now)
	// The entry at exactly at, among the live ones.
	lo, hi := k, n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).t < at {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == n || s.at(lo).t != at {
		return 0
	}
	prev := s.base
	if lo > 0 {
		prev = s.at(lo - 1).cum
	}
	g := min(cost, int64(s.at(lo).cum-prev))
	// Rebuild the live entries with g taken from that one, dropping it if
	// nothing is left of it.
	var rebuilt slState
	for i := k; i < n; i++ {
		e := s.at(i)
		p := s.base
		if i > 0 {
			p = s.at(i - 1).cum
		}
		c := int64(e.cum - p)
		if i == lo {
			c -= g
		}
		if c > 0 {
			rebuilt.admit(0, e.t, c)
		}
	}
	*s = rebuilt
	return g
}

func (a *swAlgo[A]) refund(s *swState[A], now, at, cost int64) int64 {
	c, _ := a.at(s, now)
	j := at / a.g
	n := a.count(s, c, j)
	if n == 0 {
		return 0
	}
	g := min(cost, n)
	s.n[j%a.k] = n - g
	return g
}
