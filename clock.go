package ratelimit

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a monotonic time source: Now returns the time elapsed since a fixed
// origin of the clock's choosing. A Clock must be safe for concurrent use.
//
// Limiters never trust a clock to keep its promise. A reading earlier than
// one already seen is treated as the latest instant seen (time is clamped,
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
//
// Goroutines blocked in a limiter's Wait sleep on the clock's own time: they
// wake when Set or Advance moves the clock to (or past) the instant they
// wait for, however little real time has passed. [ManualClock.Sleepers],
// [ManualClock.BlockUntilSleepers] and [ManualClock.NextWake] let a test or a
// simulation see who is asleep and move the clock to the next wake-up.
type ManualClock struct {
	now atomic.Int64

	mu       sync.Mutex
	sleepers []*manualSleeper // in no particular order
	changed  chan struct{}    // closed (and replaced) when sleepers changes
}

// manualSleeper is one goroutine asleep on a ManualClock until the clock
// reads at least at; ch is closed to wake it.
type manualSleeper struct {
	at int64
	ch chan struct{}
}

// NewManualClock returns a ManualClock that reads start.
func NewManualClock(start time.Duration) *ManualClock {
	c := &ManualClock{}
	c.now.Store(int64(start))
	return c
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Duration { return time.Duration(c.now.Load()) }

// Set moves the clock to t and wakes every sleeper whose instant has come.
// Set may move the clock backwards, which lets a test check that a limiter
// clamps such a clock rather than trusting it.
func (c *ManualClock) Set(t time.Duration) {
	c.now.Store(int64(t))
	c.wake()
}

// Advance moves the clock forward by d (backwards for a negative d), wakes
// every sleeper whose instant has come, and returns the new reading. A step
// past the largest or smallest Duration stops there instead of wrapping.
func (c *ManualClock) Advance(d time.Duration) time.Duration {
	for {
		old := c.now.Load()
		next := old + int64(d)
		// Saturate rather than wrap, so that a huge step never turns time
		// negative and strands the sleepers.
		if d > 0 && next < old {
			next = math.MaxInt64
		} else if d < 0 && next > old {
			next = math.MinInt64
		}
		if c.now.CompareAndSwap(old, next) {
			c.wake()
			return time.Duration(next)
		}
	}
}

// Sleepers returns how many goroutines are asleep on the clock, waiting for
// it to reach some later instant.
func (c *ManualClock) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sleepers)
}

// BlockUntilSleepers blocks until at least n goroutines are asleep on the
// clock, or until ctx ends, in which case it returns ctx's error. A test
// calls it to know that its goroutines have reached their Wait before it
// moves the clock.
func (c *ManualClock) BlockUntilSleepers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.sleepers) >= n {
			c.mu.Unlock()
			return nil
		}
		ch := c.changedLocked()
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// NextWake returns the earliest instant a sleeper waits for, and false if no
// goroutine is asleep on the clock. A simulation moves the clock there with
// Set to run the next event.
func (c *ManualClock) NextWake() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sleepers) == 0 {
		return 0, false
	}
	next := c.sleepers[0].at
	for _, s := range c.sleepers[1:] {
		next = min(next, s.at)
	}
	return time.Duration(next), true
}

// sleepUntil blocks until the clock reads at least t or ctx ends. It
// implements sleeper.
func (c *ManualClock) sleepUntil(ctx context.Context, t int64) error {
	c.mu.Lock()
	// Read the time under the lock: a Set or Advance that moved the clock
	// before this read wakes nothing registered later, so the read must see it.
	if c.now.Load() >= t {
		c.mu.Unlock()
		return nil
	}
	s := &manualSleeper{at: t, ch: make(chan struct{})}
	c.sleepers = append(c.sleepers, s)
	c.notifyLocked()
	c.mu.Unlock()
	select {
	case <-s.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		c.removeLocked(s)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// wake wakes the sleepers whose instant the clock has reached.
func (c *ManualClock) wake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now.Load()
	kept := c.sleepers[:0]
	for _, s := range c.sleepers {
		if s.at <= now {
			close(s.ch)
		} else {
			kept = append(kept, s)
		}
	}
	if len(kept) != len(c.sleepers) {
		clear(c.sleepers[len(kept):])
		c.sleepers = kept
		c.notifyLocked()
	}
}

// removeLocked forgets s if it is still asleep.
func (c *ManualClock) removeLocked(s *manualSleeper) {
	for i, x := range c.sleepers {
		if x == s {
			last := len(c.sleepers) - 1
			c.sleepers[i] = c.sleepers[last]
			c.sleepers[last] = nil
			c.sleepers = c.sleepers[:last]
			c.notifyLocked()
			return
		}
	}
}

// changedLocked returns a channel that is closed at the next change of the
// set of sleepers.
func (c *ManualClock) changedLocked() chan struct{} {
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return c.changed
}

func (c *ManualClock) notifyLocked() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// sleeper is a clock that can put a goroutine to sleep on its own time:
// sleepUntil blocks until the clock reads at least t (in ns since its
// origin) or ctx ends, returning ctx's error in that case. [SystemClock]
// sleeps on a [time.Timer] and [ManualClock] on virtual timers; Wait uses
// real timers for any other Clock.
type sleeper interface {
	sleepUntil(ctx context.Context, t int64) error
}

// sleepUntil implements sleeper with a real timer.
func (systemClock) sleepUntil(ctx context.Context, t int64) error {
	return realSleepUntil(ctx, systemClock{}, t)
}

// realSleepUntil sleeps on a real timer for as long as clk says is left
// until t. For a clock that does not run at real speed the caller checks
// again after waking.
func realSleepUntil(ctx context.Context, clk Clock, t int64) error {
	d := time.Duration(t) - clk.Now()
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
