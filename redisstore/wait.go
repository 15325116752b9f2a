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
	clk := s.Clock()
	for {
		d, err := s.checkContext(ctx, key, cost, true)
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
		if err := ratelimit.Sleep(ctx, clk, wait); err != nil {
			return d, err
		}
		if d.Allowed {
			return d, nil
		}
	}
}
