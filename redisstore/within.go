package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/ratekit/ratelimit"
)

// stepWithin decides, with lm, one attempt of a request of cost that may
// wait at most budget, on the states Redis read at now, as the in-process
// limiters decide each attempt of Wait and CheckWithin. It returns the
// attempt, the states to write (those read where nothing changes) and,
// for each state that changes, its expiry in ms: until the state is as
// good as a fresh key's, plus marginMs.
func stepWithin(lm *ratelimit.LayeredMachine, states [][]byte, now time.Duration, cost ratelimit.Units, budget time.Duration, marginMs int64) (attempt, [][]byte, []int64, []ratelimit.ShadowReport, error) {
	w, next, reports, err := lm.StepWithin(states, now, cost, budget)
	a := attempt{d: w.Decision, committed: w.Committed, goOn: w.GoOn, tooSlow: w.TooSlow}
	if err != nil || !a.committed {
		return a, states, nil, reports, err
	}
	px := make([]int64, len(next))
	for i := range next {
		if string(next[i]) == string(states[i]) {
			continue
		}
		// A look of one unit (within every capacity) reports when the
		// state is fresh again: its own ResetAfter if it refuses, and if
		// it admits one counting that unit, so never earlier.
		d, _, err := lm.Machine(i).Step(next[i], a.d.At, ratelimit.Unit, false)
		if err != nil {
			return a, states, nil, reports, err
		}
		px[i] = expiryMs(d.ResetAfter, marginMs)
	}
	return a, next, px, reports, nil
}

// tryWithin is one attempt of a request of cost for key that may wait at
// most budget, on a leaky bucket: the key's state read, the attempt
// decided in Go, and the new state written only if the key still holds
// the state read (see Store.update). The observer is told of the
// attempt's Decision as CheckWithin reports it.
func (s *Store) tryWithin(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, error) {
	a, err := s.within(ctx, key, cost, budget)
	err = degradedError(err)
	s.observe(a.within(), cost, err)
	return a, err
}

// within is tryWithin without the observer, its errors unmarked.
func (s *Store) within(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, error) {
	if cost <= 0 || cost > s.p.Capacity {
		d, _, err := s.m.Step(nil, 0, cost, false)
		return attempt{d: d}, err
	}
	rk := s.Key(key)
	ctx, cancel := s.bound(ctx, time.Now())
	defer cancel()
	var a attempt
	_, err := s.update(ctx, key, rk, func(state []byte, now time.Duration) ([]byte, int64, error) {
		var next [][]byte
		var px []int64
		var err error
		a, next, px, _, err = stepWithin(s.layered, [][]byte{state}, now, cost, budget, s.marginMs)
		if err != nil || !a.committed {
			return state, 0, err
		}
		return next[0], px[0], nil
	})
	switch {
	case err == nil:
		if a.committed && s.deny != nil {
			s.deny.forget(rk)
		}
		return a, nil
	case errors.Is(err, ErrUnavailable):
		s.failed(err)
		d, err := s.degradedWithin(ctx, key, cost, budget, err)
		return checked(d), err
	}
	return attempt{d: s.refused()}, err
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
		return c.tryWithin(ctx, key, cost, budget)
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
// With a leaky bucket layer it reads every layer's state, decides in Go
// with the layers' [ratelimit.LayeredMachine], and writes the new states
// together only if every layer's key still holds what was read, as
// [Store.CheckWithinContext] does, with its [ErrConflict] (nothing spent
// in any layer), and without the deny cache. Shadow layers are told as
// CheckContext tells them; the failure policy is CheckContext's, a
// fallback that has CheckWithin being asked with maxDelay.
func (c *Composite) CheckWithinContext(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	if !c.delays() {
		return c.CheckContext(ctx, key, cost)
	}
	a, err := c.tryWithin(ctx, key, cost, max(maxDelay, 0))
	return a.within(), err
}

// tryWithin is one attempt of a request of cost for key that may wait at
// most budget, decided in Go and written with a compare-and-set over the
// layers' keys (see Composite.update), reported to the shadow layers and
// to the observer as CheckWithin reports it.
func (c *Composite) tryWithin(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, error) {
	a, reports, err := c.within(ctx, key, cost, budget)
	err = degradedError(err)
	var shadow ratelimit.Decision
	if err == nil {
		shadow = c.report(key, reports)
	}
	c.observe(a.within(), shadow, cost, err)
	return a, err
}

// within is tryWithin without the reports, its errors unmarked.
func (c *Composite) within(ctx context.Context, key string, cost ratelimit.Units, budget time.Duration) (attempt, []ratelimit.ShadowReport, error) {
	if d, _, _, err := c.lm.Step(make([][]byte, c.lm.Len()), 0, cost, false); err != nil {
		return attempt{d: d}, nil, err
	}
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	var a attempt
	var reports []ratelimit.ShadowReport
	err := c.update(ctx, key, func(states [][]byte, now time.Duration) ([][]byte, []int64, error) {
		var next [][]byte
		var px []int64
		var err error
		a, next, px, reports, err = stepWithin(c.lm, states, now, cost, budget, c.marginMs)
		return next, px, err
	})
	switch {
	case err == nil:
		return a, reports, nil
	case errors.Is(err, ErrUnavailable):
		c.failed(err)
		d, err := c.degraded(ctx, key, cost, budget, err)
		return checked(d), nil, err
	}
	return attempt{d: c.refused()}, nil, err
}
