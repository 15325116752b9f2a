package ratelimit

import (
	"context"
	"time"
)

// CheckLayers is [Composite.CheckContext], or [Composite.CheckWithin] when
// maxDelay is positive, that also appends to dst, in layer order, the
// Decision of every enforced layer, and returns the extended slice: what a
// caller needs to describe every limit a request is subject to, as the
// HTTP RateLimit fields do, rather than the most constraining one alone.
// Shadow layers are not appended.
//
// Each layer's Decision describes the layer as it stands after the
// request: its Limit, Window and Policy, its own Remaining and ResetAfter,
// and its own answer (Allowed, RetryAfter). A layer that the request was
// spent in gives the Decision of that spending; a layer that was not spent
// in (the request was refused, by it or by another layer) gives its state
// as it was, nothing having been spent. The combined Decision and the
// error are the ones CheckContext or CheckWithin would return; on an error
// nothing is appended.
//
// dst may be nil; a caller that checks often lends a slice with room for
// its layers, so that nothing is allocated.
func (c *Composite) CheckLayers(ctx context.Context, key string, cost Units, maxDelay time.Duration, dst []Decision) (Decision, []Decision, error) {
	if err := ctx.Err(); err != nil {
		d, _ := c.checkCost(Unit)
		return d, dst, err
	}
	if d, err := c.checkCost(cost); err != nil {
		return d, dst, err
	}
	a := tryLayersOut(c.layers, c.enforced, c.clock, key, int64(cost), layerBudget(maxDelay), &dst)
	if maxDelay > 0 && a.err == nil && !a.committed && a.d.Allowed {
		a.d = a.tooSlow
	}
	if c.obs != nil {
		observe(c.obs, &a, int64(cost))
	}
	return a.d, dst, a.err
}

// CheckLayers is [Plans.CheckContext], or [Plans.CheckWithin] when maxDelay
// is positive, that also appends to dst the Decision of every enforced
// layer of the key's plan (one, for a plan of one rule), as
// [Composite.CheckLayers] does. A layer whose rule has no Name reports the
// plan's name as its Policy, as the combined Decision does.
func (p *Plans) CheckLayers(ctx context.Context, key string, cost Units, maxDelay time.Duration, dst []Decision) (Decision, []Decision, error) {
	if err := ctx.Err(); err != nil {
		d, err := p.CheckContext(ctx, key, cost)
		return d, dst, err
	}
	a, err := p.tryOut(ctx, key, cost, layerBudget(maxDelay), &dst, false, planPick{})
	if err != nil {
		return a.d, dst, err
	}
	if maxDelay > 0 && a.err == nil && !a.committed && a.d.Allowed {
		a.d = a.tooSlow
	}
	if p.obs != nil {
		observe(p.obs, &a, int64(cost))
	}
	return a.d, dst, a.err
}

// layerBudget is the budget of an attempt that may wait at most maxDelay,
// no limit for maxDelay <= 0.
func layerBudget(maxDelay time.Duration) time.Duration {
	if maxDelay > 0 {
		return maxDelay
	}
	return maxBudget
}

// appendLayers appends to dst the Decision of every enforced layer that
// took part in an attempt decided at now, with its shard still locked: the
// Decision it was spent with if the attempt committed, and otherwise (the
// layer refused, or admitted a request that another layer refused or that
// waited too long) its state as it stands, nothing spent, which its own
// look describes only when it refused. A layer that admits its whole
// capacity is fresh: Remaining its Limit, ResetAfter 0.
func appendLayers(layers []compositeLayer, turns []layerTurn, now int64, committed bool, dst []Decision) []Decision {
	for i := range turns {
		l, t := &layers[i], &turns[i]
		if l.shadow || t.err != nil {
			continue
		}
		d := t.d
		if d.Allowed && !committed {
			d.Delay = 0
			if full := l.store.stepAt(t.k, now, l.store.capacity(), stepLook); full.Allowed {
				d.Remaining, d.ResetAfter = full.Limit, 0
			} else {
				d.Remaining, d.ResetAfter = full.Remaining, full.ResetAfter
			}
		}
		dst = append(dst, d)
	}
	return dst
}
