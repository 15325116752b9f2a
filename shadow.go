package ratelimit

import (
	"context"
	"errors"
	"time"
)

// ShadowReport is what a limit in shadow mode would have decided about one
// request.
type ShadowReport struct {
	// Key is the key the limit was asked about: the key given to a
	// [ShadowKeyed] limiter, a [Composite] layer's own key, or "" for a
	// single-key [Shadow].
	Key string

	// Decision is the limit's own Decision, as if it enforced: Allowed false
	// means it would have denied the request, with this RetryAfter.
	Decision Decision

	// Err is the error the limit would have returned instead, such as
	// [ErrCostExceedsCapacity] for a cost it could never admit; nil
	// otherwise.
	Err error
}

// ShadowFunc receives a shadow limit's report on every request it is asked
// about, admitted or not. It is called on the requesting goroutine, after
// the decision and outside every lock, so it may be called concurrently; it
// should be quick, as the request waits for it.
type ShadowFunc func(ShadowReport)

// Shadow returns a [Limiter] that watches lim without enforcing it, so that a
// new rule can be observed on real traffic before it is trusted to refuse
// any. Every request is asked of lim as usual and then admitted whatever lim
// said; report, if not nil, receives lim's own answer.
//
// The Decision returned is lim's, made into an admission: Allowed is true,
// RetryAfter and Delay are 0 (the request goes on now), and Shadowed reports
// whether lim would have denied it. Limit, Remaining, ResetAfter, Policy and
// Window are lim's. A cost lim could never admit ([ErrCostExceedsCapacity])
// is admitted too, reported with its error and Shadowed set; a cost of zero
// or less is still [ErrInvalidCost], and any other error of lim's (a
// backend that failed) is returned as it is, since it says nothing about
// what lim would have decided.
//
// lim's state evolves exactly as it would if it enforced: it spends on the
// requests it would admit and on no others, so its reports are the
// decisions it would make if it were switched on for the same traffic. Wait
// never waits: it returns as Check does, unless ctx has already ended.
//
// Of the options, Shadow reads [WithObserver] alone: the observer is told
// of each request as admitted or shadow-refused (see [Observer]).
func Shadow(lim Limiter, report ShadowFunc, opts ...Option) Limiter {
	return &shadowLimiter{lim: lim, report: report, obs: buildOptions(opts).obs}
}

// ShadowKeyed is [Shadow] for a keyed limiter such as a [Store]: it admits
// every request, asks lim about it under its key, and reports lim's answer
// with the key. The limiter returned is also a [ContextChecker], which
// asks lim with the caller's context when lim is one, and has lim's
// CheckWithin and Clock where lim has them (see [Store]). A [Composite] can also run single layers in shadow mode
// (see [Layer]). Of the options, ShadowKeyed reads [WithObserver] alone,
// as [Shadow] does.
func ShadowKeyed(lim KeyedLimiter, report ShadowFunc, opts ...Option) KeyedLimiter {
	return &shadowKeyed{lim: lim, report: report, obs: buildOptions(opts).obs}
}

type shadowLimiter struct {
	lim    Limiter
	report ShadowFunc
	obs    Observer
}

func (s *shadowLimiter) Check(cost Units) (Decision, error) {
	d, err := s.lim.Check(cost)
	return shadowed("", d, cost, err, s.report, s.obs)
}

func (s *shadowLimiter) Wait(ctx context.Context, cost Units) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	return s.Check(cost)
}

type shadowKeyed struct {
	lim    KeyedLimiter
	report ShadowFunc
	obs    Observer
}

func (s *shadowKeyed) Check(key string, cost Units) (Decision, error) {
	d, err := s.lim.Check(key, cost)
	return shadowed(key, d, cost, err, s.report, s.obs)
}

// CheckWithin asks lim with maxDelay if lim has CheckWithin (as [Store]
// does), and as Check does otherwise: a shadow limit never holds a request
// back, so only what it reports depends on maxDelay.
func (s *shadowKeyed) CheckWithin(key string, cost Units, maxDelay time.Duration) (Decision, error) {
	w, ok := s.lim.(interface {
		CheckWithin(key string, cost Units, maxDelay time.Duration) (Decision, error)
	})
	if !ok {
		return s.Check(key, cost)
	}
	d, err := w.CheckWithin(key, cost, maxDelay)
	return shadowed(key, d, cost, err, s.report, s.obs)
}

// Clock returns lim's clock if it tells it (as [Store] does), else
// [SystemClock].
func (s *shadowKeyed) Clock() Clock {
	if c, ok := s.lim.(interface{ Clock() Clock }); ok {
		return c.Clock()
	}
	return SystemClock()
}

// CheckContext asks lim with ctx if lim is a [ContextChecker], and as Check
// does otherwise (after returning ctx's error if it has ended).
func (s *shadowKeyed) CheckContext(ctx context.Context, key string, cost Units) (Decision, error) {
	cc, ok := s.lim.(ContextChecker)
	if !ok {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		return s.Check(key, cost)
	}
	d, err := cc.CheckContext(ctx, key, cost)
	return shadowed(key, d, cost, err, s.report, s.obs)
}

// shadowed reports a shadow limit's answer and turns it into an admission.
//
// A cost of zero or less is no rule's to admit, the caller's mistake: its
// error is returned. So is an error that is not about the cost (a backend
// that failed, a context that ended): it says nothing about what the limit
// would have decided, and the caller's policy for failures applies.
func shadowed(key string, d Decision, cost Units, err error, report ShadowFunc, obs Observer) (Decision, error) {
	if err != nil && !errors.Is(err, ErrCostExceedsCapacity) {
		return d, err
	}
	if report != nil {
		report(ShadowReport{Key: key, Decision: d, Err: err})
	}
	deny := err != nil || !d.Allowed
	if obs != nil {
		if deny {
			obs.Decided(d, cost, OutcomeShadowRefused)
		} else {
			obs.Decided(d, cost, OutcomeAllowed)
		}
	}
	return admitShadow(d, deny), nil
}

// admitShadow makes a shadow limit's Decision into an admission.
func admitShadow(d Decision, wouldDeny bool) Decision {
	d.Allowed, d.Shadowed = true, wouldDeny
	d.RetryAfter, d.Delay = 0, 0
	return d
}
