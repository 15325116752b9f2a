package redisstore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ratekit/ratelimit"
)

// errWouldExceedDeadline is what Wait returns when it gives up, as in
// process: it matches both [ratelimit.ErrWouldExceedDeadline] and
// [context.DeadlineExceeded].
var errWouldExceedDeadline = fmt.Errorf("%w: %w", ratelimit.ErrWouldExceedDeadline, context.DeadlineExceeded)

// maxBudget is the budget of a check that may wait any time: that of a
// Wait without a deadline.
const maxBudget = time.Duration(math.MaxInt64)

// attempt is one admission attempt of a Wait or a CheckWithin, on a
// Store, a Composite or a Plans: as [ratelimit.Attempt].
type attempt struct {
	d         ratelimit.Decision
	committed bool          // admitted, and its cost spent
	goOn      time.Duration // how long until the request would go on if nothing else arrived
	tooSlow   ratelimit.Decision
}

// checked is the attempt a check without a bound made: it commits every
// admission, and the rule gives no Delay, so a refusal would go on after
// its RetryAfter.
func checked(d ratelimit.Decision) attempt {
	a := attempt{d: d, committed: d.Allowed}
	if !d.Allowed {
		a.goOn = d.RetryAfter
	}
	return a
}

// within is CheckWithin's Decision for an attempt: a request admissible
// but not committed was too slow.
func (a attempt) within() ratelimit.Decision {
	if !a.committed && a.d.Allowed {
		return a.tooSlow
	}
	return a.d
}

// tryFunc makes one attempt for a request that may wait at most budget,
// committing it only if it would go on within budget.
type tryFunc func(ctx context.Context, budget time.Duration) (attempt, error)

// waitFor is Wait for a Store, a Composite and a Plans, as the in-process
// limiters wait: each round makes one attempt (a Store's and a
// Composite's commit only a request that would go on before ctx's
// deadline); after a refusal it sleeps out the RetryAfter on clk and tries
// again. It gives up at once, spending
// nothing, when ctx ends, or when its deadline would come before the
// request could go on (the refusal, with errWouldExceedDeadline). An
// admitted request's Delay is then waited out; if ctx ends during that,
// the request stays spent. An attempt's error ends the wait with it and
// the attempt's Decision. refused is the Decision returned if ctx has
// ended before any attempt. changed, if not nil, returns a context that
// ends when the rules of the latest attempt are replaced: a refusal's
// sleep ends then, and the next attempt asks under the new rules.
func waitFor(ctx context.Context, clk ratelimit.Clock, refused ratelimit.Decision, try tryFunc, changed func() context.Context) (ratelimit.Decision, error) {
	d := refused
	for {
		if err := ctx.Err(); err != nil {
			return d, err
		}
		budget := maxBudget
		if dl, ok := ctx.Deadline(); ok {
			budget = time.Until(dl)
		}
		a, err := try(ctx, budget)
		d = a.d
		if err != nil {
			return d, err
		}
		if a.committed {
			return d, ratelimit.Sleep(ctx, clk, d.Delay)
		}
		d.Allowed, d.Delay = false, 0
		if a.goOn > budget {
			return d, errWouldExceedDeadline
		}
		if err := sleepUnless(ctx, clk, d.RetryAfter, changed); err != nil {
			return d, err
		}
	}
}

// sleepUnless sleeps for d on clk, as [ratelimit.Sleep], but returns nil
// early when the context changed returns (if changed is not nil) ends. The
// error is ctx's.
func sleepUnless(ctx context.Context, clk ratelimit.Clock, d time.Duration, changed func() context.Context) error {
	if changed == nil {
		return ratelimit.Sleep(ctx, clk, d)
	}
	sleep, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(changed(), cancel)
	err := ratelimit.Sleep(sleep, clk, d)
	stop()
	cancel()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// Wait checks cost for key and, while it is denied, sleeps out its
// RetryAfter on the store's clock and checks again, until it is admitted,
// ctx ends, or the request could not go on before ctx's deadline (then it
// returns the denial with an error matching
// [ratelimit.ErrWouldExceedDeadline] and [context.DeadlineExceeded] at
// once, without sleeping, and spends nothing), as [ratelimit.Store.Wait]
// does. An admitted leaky-bucket request then waits out its Delay; if ctx
// ends during that, the request stays spent.
//
// Every check it makes is a [Store.CheckContext], errors included, except
// that: as in process, a refusal spends nothing even for a rule with
// CountRefused, and is reported on the key as it stands
// ([ratelimit.Machine.Look]); the deny cache is not asked (its refusals
// may report a longer RetryAfter than Redis's, which would make the wait
// longer than it need be, or give up on a deadline it could meet); and on
// a leaky bucket, whose Delay must fit the deadline before anything is
// spent, a Wait with a deadline checks as [Store.CheckWithinContext] does
// with the time left.
func (s *Store) Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return waitFor(ctx, s.Clock(), s.refused(), func(ctx context.Context, budget time.Duration) (attempt, error) {
		if !s.alg.delays || budget == maxBudget {
			d, err := s.checkContext(ctx, key, cost, true)
			return checked(d), err
		}
		return s.tryWithin(ctx, key, cost, budget)
	}, nil)
}

// CheckWithin is CheckWithinContext with a background context.
func (s *Store) CheckWithin(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	return s.CheckWithinContext(context.Background(), key, cost, maxDelay)
}

// CheckWithinContext is [Store.CheckContext] for a request that may wait
// at most maxDelay for its turn, as [ratelimit.Store.CheckWithin] decides
// it: a leaky bucket's request that would be admitted with a longer Delay
// is refused, spending nothing, with a RetryAfter after which its queue
// has drained enough. Every other rule has no Delay, and checks as
// CheckContext does, whatever maxDelay is, but that, as in process, a
// refusal spends nothing even for a rule with CountRefused.
//
// On a leaky bucket it is one script call, one round trip, as CheckContext
// is, atomic with the key's other checks, so that it never conflicts with
// them however hot the key: the check's script is sent the cap and admits
// the request only if its Delay fits it, and for a request it does not
// admit writes nothing. The Decision is computed in Go by the rule's
// [ratelimit.LayeredMachine] (StepWithin) from the state and the instant
// the script read, and the script must have done what it computes (else
// the request is refused with [ErrMismatch]). The deny cache is not asked;
// an admission drops the key's refusal from it. Its errors, and the
// failure policy, are CheckContext's; a fallback that has CheckWithin is
// asked with maxDelay.
func (s *Store) CheckWithinContext(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, error) {
	if !s.alg.delays {
		// As in process, a refusal spends nothing even under CountRefused
		// (which has no deny cache: Wait's checks are those).
		return s.checkContext(ctx, key, cost, s.p.CountRefused)
	}
	a, err := s.tryWithin(ctx, key, cost, max(maxDelay, 0))
	return a.within(), err
}
