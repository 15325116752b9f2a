package refmodel

import (
	"time"

	"github.com/ratekit/ratelimit"
)

// Log is the sliding log from its definition: it keeps every admitted
// request, forever, and at now counts those admitted in (now - W, now].
// Admit iff the counted cost plus cost <= Limit.
//
// Plain int64 arithmetic is exact here: a counted sum is at most Limit*1000
// <= 1e18, a sum plus a cost at most 2e18, and an instant plus a window at
// most MaxTime + MaxTime - 1 < 2^63.
type Log struct {
	window int64
	limit  int64
	events []logEvent
}

type logEvent struct{ t, cost int64 }

// NewLog returns an empty log of limit units per window.
func NewLog(limit int64, window time.Duration) *Log {
	return &Log{window: int64(window), limit: limit}
}

// Capacity implements Model.
func (l *Log) Capacity() int64 { return l.limit * 1000 }

// counts reports whether e still counts at time at: at - W < e.t <= at.
func (l *Log) counts(e logEvent, at int64) bool {
	return e.t > at-l.window && e.t <= at
}

// inside returns the cost counted at time at.
func (l *Log) inside(at int64) int64 {
	var sum int64
	for _, e := range l.events {
		if l.counts(e, at) {
			sum += e.cost
		}
	}
	return sum
}

// Step implements Model.
func (l *Log) Step(now, cost int64) ratelimit.Decision {
	d := ratelimit.Decision{Limit: l.limit, At: time.Duration(now)}
	capMilli := l.Capacity()
	inside := l.inside(now)
	if inside+cost <= capMilli {
		d.Allowed = true
		l.events = append(l.events, logEvent{t: now, cost: cost})
		inside += cost
	} else {
		// Try every instant at which an event stops counting, earliest
		// first: the first at which this request fits is RetryAfter.
		d.RetryAfter = -1
		for _, e := range l.events {
			if !l.counts(e, now) {
				continue
			}
			at := e.t + l.window
			if l.inside(at)+cost <= capMilli {
				d.RetryAfter = time.Duration(at - now)
				break
			}
		}
		if d.RetryAfter < 0 {
			panic("refmodel: a cost within capacity never fits")
		}
	}
	d.Remaining = max(capMilli-inside, 0) / 1000 // none in debt
	// ResetAfter: when the last event that still counts stops counting.
	for _, e := range l.events {
		if l.counts(e, now) {
			d.ResetAfter = max(d.ResetAfter, time.Duration(e.t+l.window-now))
		}
	}
	return d
}
