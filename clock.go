package ratelimit

import (
	"sync/atomic"
	"time"
)

// Clock is a monotonic time source: Now returns the time elapsed since a fixed
// origin of the clock's choosing. A Clock must be safe for concurrent use.
//
// Limiters never trust a clock to keep its promise. A reading earlier than
// one already seen is treated as that earlier-seen instant (time is clamped,
// never run backwards), a negative reading as 0, and a reading beyond
// [MaxTime] as MaxTime.
type Clock interface {
	Now() time.Duration
}

// MaxTime is the latest instant a limiter represents, about 146 years after
// its clock's origin. Readings beyond it are clamped to it.
const MaxTime = time.Duration(1 << 62)

// processStart is the origin shared by every [SystemClock], so that limiters
// built at different moments (and the parts of a composite limit) agree on
// what "now" means. It is read once; nothing ever writes it.
var processStart = time.Now()

// SystemClock returns the process's monotonic clock: the time since the
// package was initialised, read from Go's monotonic clock with one read per
// call and no wall-clock arithmetic, so that wall-clock steps (NTP, a
// changed time zone, a suspended laptop's catch-up) never reach a limiter.
// It is the default clock of every constructor. Window boundaries of the
// window algorithms are multiples of the window length from this origin, not
// from the top of a wall-clock minute.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

// Now returns the time since the process's origin.
func (systemClock) Now() time.Duration { return time.Since(processStart) }

// ManualClock is virtual time for tests and simulations: it stands still until
// it is told to move with [ManualClock.Set] or [ManualClock.Advance]. Its
// methods are safe for concurrent use. The zero value reads 0 and is ready to
// use.
type ManualClock struct {
	now atomic.Int64
}

// NewManualClock returns a ManualClock that reads start.
func NewManualClock(start time.Duration) *ManualClock {
	c := &ManualClock{}
	c.now.Store(int64(start))
	return c
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Duration { return time.Duration(c.now.Load()) }

// Set moves the clock to t. Set may move the clock backwards, which lets a
// test check that a limiter clamps such a clock rather than trusting it.
func (c *ManualClock) Set(t time.Duration) { c.now.Store(int64(t)) }

// Advance moves the clock forward by d (backwards for a negative d) and
// returns the new reading.
func (c *ManualClock) Advance(d time.Duration) time.Duration {
	return time.Duration(c.now.Add(int64(d)))
}

// clampTime maps a raw clock reading into [0, MaxTime].
func clampTime(t time.Duration) int64 {
	switch {
	case t < 0:
		return 0
	case t > MaxTime:
		return int64(MaxTime)
	}
	return int64(t)
}
