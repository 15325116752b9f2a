package redisstore

import (
	"context"
	"time"

	"github.com/ratekit/ratelimit"
)

// Peek is PeekContext with a background context.
func (l *Leased) Peek(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return l.PeekContext(context.Background(), key, cost)
}

// PeekContext returns the Decision a check of cost for key would get now
// from the key's live lease, spending nothing, when the lease can admit
// it; else [Store.PeekContext]'s, which reads Redis, where the live
// leases' allowance counts as spent (a check there could take a lease on
// the way, which a peek never does). Errors are the Store's.
func (l *Leased) PeekContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	if e := l.live(key); e != nil && cost > 0 {
		if ls := e.cur.Load(); ls != nil {
			if d, ok := l.fits(ls, int64(cost)); ok {
				return d, nil
			}
		}
	}
	return l.s.PeekContext(ctx, key, cost)
}

// fits is admit without spending: the Decision ls would give c now.
func (l *Leased) fits(ls *lease, c int64) (ratelimit.Decision, bool) {
	t := l.instant(ls)
	u := ls.used.Load()
	if t > ls.end || u+c > ls.k || l.meter && t > ls.at && !l.covers(ls, u+c, t) {
		return ratelimit.Decision{}, false
	}
	return l.decision(ls, u+c, t), true
}

// live returns key's entry if it has one, adding none.
func (l *Leased) live(key string) *leaseKey {
	if v, ok := l.keys.Load(key); ok {
		return v.(*leaseKey)
	}
	return nil
}

// Refund is RefundContext with a background context.
func (l *Leased) Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	return l.RefundContext(context.Background(), key, cost, at)
}

// RefundContext gives back up to cost of what key was admitted at the
// instant at (the admitting Decision's At). A request admitted from the
// key's live lease (at is the instant Redis spent the lease) gives back
// to the lease, with no round trip: up to what the lease has admitted, it
// counts as never admitted there, so the lease admits it again or gives it
// back to Redis when it ends. Any other request, and one whose lease has
// ended, is refunded in Redis as [Store.RefundContext] refunds it, with
// its errors.
func (l *Leased) RefundContext(ctx context.Context, key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	if cost > 0 {
		if g, ok := l.unuse(key, int64(cost), at); ok {
			return ratelimit.Units(g), nil
		}
	}
	return l.s.RefundContext(ctx, key, cost, at)
}

// unuse gives back up to c to key's live lease if it was spent at at,
// and reports whether it was.
func (l *Leased) unuse(key string, c int64, at time.Duration) (int64, bool) {
	e := l.live(key)
	if e == nil {
		return 0, false
	}
	ls := e.cur.Load()
	if ls == nil || ls.at != int64(at) {
		return 0, false
	}
	for {
		u := ls.used.Load()
		if u > ls.k {
			return 0, false // ended: its rest has gone back to Redis
		}
		g := min(c, u)
		if ls.used.CompareAndSwap(u, u-g) {
			return g, true
		}
	}
}

// Settle is SettleContext with a background context.
func (l *Leased) Settle(key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	return l.SettleContext(context.Background(), key, charged, actual, at)
}

// SettleContext settles a request admitted for key at the instant at that
// was charged charged and turned out to cost actual. For a request
// admitted from the key's live lease, a cost below charged is given back
// to the lease (as [Leased.RefundContext] does) and one above it is
// charged to the lease when the lease can admit the difference now, with
// no round trip; the Decision is then [Leased.PeekContext]'s for charged.
// Otherwise it is settled in Redis as [Store.SettleContext] settles it,
// with its Decision, debt and errors.
func (l *Leased) SettleContext(ctx context.Context, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	if charged <= 0 || charged > l.s.p.Capacity || actual <= 0 {
		return l.s.SettleContext(ctx, key, charged, actual, at)
	}
	settled := ratelimit.Units(-1)
	switch {
	case actual < charged:
		if g, ok := l.unuse(key, int64(charged-actual), at); ok {
			settled = charged - ratelimit.Units(g)
		}
	case actual > charged:
		if l.overuse(key, int64(actual-charged), at) {
			settled = actual
		}
	default:
		if e := l.live(key); e != nil {
			if ls := e.cur.Load(); ls != nil && ls.at == int64(at) {
				settled = charged
			}
		}
	}
	if settled < 0 {
		return l.s.SettleContext(ctx, key, charged, actual, at)
	}
	d, err := l.PeekContext(ctx, key, charged)
	return d, settled, err
}

// overuse spends x more from key's live lease if it was spent at at and
// can admit x now, and reports whether it did.
func (l *Leased) overuse(key string, x int64, at time.Duration) bool {
	e := l.live(key)
	if e == nil {
		return false
	}
	ls := e.cur.Load()
	if ls == nil || ls.at != int64(at) {
		return false
	}
	_, ok := l.admit(ls, x)
	return ok
}
