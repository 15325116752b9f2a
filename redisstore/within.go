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
		s.failures.Add(1)
		if errors.Is(err, ErrCircuitOpen) {
			s.circuitRefusals.Add(1)
		}
		d, err := s.degradedWithin(ctx, key, cost, budget, err)
		return checked(d), err
	}
	return attempt{d: s.refused()}, err
}
