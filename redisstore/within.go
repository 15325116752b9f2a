package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratekit/ratelimit"
)

// stepWithin is lm's StepWithin on states at the instant at, or, if out is
// not nil, its StepWithinLayers, whose layers (appended to *out's) it
// returns for the caller to keep once the reply is verified.
func stepWithin(lm *ratelimit.LayeredMachine, states [][]byte, at int64, cost ratelimit.Units, budget time.Duration, out *[]ratelimit.Decision) (ratelimit.Attempt, [][]byte, []ratelimit.ShadowReport, []ratelimit.Decision, error) {
	if out == nil {
		w, next, reports, err := lm.StepWithin(states, time.Duration(at), cost, budget)
		return w, next, reports, nil, err
	}
	return lm.StepWithinLayers(states, time.Duration(at), cost, budget, *out)
}

// fromAttempt is the attempt a LayeredMachine's StepWithin made.
func fromAttempt(w ratelimit.Attempt) attempt {
	return attempt{d: w.Decision, committed: w.Committed, goOn: w.GoOn, tooSlow: w.TooSlow}
}

// tryWithin is one attempt of a request of cost for key that may wait at
// most budget, on a leaky bucket: one script call that admits the request
// only if its Delay is at most budget (see Store.within). The observer is
// told of the attempt's Decision as CheckWithin reports it.
func (s *Store) tryWithin(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, error) {
	a, err := s.within(ctx, key, cost, budget)
	err = degradedError(err)
	s.observe(a.within(), cost, err)
	return a, err
}

// within is tryWithin without the observer, its errors unmarked: the check
// script, sent the bound on the Delay (see appendBound), admits and writes
// the request only if it would go on within budget, and else writes
// nothing; the attempt is then the rule's StepWithin on the state and at
// the instant the script read, which must have made the same choice and
// written the same state. The deny cache is not asked; an admission drops
// the key's refusal from it.
func (s *Store) within(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, error) {
	if cost <= 0 || cost > s.p.Capacity {
		d, _, err := s.m.Step(nil, 0, cost, false)
		return attempt{d: d}, err
	}
	rk := s.Key(key)
	now := time.Now()
	ctx, cancel := s.bound(ctx, now)
	defer cancel()
	reply, err := s.call(ctx, key, rk, now, s.withinArgs(cost, s.floor(rk), budget))
	switch {
	case errors.Is(err, ErrUnavailable):
		d, err := s.degradedWithin(ctx, key, cost, budget, err)
		return checked(d), err
	case err != nil:
		return attempt{d: s.refused()}, err
	}
	a, err := s.verifyWithin(key, cost, budget, reply, nil)
	if err == nil && a.committed && s.deny != nil {
		s.deny.forget(rk)
	}
	return a, err
}

// verifyWithin is verify for a check bounded on its Delay by budget: the
// attempt is the rule's StepWithin on the old state at the instant the
// script read, and the script must have made the same choice (1 for a
// commit, 2 for an admission too slow, 0 for a refusal) and written the
// state StepWithin computes, or nothing if it did not commit. out, if not
// nil, gets the rule's Decision as a layer's appended once all is verified
// (see ratelimit.LayeredMachine.StepWithinLayers).
func (s *Store) verifyWithin(key string, cost ratelimit.Units, budget time.Duration, reply []any, out *[]ratelimit.Decision) (attempt, error) {
	old, at, written, admitted, err := s.parseStep(reply)
	if err != nil {
		return attempt{d: s.refused()}, err
	}
	w, next, _, layers, err := stepWithin(s.layered, [][]byte{[]byte(old)}, at, cost, budget, out)
	if err != nil {
		if errors.Is(err, ratelimit.ErrInvalidState) {
			s.invalid.Add(1)
		}
		return attempt{d: s.refused()}, fmt.Errorf("key %q: %w", clipKey(key), err)
	}
	want, code := string(next[0]), int64(1)
	if !w.Committed {
		want, code = "", 0
		if w.Decision.Allowed {
			code = 2
		}
	}
	if written != want || admitted != code {
		s.mismatches.Add(1)
		return attempt{d: s.refused()}, fmt.Errorf("%w: key %q at %d: script wrote %q (%d), machine %q (%d)", ErrMismatch, clipKey(key), at, clipKey(written), admitted, clipKey(want), code)
	}
	if out != nil {
		*out = layers
	}
	return fromAttempt(w), nil
}

// Clock returns the clock Wait sleeps on: the client clock given with
// [WithClock], or Unix time when the server's clock decides.
func (c *Composite) Clock() ratelimit.Clock {
	if c.clock == nil {
		return UnixClock()
	}
	return c.clock
}

// Wait checks cost for key on every layer and, while it is denied, sleeps
// out its RetryAfter on the composite's clock and checks again, as
// [ratelimit.Composite.Wait] does and as [Store.Wait] does for one limit:
// until it is admitted, ctx ends, or the request could not go on before
// ctx's deadline (then it returns the denial at once, spending nothing in
// any layer, with an error matching [ratelimit.ErrWouldExceedDeadline] and
// [context.DeadlineExceeded]). A leaky bucket layer's Delay is then waited
// out; if ctx ends during that, the request stays spent.
//
// Each check is a [Composite.CheckContext], errors and observer included,
// but that the deny cache is not asked (see [Store.Wait]), and that with
// an enforced leaky bucket layer and a deadline, each checks as
// [Composite.CheckWithinContext] does with the time left.
func (c *Composite) Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	delays := c.delays()
	return waitFor(ctx, c.Clock(), c.refused(), func(ctx context.Context, budget time.Duration) (attempt, error) {
		if !delays || budget == maxBudget {
			d, shadow, err := c.check(ctx, key, cost, nil, true)
			c.observe(d, shadow, cost, err)
			return checked(d), err
		}
		return c.tryWithin(ctx, key, cost, budget, nil)
	}, nil)
}

// CheckWithin is CheckWithinContext with a background context.
func (c *Composite) CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	return c.CheckWithinContext(context.Background(), key, cost, maxDelay)
}

// CheckWithinContext is [Composite.CheckContext] for a request that may
// wait at most maxDelay for its turn, as [ratelimit.Composite.CheckWithin]
// decides it: a request that every enforced layer admits but with a Delay
// (a leaky bucket layer's) longer than maxDelay is refused, spending
// nothing in any layer, and described by the layer whose Delay is the
// longest. A composite with no enforced leaky bucket has no Delay and
// checks as CheckContext does, whatever maxDelay is.
//
// With a leaky bucket layer it is one script call over every layer's key,
// as CheckContext is, atomic with the checks around it, so that it never
// conflicts with them however hot the key: each enforced leaky bucket
// layer's step is sent the cap, and the script commits the request in
// every layer only if each admits it within the cap, and else writes
// nothing in any layer. The Decision is computed in Go by the layers'
// [ratelimit.LayeredMachine] from the states and the instant the script
// read, and the script must have done what it computes (else the request
// is refused with [ErrMismatch]), as [Store.CheckWithinContext] does. The
// deny cache is not asked. Shadow layers are told as CheckContext tells
// them; the failure policy is CheckContext's, a fallback that has
// CheckWithin being asked with maxDelay.
func (c *Composite) CheckWithinContext(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	if !c.delays() {
		return c.CheckContext(ctx, key, cost)
	}
	a, err := c.tryWithin(ctx, key, cost, max(maxDelay, 0), nil)
	return a.within(), err
}

// tryWithin is one attempt of a request of cost for key that may wait at
// most budget, in one script over the layers' keys (see Composite.within),
// reported to the shadow layers and to the observer as CheckWithin reports
// it; out, if not nil, gets every enforced layer's Decision appended (see
// Composite.CheckLayers).
func (c *Composite) tryWithin(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration, out *[]ratelimit.Decision) (attempt, error) {
	a, reports, err := c.within(ctx, key, cost, budget, out)
	err = degradedError(err)
	var shadow ratelimit.Decision
	if err == nil {
		shadow = c.report(key, reports)
	}
	c.observe(a.within(), shadow, cost, err)
	return a, err
}

// within is tryWithin without the reports, its errors unmarked: the
// layers' script, with the bound on the Delay sent to every enforced leaky
// bucket layer (see appendBound), commits the request in every layer only
// if each admits it within budget, and else writes nothing; the attempt is
// the layers' StepWithin on the states and at the instant the script read,
// which must have made the same choice and written the same states.
func (c *Composite) within(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration, out *[]ratelimit.Decision) (attempt, []ratelimit.ShadowReport, error) {
	if d, _, _, err := c.lm.Step(make([][]byte, c.lm.Len()), 0, cost, false); err != nil {
		return attempt{d: d}, nil, err
	}
	keys, err := c.keys(key, cost)
	if err != nil {
		return attempt{d: c.refused()}, nil, err
	}
	args := c.boundedArgs(c.reading(), cost, true, budget)
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	reply, err := c.run(ctx, key, c.script, keys, args)
	switch {
	case errors.Is(err, ErrUnavailable):
		c.failed(err)
		d, err := c.degraded(ctx, key, cost, budget, err)
		return checked(d), nil, err
	case err != nil:
		return attempt{d: c.refused()}, nil, err
	}
	return c.verifyWithin(key, cost, budget, reply, out)
}

// verifyWithin is verify for a request bounded on its Delay by budget: the
// attempt is the layers' StepWithin, and the script must have committed
// exactly when it does, writing the states it computes. out, if not nil,
// gets the enforced layers' Decisions appended once all is verified.
func (c *Composite) verifyWithin(key string, cost ratelimit.Units, budget time.Duration, reply []any, out *[]ratelimit.Decision) (attempt, []ratelimit.ShadowReport, error) {
	refused := attempt{d: c.refused()}
	at, admitted, old, written, err := c.parse(reply)
	if err != nil {
		return refused, nil, err
	}
	w, next, reports, layers, err := stepWithin(c.lm, old, at, cost, budget, out)
	if err != nil {
		if errors.Is(err, ratelimit.ErrInvalidState) {
			c.invalid.Add(1)
		}
		return refused, nil, fmt.Errorf("key %q: %w", clipKey(key), err)
	}
	if w.Committed != (admitted == 1) {
		c.mismatches.Add(1)
		return refused, nil, fmt.Errorf("%w: key %q at %d: script admitted %d, machine committed %v", ErrMismatch, clipKey(key), at, admitted, w.Committed)
	}
	if err := c.sameWritten(key, at, old, next, written); err != nil {
		return refused, nil, err
	}
	if out != nil {
		*out = layers
	}
	return fromAttempt(w), reports, nil
}
