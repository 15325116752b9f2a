package redisstore

import (
	"context"
	"time"

	"github.com/ratekit/ratelimit"
)

// Wait checks cost for key and, while it is denied, sleeps out its
// RetryAfter on the store's clock and checks again, until it is admitted,
// ctx ends, or the wait would outlast ctx's deadline (then it returns the
// denial with an error matching [ratelimit.ErrWouldExceedDeadline] at once,
// without sleeping). An admitted leaky-bucket request then waits out its
// Delay; if ctx ends during that, the request stays spent. Every check it
// makes is a [Store.CheckContext], errors included, except that, as in
// process, a refusal spends nothing even for a rule with CountRefused, and
// is reported on the key as it stands ([ratelimit.Machine.Look]).
func (s *Store) Wait(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	check := func(ctx context.Context) (ratelimit.Decision, error) { return s.checkContext(ctx, key, cost, true) }
	return waitFor(ctx, s.Clock(), check, nil)
}

// waitFor is Wait over check: check, and while it refuses, sleep out its
// RetryAfter on clk and check again; an admission's Delay is slept out
// before it returns. changed, if not nil, returns a context that ends when
// the rules of the latest check are replaced: a refusal's sleep ends then,
// and the next check asks under the new rules.
func waitFor(ctx context.Context, clk ratelimit.Clock, check func(context.Context) (ratelimit.Decision, error), changed func() context.Context) (ratelimit.Decision, error) {
	for {
		d, err := check(ctx)
		if err != nil {
			return d, err
		}
		wait := d.RetryAfter
		if d.Allowed {
			wait = d.Delay
		}
		if wait <= 0 {
			return d, nil
		}
		if dl, ok := ctx.Deadline(); ok && !d.Allowed && time.Until(dl) < wait {
			return d, ratelimit.ErrWouldExceedDeadline
		}
		if d.Allowed || changed == nil {
			if err := ratelimit.Sleep(ctx, clk, wait); err != nil || d.Allowed {
				return d, err
			}
			continue
		}
		sleep, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(changed(), cancel)
		err = ratelimit.Sleep(sleep, clk, wait)
		stop()
		cancel()
		if err != nil && ctx.Err() != nil {
			return d, ctx.Err()
		}
	}
}
