// Package refmodel holds plain reference models of the seven algorithms,
// written from their definitions with math/big rationals (or, for the
// sliding log, a list of every admitted event). They are slow and obviously
// right; the tests check that the real limiters agree with them field by
// field on every trace.
//
// A model sees time already clamped by its caller (it never goes backwards)
// and costs in milli-units.
package refmodel

import (
	"math/big"
	"time"

	"github.com/ratekit/ratelimit"
)

// Model is a reference limiter for one key.
type Model interface {
	// Step decides cost milli-units at now ns (now never decreases).
	Step(now, cost int64) ratelimit.Decision
	// Capacity is the largest admissible cost in milli-units.
	Capacity() int64
}

func rat(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

// floorInt returns floor(x) for a rational x.
func floorInt(x *big.Rat) int64 {
	q := new(big.Int)
	m := new(big.Int)
	q.DivMod(x.Num(), x.Denom(), m) // Euclidean: floor for positive denominators
	return q.Int64()
}

// ceilInt returns ceil(x) for a rational x.
func ceilInt(x *big.Rat) int64 {
	return -floorInt(new(big.Rat).Neg(x))
}

func maxRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

// units returns floor(x/1000): whole units of a milli-unit amount.
func units(x *big.Rat) int64 { return floorInt(new(big.Rat).Quo(x, rat(1000))) }

func dur(x *big.Rat) time.Duration { return time.Duration(ceilInt(x)) }

// rate returns r in milli-units per nanosecond.
func rate(r ratelimit.Rate) *big.Rat {
	return new(big.Rat).SetFrac(big.NewInt(r.Count*1000), big.NewInt(int64(r.Per)))
}

// Bucket is the token bucket from its definition: tokens = min(Burst,
// tokens + elapsed x rate); admit iff tokens >= cost.
type Bucket struct {
	rate   *big.Rat
	burst  *big.Rat
	limit  int64
	tokens *big.Rat
	last   int64
}

// NewBucket returns a full bucket.
func NewBucket(r ratelimit.Rate, burst int64) *Bucket {
	b := rat(burst * 1000)
	return &Bucket{rate: rate(r), burst: b, limit: burst, tokens: new(big.Rat).Set(b)}
}

// Capacity implements Model.
func (b *Bucket) Capacity() int64 { return b.limit * 1000 }

// Step implements Model.
func (b *Bucket) Step(now, cost int64) ratelimit.Decision {
	earned := new(big.Rat).Mul(rat(now-b.last), b.rate)
	tokens := new(big.Rat).Add(b.tokens, earned)
	if tokens.Cmp(b.burst) > 0 {
		tokens.Set(b.burst)
	}
	d := ratelimit.Decision{Limit: b.limit, At: time.Duration(now)}
	c := rat(cost)
	if tokens.Cmp(c) >= 0 {
		d.Allowed = true
		tokens.Sub(tokens, c)
		b.tokens, b.last = tokens, now
	} else {
		// smallest d with tokens + d*rate >= cost
		need := new(big.Rat).Sub(c, tokens)
		d.RetryAfter = dur(need.Quo(need, b.rate))
	}
	d.Remaining = max(units(tokens), 0) // none in debt
	missing := new(big.Rat).Sub(b.burst, tokens)
	d.ResetAfter = dur(missing.Quo(missing, b.rate))
	return d
}

// Queue is the leaky bucket as a queue from its definition: queued =
// max(0, free - now) x rate; admit iff queued + cost <= Capacity; the request
// goes on at max(now, free), and free moves on by cost/rate.
type Queue struct {
	rate     *big.Rat
	capacity *big.Rat
	limit    int64
	free     *big.Rat
	delay    *big.Rat // milli-units queued ahead a request need not wait for
}

// NewQueue returns an empty queue.
func NewQueue(r ratelimit.Rate, capacity int64) *Queue {
	return &Queue{rate: rate(r), capacity: rat(capacity * 1000), limit: capacity, free: rat(0), delay: rat(0)}
}

// WithDelay gives the queue LeakyBucket's Delay option, in whole units: an
// admitted request waits only for the queued work beyond delay, and returns
// the queue.
func (q *Queue) WithDelay(delay int64) *Queue {
	q.delay = rat(delay * 1000)
	return q
}

// Capacity implements Model.
func (q *Queue) Capacity() int64 { return q.limit * 1000 }

// Step implements Model.
func (q *Queue) Step(now, cost int64) ratelimit.Decision {
	t := rat(now)
	start := maxRat(q.free, t)
	ahead := new(big.Rat).Sub(start, t)
	queued := new(big.Rat).Mul(ahead, q.rate)
	d := ratelimit.Decision{Limit: q.limit, At: time.Duration(now)}
	c := rat(cost)
	if new(big.Rat).Add(queued, c).Cmp(q.capacity) <= 0 {
		d.Allowed = true
		// Wait for the queued work beyond delay: (queued - delay)/rate.
		if beyond := new(big.Rat).Sub(queued, q.delay); beyond.Sign() > 0 {
			d.Delay = dur(beyond.Quo(beyond, q.rate))
		}
		q.free = new(big.Rat).Add(start, new(big.Rat).Quo(c, q.rate))
		queued.Add(queued, c)
	} else {
		// smallest d with (queued - d*rate) + cost <= capacity
		over := new(big.Rat).Sub(new(big.Rat).Add(queued, c), q.capacity)
		d.RetryAfter = dur(over.Quo(over, q.rate))
	}
	d.Remaining = max(units(new(big.Rat).Sub(q.capacity, queued)), 0) // none in debt
	d.ResetAfter = dur(new(big.Rat).Quo(queued, q.rate))
	return d
}
