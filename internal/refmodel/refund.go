package refmodel

import "math/big"

// Refunder is a model that can give back admitted cost: Refund gives back
// at most cost milli-units of what was admitted at at (at <= now), seen
// from now, and returns how many it gave, by the rule's definition of what
// the key still holds of that admission.
type Refunder interface {
	Refund(now, at, cost int64) int64
}

// minFloor returns floor(min(xs)), or 0 if that is negative.
func minFloor(xs ...*big.Rat) int64 {
	m := xs[0]
	for _, x := range xs[1:] {
		if x.Cmp(m) < 0 {
			m = x
		}
	}
	if m.Sign() <= 0 {
		return 0
	}
	return floorInt(m)
}

// Refund implements Refunder: what the bucket is short of full, and of the
// cost less what the bucket has earned since at, the least, rounded down.
func (b *Bucket) Refund(now, at, cost int64) int64 {
	tokens := new(big.Rat).Add(b.tokens, new(big.Rat).Mul(rat(now-b.last), b.rate))
	if tokens.Cmp(b.burst) > 0 {
		tokens.Set(b.burst)
	}
	earned := new(big.Rat).Mul(rat(now-at), b.rate)
	g := minFloor(rat(cost), new(big.Rat).Sub(b.burst, tokens), new(big.Rat).Sub(rat(cost), earned))
	b.tokens, b.last = tokens.Add(tokens, rat(g)), now
	return g
}

// Refund implements Refunder: what the queue holds, and of the cost less
// what has drained since at, the least, rounded down.
func (q *Queue) Refund(now, at, cost int64) int64 {
	t := rat(now)
	ahead := new(big.Rat).Sub(maxRat(q.free, t), t)
	queued := new(big.Rat).Mul(ahead, q.rate)
	drained := new(big.Rat).Mul(rat(now-at), q.rate)
	g := minFloor(rat(cost), queued, new(big.Rat).Sub(rat(cost), drained))
	q.free = new(big.Rat).Sub(q.free, new(big.Rat).Quo(rat(g), q.rate))
	return g
}

// take takes up to cost from window j's count.
func (m *windows) take(j uint64, cost int64) int64 {
	g := min(cost, m.counts[j])
	m.counts[j] -= g
	return g
}

// Refund implements Refunder: from the current window's count, if at is in
// it.
func (m *FixedWindow) Refund(now, at, cost int64) int64 {
	if uint64(at)/m.w != uint64(now)/m.w {
		return 0
	}
	return m.take(uint64(at)/m.w, cost)
}

// Refund implements Refunder: from the count of at's window, if that is the
// current window or the one before.
func (m *SlidingCounter) Refund(now, at, cost int64) int64 {
	k, j := uint64(now)/m.w, uint64(at)/m.w
	if j != k && j+1 != k {
		return 0
	}
	return m.take(j, cost)
}

// Refund implements Refunder: from at's bucket, if it still counts.
func (m *SubWindow) Refund(now, at, cost int64) int64 {
	j := uint64(at) / m.w
	if j*m.w+m.k*m.w <= uint64(now) {
		return 0
	}
	return m.take(j, cost)
}

// Refund implements Refunder: from the events admitted at exactly at, if
// they still count.
func (l *Log) Refund(now, at, cost int64) int64 {
	var g int64
	kept := l.events[:0]
	for _, e := range l.events {
		if e.t == at && l.counts(e, now) && g < cost {
			take := min(cost-g, e.cost)
			g += take
			e.cost -= take
		}
		if e.cost > 0 {
			kept = append(kept, e)
		}
	}
	l.events = kept
	return g
}
