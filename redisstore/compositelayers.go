package redisstore

import (
	"context"
	"time"

	"github.com/ratekit/ratelimit"
)

// CheckLayers is [Composite.CheckContext] that also appends to dst, in
// layer order, the Decision of every enforced layer, and returns the
// extended slice, as [ratelimit.Composite.CheckLayers] does: each layer as
// it stands after the request, recomputed by the rules' Machines from the
// states the script read. It is what httplimit's middleware asks a
// layered limiter, so that its RateLimit fields list every layer. Shadow
// layers are not appended; on an error nothing is appended.
//
// maxDelay is [ratelimit.Composite.CheckWithin]'s cap on a leaky bucket's
// Delay. A composite with no enforced leaky bucket never has a Delay, and
// checks alike whatever maxDelay is. One with a leaky bucket checks, for
// a positive maxDelay, as [Composite.CheckWithinContext] does, and lists
// the layers as [ratelimit.LayeredMachine.StepWithinLayers] recomputes
// them. A refusal the deny cache answers appends nothing (the caller then
// describes the combined Decision alone).
func (c *Composite) CheckLayers(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, dst []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error) {
	if maxDelay > 0 && c.delays() {
		if err := ctx.Err(); err != nil {
			return c.refused(), dst, err
		}
		out := dst
		a, err := c.tryWithin(ctx, key, cost, maxDelay, &out)
		if err != nil {
			return a.within(), dst, err
		}
		return a.within(), out, nil
	}
	if err := ctx.Err(); err != nil {
		return c.refused(), dst, err
	}
	out := dst
	d, shadow, err := c.check(ctx, key, cost, &out, false)
	c.observe(d, shadow, cost, err)
	if err != nil {
		return d, dst, err
	}
	return d, out, nil
}

// delays reports whether an enforced layer's algorithm (a leaky bucket)
// may give an admission a Delay.
func (c *Composite) delays() bool {
	for i := range c.layers {
		if !c.layers[i].Shadow && c.layers[i].alg.delays {
			return true
		}
	}
	return false
}
