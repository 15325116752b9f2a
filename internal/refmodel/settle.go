package refmodel

import (
	"maps"
	"math"
	"math/big"
	"slices"

	"github.com/ratekit/ratelimit"
)

// Settler is a model that can spend past its limit and be looked at:
// Charge spends up to extra milli-units at now even past the limit, as far
// as the key may go into debt, and returns how many it spent; Look is the
// Decision Step would give, changing nothing.
//
// The debt bound, from its definition: a key never has more than twice
// its capacity in use (a bucket holds at least -Burst, a queue at most
// twice its Capacity, a window's count or estimate is at most twice the
// limit). A bucket's or queue's theoretical arrival time also never passes
// the largest int64 nanosecond.
type Settler interface {
	Charge(now, extra int64) int64
	Look(now, cost int64) ratelimit.Decision
}

// maxTAT is the latest instant a bucket's schedule may reach.
var maxTAT = rat(math.MaxInt64)

// Charge implements Settler: tokens may fall to -Burst.
func (b *Bucket) Charge(now, extra int64) int64 {
	tokens := new(big.Rat).Add(b.tokens, new(big.Rat).Mul(rat(now-b.last), b.rate))
	if tokens.Cmp(b.burst) > 0 {
		tokens.Set(b.burst)
	}
	// The instant the bucket is full again, now + (burst - tokens + g)/rate,
	// at most maxTAT.
	full := new(big.Rat).Sub(b.burst, tokens)
	ceiling := new(big.Rat).Sub(new(big.Rat).Mul(new(big.Rat).Sub(maxTAT, rat(now)), b.rate), full)
	g := minFloor(rat(extra), new(big.Rat).Add(tokens, b.burst), ceiling)
	b.tokens, b.last = tokens.Sub(tokens, rat(g)), now
	return g
}

// Look implements Settler.
func (b *Bucket) Look(now, cost int64) ratelimit.Decision {
	c := *b
	return c.Step(now, cost)
}

// Charge implements Settler: up to twice the capacity may be queued.
func (q *Queue) Charge(now, extra int64) int64 {
	t := rat(now)
	start := maxRat(q.free, t)
	queued := new(big.Rat).Mul(new(big.Rat).Sub(start, t), q.rate)
	ceiling := new(big.Rat).Mul(new(big.Rat).Sub(maxTAT, start), q.rate)
	g := minFloor(rat(extra), new(big.Rat).Sub(rat(2*q.Capacity()), queued), ceiling)
	q.free = new(big.Rat).Add(start, new(big.Rat).Quo(rat(g), q.rate))
	return g
}

// Look implements Settler.
func (q *Queue) Look(now, cost int64) ratelimit.Decision {
	c := *q
	return c.Step(now, cost)
}

// charge adds to window j's count up to extra, while what est says is in
// use at now stays at most twice the capacity.
func (m *windows) charge(now uint64, j uint64, extra int64, est func(t uint64) *big.Rat) int64 {
	g := minFloor(rat(extra), new(big.Rat).Sub(rat(2*m.Capacity()), est(now)))
	m.counts[j] += g
	return g
}

func (m *windows) clone() windows {
	c := *m
	c.counts = maps.Clone(m.counts)
	return c
}

// Charge implements Settler: the current window's count.
func (m *FixedWindow) Charge(now, extra int64) int64 {
	t := uint64(now)
	return m.charge(t, t/m.w, extra, func(t uint64) *big.Rat { return m.count(t / m.w) })
}

// Look implements Settler.
func (m *FixedWindow) Look(now, cost int64) ratelimit.Decision {
	c := FixedWindow{m.clone()}
	return c.Step(now, cost)
}

// Charge implements Settler: the current window's count, while the
// estimate is at most twice the limit.
func (m *SlidingCounter) Charge(now, extra int64) int64 {
	t := uint64(now)
	return m.charge(t, t/m.w, extra, m.estimate)
}

// Look implements Settler.
func (m *SlidingCounter) Look(now, cost int64) ratelimit.Decision {
	c := SlidingCounter{m.clone()}
	return c.Step(now, cost)
}

// Charge implements Settler: the current bucket's count, while the
// window's count is at most twice the limit.
func (m *SubWindow) Charge(now, extra int64) int64 {
	t := uint64(now)
	return m.charge(t, t/m.w, extra, m.estimate)
}

// Look implements Settler.
func (m *SubWindow) Look(now, cost int64) ratelimit.Decision {
	c := SubWindow{windows: m.clone(), k: m.k}
	return c.Step(now, cost)
}

// Charge implements Settler: an event of the charge at now, while the
// cost in the window is at most twice the limit.
func (l *Log) Charge(now, extra int64) int64 {
	g := max(min(extra, 2*l.Capacity()-l.inside(now)), 0)
	if g > 0 {
		l.events = append(l.events, logEvent{t: now, cost: g})
	}
	return g
}

// Look implements Settler.
func (l *Log) Look(now, cost int64) ratelimit.Decision {
	c := *l
	c.events = slices.Clone(l.events)
	return c.Step(now, cost)
}
