package refmodel

import "math/big"

// Migrator is a model whose key can move to another rule: what it has
// spent at an instant, and a fresh start with a given amount spent, as the
// library's Migration defines them.
type Migrator interface {
	Model
	// Spent returns the milli-units in use at now (which never decreases),
	// rounded up.
	Spent(now int64) int64
	// SetSpent forgets everything and makes x milli-units in use at now.
	SetSpent(now, x int64)
}

// Spent implements Migrator: the burst less the tokens at now.
func (b *Bucket) Spent(now int64) int64 {
	tokens := new(big.Rat).Add(b.tokens, new(big.Rat).Mul(rat(now-b.last), b.rate))
	if tokens.Cmp(b.burst) > 0 {
		tokens.Set(b.burst)
	}
	return ceilInt(new(big.Rat).Sub(b.burst, tokens))
}

// SetSpent implements Migrator.
func (b *Bucket) SetSpent(now, x int64) {
	b.tokens, b.last = new(big.Rat).Sub(b.burst, rat(x)), now
}

// Spent implements Migrator: the work queued at now.
func (q *Queue) Spent(now int64) int64 {
	ahead := new(big.Rat).Sub(maxRat(q.free, rat(now)), rat(now))
	return ceilInt(ahead.Mul(ahead, q.rate))
}

// SetSpent implements Migrator.
func (q *Queue) SetSpent(now, x int64) {
	q.free = new(big.Rat).Add(rat(now), new(big.Rat).Quo(rat(x), q.rate))
}

// Spent implements Migrator: the count of now's window.
func (m *FixedWindow) Spent(now int64) int64 { return m.counts[uint64(now)/m.w] }

// SetSpent implements Migrator.
func (m *FixedWindow) SetSpent(now, x int64) { m.counts = map[uint64]int64{uint64(now) / m.w: x} }

// Spent implements Migrator: the estimate at now.
func (m *SlidingCounter) Spent(now int64) int64 { return ceilInt(m.estimate(uint64(now))) }

// SetSpent implements Migrator.
func (m *SlidingCounter) SetSpent(now, x int64) {
	m.counts = map[uint64]int64{uint64(now) / m.w: x}
}

// Spent implements Migrator: the cost still in the window at now.
func (l *Log) Spent(now int64) int64 { return l.inside(now) }

// SetSpent implements Migrator: one admission of x at now.
func (l *Log) SetSpent(now, x int64) {
	l.events = nil
	if x > 0 {
		l.events = []logEvent{{t: now, cost: x}}
	}
}
