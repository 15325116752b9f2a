package redisstore

import (
	"sync/atomic"
	"time"
)

// breaker is a lock-free circuit breaker. Closed, every check tries Redis.
// After enough consecutive failures it opens until a time; the first check
// after that time becomes the probe, moving the time on by a pause so that
// the others keep failing fast while it runs. A success closes it.
type breaker struct {
	fails     atomic.Int64
	openUntil atomic.Int64 // Unix ns; 0 when closed
}

// allow reports whether a check may try Redis, and whether it is a probe.
func (b *breaker) allow(now time.Time, pause time.Duration) (probe, ok bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return false, true
	}
	t := now.UnixNano()
	if t < until {
		return false, false
	}
	if !b.openUntil.CompareAndSwap(until, t+int64(pause)) {
		return false, false // another check is the probe
	}
	return true, true
}

func (b *breaker) success(probe bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if probe || b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

func (b *breaker) failure(now time.Time, probe bool, threshold int, pause time.Duration) {
	if n := b.fails.Add(1); probe || n >= int64(threshold) {
		b.openUntil.Store(now.UnixNano() + int64(pause))
	}
}

// open reports whether the circuit is open.
func (b *breaker) open() bool { return b.openUntil.Load() != 0 }
