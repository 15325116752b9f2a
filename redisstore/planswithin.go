package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/ratekit/ratelimit"
)

// delays reports whether an admission of the plan may carry a Delay: its
// rule, or an enforced layer's, is a leaky bucket.
func (rp *redisPlan) delays() bool {
	if rp.single != nil {
		return rp.single.alg.delays
	}
	return rp.comp.delays()
}

// CheckWithin is CheckWithinContext with a background context.
func (p *Plans) CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	return p.CheckWithinContext(context.Background(), key, cost, maxDelay)
}

// CheckWithinContext is [Plans.CheckContext] for a request that may wait
// at most maxDelay for its turn, as [ratelimit.Plans.CheckWithin] decides
// it: on a plan with a leaky bucket (its rule, or an enforced layer's), a
// request that would be admitted with a longer Delay is refused, spending
// nothing, as [Store.CheckWithinContext] (a plan of one rule) and
// [Composite.CheckWithinContext] (a plan of layers) refuse it. It is their
// one script call, on the keys of the key's plan, in the script that also
// reads the key's record: the step of every enforced leaky bucket is sent
// the cap and the script commits the request only if it goes on within
// it, and otherwise writes nothing. A key whose record names another plan
// or rule is moved first, as CheckContext moves it (two calls); the move
// stands even if the request is then refused. Every other plan has no
// Delay, and checks as CheckContext does, whatever maxDelay is, but that,
// as in process, a refusal spends nothing even under CountRefused. ctx may
// name the plan (see [ratelimit.ContextWithPlan]). Its errors and the
// failure policy are CheckContext's; a fallback that has CheckWithin is
// asked with maxDelay.
func (p *Plans) CheckWithinContext(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	g := p.gen.Load()
	a, err := p.try(ctx, g, p.plan(ctx, g, key), key, cost, max(maxDelay, 0), checkMode{})
	return a.within(), err
}

// Wait checks cost for key and, while it is refused, sleeps out its
// RetryAfter on the Plans' clock and checks again, as [Store.Wait] does,
// until it is admitted, ctx ends, or the request could not go on before
// ctx's deadline (then it returns the refusal with an error matching
// [ratelimit.ErrWouldExceedDeadline] and [context.DeadlineExceeded] at
// once, spending nothing). As [ratelimit.Plans.Wait], a waiter asleep when
// an Update changes the rules wakes at once and asks again under the new
// rules. Each attempt is a [Plans.CheckContext] but that, as Store.Wait's,
// it goes to Redis, not to the deny cache, and a refusal spends nothing
// even under CountRefused; with a deadline, on a plan with a leaky bucket,
// each attempt is a [Plans.CheckWithinContext] with the time left, so that
// a request whose Delay would outlast the deadline is not spent. An
// admitted leaky-bucket request then waits out its Delay; if ctx ends
// during that, the request stays spent.
func (p *Plans) Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	refused := rp.fill(rp.refused())
	return waitFor(ctx, p.Clock(), refused, func(ctx context.Context, budget time.Duration) (attempt, error) {
		g = p.gen.Load()
		return p.try(ctx, g, p.plan(ctx, g, key), key, cost, budget, checkMode{wait: true})
	}, func() context.Context { return g.done })
}

// try is one attempt of a request of cost for key on its plan rp of g
// that may wait at most budget (maxBudget: any time): a check as mode says
// (of a Wait, or of a CheckWithin), or on a plan whose admissions may
// carry a Delay, with a budget, the check bounded on it (see within). The
// observer is told of the attempt's Decision as CheckWithin reports it.
func (p *Plans) try(ctx context.Context, g *plansGen, rp *redisPlan, key string, cost ratelimit.Units, budget time.Duration, mode checkMode) (attempt, error) {
	if budget == maxBudget || !rp.delays() {
		d, err := p.check(ctx, g, rp, key, cost, mode)
		return checked(d), err
	}
	if err := ctx.Err(); err != nil {
		return attempt{d: rp.fill(rp.refused())}, err
	}
	a, err := p.within(ctx, g, rp, key, cost, budget, mode.out)
	a.d, a.tooSlow = rp.fill(a.d), rp.fill(a.tooSlow)
	err = degradedError(err)
	d := a.within()
	observe(p.r.o.observer, d.Policy, d, cost, err)
	return a, err
}

// within is one attempt of a request of cost for key on its plan rp of g,
// one whose admissions may carry a Delay, that may wait at most budget:
// the plan's check with the bound on the Delay (see checkArgs), which
// commits the request only if it goes on within budget and else writes
// nothing, verified as the plan's Store or Composite verifies its own
// CheckWithin (see Store.verifyWithin). The deny cache is not asked; an
// admission drops the key's refusal from it. out, if not nil, gets every
// enforced layer's Decision appended once the reply is verified.
func (p *Plans) within(ctx context.Context, g *plansGen, rp *redisPlan, key string, cost ratelimit.Units, budget time.Duration, out *[]ratelimit.Decision) (attempt, error) {
	if d, err := rp.costError(cost); err != nil {
		return attempt{d: d}, err
	}
	keys, line, err := p.planKeys(rp, key, cost)
	if err != nil {
		return attempt{d: rp.refused()}, err
	}
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	reply, _, err := p.run(ctx, g, rp, key, keys, line, planOp{kind: rp.kind(), cost: cost, floor: rp.floor(keys[0]), args: func(now string) []any {
		return p.checkArgs(rp, now, cost, false, budget)
	}})
	var ce *callError
	switch {
	case errors.As(err, &ce):
		d, err := p.failed(ctx, rp, key, cost, budget, ce.err)
		return checked(d), err
	case err != nil:
		return attempt{d: rp.refused()}, err
	}
	if rp.single == nil {
		a, reports, err := rp.comp.verifyWithin(key, cost, budget, reply, out)
		if err == nil {
			rp.comp.report(key, reports)
		}
		return a, err
	}
	a, err := rp.single.verifyWithin(key, cost, budget, reply, out)
	if d := rp.deny(); d != nil && err == nil && a.committed {
		d.forget(keys[0])
	}
	return a, err
}

// CheckLayers is [Plans.CheckContext] that also appends to dst the
// Decision of every enforced layer of the key's plan (one, the Decision
// itself, for a plan of one rule), and returns the extended slice, as
// [ratelimit.Plans.CheckLayers] does: each layer as it stands after the
// request, recomputed by the rules' Machines from the states the script
// read, as [Composite.CheckLayers] recomputes them. A layer whose rule has
// no Name reports the plan's name as its Policy, as the combined Decision
// does. It is what httplimit's middleware asks a layered limiter, so that
// its RateLimit fields list every layer of the key's plan. Shadow layers
// are not appended; on an error nothing is appended. ctx may name the
// plan (see [ratelimit.ContextWithPlan]).
//
// As a Check, it is one script call on the keys of the key's plan that
// also reads its record (two for a key that moves), but that, as in
// process, a refusal spends nothing even under CountRefused. maxDelay is
// [Plans.CheckWithinContext]'s cap on a leaky bucket's Delay. A plan with
// no leaky bucket (as its rule, or an enforced layer's) never has a Delay,
// and checks alike whatever maxDelay is. One with a leaky bucket checks,
// for a positive maxDelay, as CheckWithinContext does, and lists the
// layers as [ratelimit.LayeredMachine.StepWithinLayers] recomputes them,
// as Composite.CheckLayers does.
func (p *Plans) CheckLayers(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, dst []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error) {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	out := dst
	if maxDelay > 0 && rp.delays() {
		a, err := p.try(ctx, g, rp, key, cost, maxDelay, checkMode{out: &out})
		if err != nil {
			return a.within(), dst, err
		}
		for i := len(dst); i < len(out); i++ {
			out[i] = rp.fill(out[i])
		}
		return a.within(), out, nil
	}
	d, err := p.check(ctx, g, rp, key, cost, checkMode{out: &out})
	switch {
	case err != nil:
		return d, dst, err
	case rp.single != nil:
		return d, append(dst, d), nil
	}
	for i := len(dst); i < len(out); i++ {
		out[i] = rp.fill(out[i])
	}
	return d, out, nil
}
