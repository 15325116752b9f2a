package httplimit

import (
	"context"
	"time"
)

// WithSleep replaces how the middleware waits out a Delay, so that tests
// wait on virtual time.
func WithSleep(f func(ctx context.Context, d time.Duration) error) Option {
	return func(c *config) { c.sleep = f }
}

// Sleep is the middleware's real wait.
var Sleep = sleep
