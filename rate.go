package ratelimit

import (
	"math/bits"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit/internal/wide"
)

// Rate is an exact rational rate: Count requests (units) per Per. Rates are
// never converted to floating point, so PerMinute(100) is exactly 100 per
// minute, not 1.6666 per second.
//
// Count must be from 1 to 1e15 and Per positive and less than [MaxTime];
// constructors reject other values (and so the zero Rate, or Every(d) for
// a d <= 0) with [ErrInvalidRule].
type Rate struct {
	Count int64
	Per   time.Duration
}

// PerSecond returns a rate of n per second.
func PerSecond(n int64) Rate { return Rate{Count: n, Per: time.Second} }

// PerMinute returns a rate of n per minute.
func PerMinute(n int64) Rate { return Rate{Count: n, Per: time.Minute} }

// PerHour returns a rate of n per hour.
func PerHour(n int64) Rate { return Rate{Count: n, Per: time.Hour} }

// Every returns a rate of one per d.
func Every(d time.Duration) Rate { return Rate{Count: 1, Per: d} }

// String formats the rate as Count/Per with a short unit: "10/s",
// "100/min", "5000/h", "7/3s", "1/24h", "3/250ms".
func (r Rate) String() string {
	n := strconv.FormatInt(r.Count, 10) + "/"
	switch r.Per {
	case time.Second:
		return n + "s"
	case time.Minute:
		return n + "min"
	case time.Hour:
		return n + "h"
	}
	return n + shortDuration(r.Per)
}

// shortDuration formats d in the largest unit that divides it exactly, as
// "3s", "24h" or "250ms", so that a rate string reads back to the same Rate.
func shortDuration(d time.Duration) string {
	units := [...]struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}}
	if d > 0 {
		for _, u := range units {
			if d%u.d == 0 {
				return strconv.FormatInt(int64(d/u.d), 10) + u.name
			}
		}
	}
	return strconv.FormatInt(int64(d), 10) + "ns"
}

// Bounds on rules. They keep every product in the exact arithmetic inside
// 128 bits and every instant inside an int64 of nanoseconds.
const (
	// maxCount bounds Rate.Count: 1e15 units per period.
	maxCount = 1_000_000_000_000_000
	// maxCapacity bounds Burst, Capacity and Limit: 1e15 units.
	maxCapacity = 1_000_000_000_000_000
	// maxSpan bounds every duration a rule implies (a period, a window, the
	// time to refill a whole burst), so that MaxTime plus a span still fits
	// in an int64.
	maxSpan = int64(MaxTime) - 1
)

// pace is a compiled Rate: n milli-units every p nanoseconds, in lowest
// terms. The time for x milli-units, x*p/n ns, is kept as an exact rational
// with denominator n: a whole number of nanoseconds plus frac/n.
type pace struct {
	n    uint64 // milli-units
	p    uint64 // nanoseconds
	pdiv wide.Divider
}

// compile validates r as the field named field of rule.
func (r Rate) compile(rule, field string) (pace, error) {
	switch {
	case r.Count <= 0:
		return pace{}, &RuleError{Rule: rule, Field: field + ".Count", Reason: "must be positive"}
	case r.Count > maxCount:
		return pace{}, &RuleError{Rule: rule, Field: field + ".Count", Reason: "must be at most 1e15"}
	case r.Per <= 0:
		return pace{}, &RuleError{Rule: rule, Field: field + ".Per", Reason: "must be positive"}
	case int64(r.Per) > maxSpan:
		return pace{}, &RuleError{Rule: rule, Field: field + ".Per", Reason: "must be less than MaxTime"}
	}
	n, p := uint64(r.Count)*uint64(Unit), uint64(r.Per)
	g := wide.GCD(n, p)
	pc := pace{n: n / g, p: p / g}
	pc.pdiv, _ = wide.NewDivider(pc.p) // p > 0
	return pc, nil
}

// The hot-path conversions below take a division-free (or
// reciprocal-multiplication) path when n is 1, the usual case: 10/s,
// 100/min and 5000/h all earn one milli-unit every whole number of
// nanoseconds. Callers keep their arguments within the rule's capacity, so
// no result overflows.

// milliCeil returns ceil((ns*n + frac) / p): the milli-units a time span of
// ns + frac/n nanoseconds is worth, rounded up. It divides by the pace's
// reciprocal divider whenever ns*n+frac fits in 64 bits (every span when n
// is 1; for n up to 2^20, any span under 4 hours), and by a 128-bit
// division otherwise.
func (pc *pace) milliCeil(ns, frac uint64) uint64 {
	var q, r uint64
	if hi, lo := bits.Mul64(ns, pc.n); hi == 0 && lo+frac >= lo {
		q, r = pc.pdiv.DivMod(lo + frac)
	} else {
		q, r, _ = wide.MulAddDiv(ns, pc.n, frac, pc.p)
	}
	if r != 0 {
		q++
	}
	return q
}

// span returns the time x milli-units take at this pace, as whole
// nanoseconds plus frac/n. ok is false when it exceeds maxSpan.
func (pc pace) span(x uint64) (ns, frac uint64, ok bool) {
	q, r, ok := wide.MulDiv(x, pc.p, pc.n)
	return q, r, ok && q <= uint64(maxSpan)
}

// capacityMilli validates a capacity field (Burst, Capacity, Limit) and
// returns it in milli-units.
func capacityMilli(rule, field string, v int64) (int64, error) {
	switch {
	case v <= 0:
		return 0, &RuleError{Rule: rule, Field: field, Reason: "must be positive"}
	case v > maxCapacity:
		return 0, &RuleError{Rule: rule, Field: field, Reason: "must be at most 1e15"}
	}
	return v * int64(Unit), nil
}

// ceilNs rounds a rational time up to whole nanoseconds.
func ceilNs(ns, frac uint64) time.Duration {
	if frac != 0 {
		ns++
	}
	return time.Duration(ns)
}
