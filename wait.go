package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrWouldExceedDeadline is returned by Wait when the context's deadline
// would come before the request could go on: Wait gives up at once instead
// of sleeping towards a deadline it cannot meet, and spends nothing. The
// error Wait returns also matches [context.DeadlineExceeded], so code that
// treats every missed deadline alike needs no special case.
var ErrWouldExceedDeadline = errors.New("ratelimit: wait would outlast the context's deadline")

// errWouldExceedDeadline is what Wait returns: both sentinels in one error.
var errWouldExceedDeadline = fmt.Errorf("%w: %w", ErrWouldExceedDeadline, context.DeadlineExceeded)

// How Wait works, for every limiter in this package.
//
// Each round makes one attempt at the limiter's current time, under the
// limiter's lock (or compare-and-swap): it looks at what the request would
// get, and commits only a request that is admitted and would go on before
// the context's deadline. A denied request spends nothing, so a waiter that
// gives up between rounds leaves no trace. After a denial the waiter sleeps
// until the decision's instant plus its RetryAfter, on the limiter's own
// clock (a [ManualClock] wakes it when it is moved there), and tries again:
// with nothing else arriving it is then admitted, at exactly the earliest
// instant it could be. Other traffic may take the allowance first, in which
// case the next denial says how much longer to sleep. Waiters hold no
// place: the one whose retry comes first is served first, and at the instant
// allowance returns every waiter that was due then wakes and all but the
// ones it fits go back to sleep. A [LeakyBucket] is the exception: it admits
// a request into its queue at once and Wait then sleeps the request's Delay,
// so each waiter wakes once, in the queue's order, which makes it the rule
// to pace many workers with.
//
// The deadline test compares durations: the time left until ctx's deadline
// (by the wall clock, as package context measures it) against the time the
// request would wait on the limiter's clock if nothing else arrived. With
// [SystemClock] the two run at the same speed.

// attempt is the outcome of one admission attempt made for Wait.
type attempt struct {
	d   Decision
	now int64 // the limiter's time of the decision, in ns
	// goOn is how long after now the request would go on if nothing else
	// arrived: an admissible request's Delay, and for a denied one its
	// RetryAfter plus the Delay it would then be admitted with.
	goOn time.Duration
	// committed reports that the request was admitted and its cost spent.
	committed bool
	// tooSlow, for a composite's request that every layer admits but that
	// would wait longer than the budget, is the Decision that refuses it
	// for that reason (see Store.CheckWithin).
	tooSlow Decision
	// err ends the wait with this error.
	err error
	// changed, if not nil, ends when the limiter's rules change: a waiter
	// asleep until its retry wakes then, to ask again under the new rules.
	changed context.Context
	// shadow, for an admission that a shadow layer would have refused
	// (d.Shadowed), is that layer's own Decision, for an Observer.
	shadow Decision
}

// tryFunc makes one admission attempt at the limiter's current time,
// committing an admissible request only if its goOn is at most budget.
type tryFunc func(cost int64, budget time.Duration) attempt

// waitFor is Wait for every limiter: the loop around its attempts, for a
// cost already validated. d is what to return if ctx has already ended;
// its Policy labels the Wait for obs, which may be nil.
func waitFor(ctx context.Context, clk Clock, cost int64, d Decision, try tryFunc, obs Observer) (Decision, error) {
	if obs == nil {
		var last attempt
		return waitLoop(ctx, clk, cost, d, try, &last)
	}
	policy := d.Policy
	start := clampTime(clk.Now())
	obs.Waited(policy, WaitStarted, 0)
	last := attempt{now: -1} // now < 0: no attempt made
	d, err := waitLoop(ctx, clk, cost, d, try, &last)
	switch {
	case last.now < 0:
	case last.committed || last.err != nil:
		observe(obs, &last, cost)
	default:
		obs.Decided(d, Units(cost), OutcomeRefused)
	}
	e := WaitAdmitted
	if err != nil {
		e = WaitAbandoned
	}
	obs.Waited(policy, e, time.Duration(max(clampTime(clk.Now())-start, 0)))
	return d, err
}

// waitLoop is waitFor's loop, keeping the latest attempt in *last.
func waitLoop(ctx context.Context, clk Clock, cost int64, d Decision, try tryFunc, last *attempt) (Decision, error) {
	for {
		if err := ctx.Err(); err != nil {
			return d, err
		}
		budget := timeLeft(ctx)
		a := try(cost, budget)
		*last = a
		d = a.d
		if a.err != nil {
			return d, a.err
		}
		if a.committed {
			// An admitted request stays spent, even if ctx ends while it
			// waits out its Delay: it has joined the queue, as a request
			// that reached a server has, and the queue drains at the
			// rule's rate whether or not it is served.
			if d.Delay > 0 {
				if err := sleepUntil(ctx, clk, addTime(a.now, d.Delay)); err != nil {
					return d, err
				}
			}
			return d, nil
		}
		d.Allowed, d.Delay = false, 0
		if a.goOn > budget {
			return d, errWouldExceedDeadline
		}
		retry := addTime(a.now, d.RetryAfter)
		if retry > int64(MaxTime) {
			// The limiter's time stops at MaxTime, so the request can never
			// be admitted: wait for the context, whose end is the only way
			// out.
			<-ctx.Done()
			return d, ctx.Err()
		}
		if err := sleepOrChange(ctx, a.changed, clk, retry); err != nil {
			return d, err
		}
	}
}

// sleepOrChange sleeps until clk reads t, ctx ends (its error), or changed
// ends (nil: the caller asks again at once).
func sleepOrChange(ctx, changed context.Context, clk Clock, t int64) error {
	if changed == nil {
		return sleepUntil(ctx, clk, t)
	}
	if changed.Err() != nil {
		return nil
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(changed, cancel)
	defer stop()
	if err := sleepUntil(sctx, clk, t); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// addTime returns now + d for a now in [0, MaxTime] and d >= 0, saturated
// at MaxTime+1 (past every instant a limiter represents) instead of
// wrapping round.
func addTime(now int64, d time.Duration) int64 {
	if int64(d) > int64(MaxTime)+1-now {
		return int64(MaxTime) + 1
	}
	return now + int64(d)
}

// Sleep blocks until clk has advanced by d, or until ctx ends, and then
// returns ctx's error. With a [ManualClock] it wakes when the clock is moved
// far enough, however little real time has passed; with [SystemClock] or any
// other clock it sleeps on a real timer. A d <= 0 returns at once (with
// ctx's error if ctx has ended). It is what Wait sleeps with, for code that
// waits out a Decision's RetryAfter or Delay on a limiter's own clock.
func Sleep(ctx context.Context, clk Clock, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	if clk == nil {
		clk = SystemClock()
	}
	t := addTime(clampTime(clk.Now()), d)
	if t > int64(MaxTime) {
		<-ctx.Done()
		return ctx.Err()
	}
	return sleepUntil(ctx, clk, t)
}

// maxBudget is the budget of a Check, or of a Wait without a deadline: the
// longest Duration.
const maxBudget = time.Duration(math.MaxInt64)

// timeLeft returns the time until ctx's deadline, or maxBudget if it has
// none.
func timeLeft(ctx context.Context) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return maxBudget
	}
	return time.Until(deadline)
}

// sleepUntil blocks until clk reads at least t (ns) or ctx ends.
func sleepUntil(ctx context.Context, clk Clock, t int64) error {
	if s, ok := clk.(sleeper); ok {
		return s.sleepUntil(ctx, t)
	}
	return realSleepUntil(ctx, clk, t)
}

// Wait implements [Limiter.Wait].
func (l *single[S, A]) Wait(ctx context.Context, cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.capMil, l.pol); err != nil {
		return d, err
	}
	return waitFor(ctx, l.clock, int64(cost), l.pol.decision(), l.try, l.obs)
}

// try implements tryFunc: a look at the state and, if the request is
// admissible soon enough, the same step again with commit, under one lock
// and at one instant, so that the look is exact.
func (l *single[S, A]) try(cost int64, budget time.Duration) attempt {
	now := l.tl.lock(clampTime(l.clock.Now()))
	defer l.tl.unlock()
	return tryState(l.alg, &l.state, now, cost, budget)
}

// tryState is tryFunc's attempt on one state at now.
func tryState[S any, A algorithm[S]](alg A, s *S, now, cost int64, budget time.Duration) attempt {
	a := attempt{now: now, d: alg.step(s, now, cost, stepLook)}
	if !a.d.Allowed {
		a.goOn = a.d.RetryAfter
		// What the request would get when its RetryAfter is over: for the
		// leaky bucket, the Delay it would then queue for.
		at := min(addTime(now, a.d.RetryAfter), int64(MaxTime))
		if later := alg.step(s, at, cost, stepLook); later.Allowed {
			a.goOn += later.Delay
		}
		return a
	}
	a.goOn = a.d.Delay
	if a.goOn > budget {
		return a
	}
	a.d = alg.step(s, now, cost, stepCheck)
	a.committed = true
	return a
}

// Wait implements [Limiter.Wait].
func (l *atomicGCRA) Wait(ctx context.Context, cost Units) (Decision, error) {
	var clk Clock = systemClock{}
	if l.mono != nil {
		clk = l.mono.clock
	}
	if d, err := checkCost(cost, l.alg.capMilli, &l.alg.pol); err != nil {
		return d, err
	}
	return waitFor(ctx, clk, int64(cost), l.alg.pol.decision(), l.try, l.obs)
}

// try implements tryFunc for the lock-free GCRA. GCRA never delays an
// admitted request, so an admissible request is committed unless the
// deadline has already passed.
func (l *atomicGCRA) try(cost int64, budget time.Duration) attempt {
	now := l.now()
	if l.leak != nil {
		return l.tryQueue(now, cost, budget)
	}
	if budget < 0 {
		s, at := l.load(now, l.now) // as in spend
		d := l.alg.step(&s, at, cost, stepLook)
		return attempt{d: d, now: at, goOn: d.RetryAfter}
	}
	s, at, admitted := l.spend(now, cost)
	d := l.alg.step(&s, at, cost, stepLook)
	return attempt{d: d, now: at, goOn: d.RetryAfter, committed: admitted}
}

// tryQueue is try for the leaky bucket, whose admitted request may be
// delayed: it commits only a request that goes on within budget, and only
// on the state it judged.
func (l *atomicGCRA) tryQueue(now, cost int64, budget time.Duration) attempt {
	var a attempt
	l.update(now, func(s *vtime, at int64) bool {
		a = tryState(l.leak, s, at, cost, budget)
		return a.committed
	})
	return a
}
