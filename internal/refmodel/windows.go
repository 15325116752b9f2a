package refmodel

import (
	"math/big"
	"time"

	"github.com/ratekit/ratelimit"
)

// The window models keep the cost admitted in every window they have seen
// and answer each question by evaluating the rule's definition at candidate
// instants: an admission test at now, and for RetryAfter and ResetAfter a
// search, window by window, for the first instant at which the definition
// holds. Times are uint64 nanoseconds: now <= MaxTime = 2^62 and the search
// looks at most three windows of at most 2^62 ns ahead, which stays below
// 2^64.

// windows is the bookkeeping shared by the window models: admitted
// milli-units per window index.
type windows struct {
	limit  int64
	w      uint64
	counts map[uint64]int64
	// refused counts a denied request's cost too, in now's window, up to
	// the limit (CountRefused); a count above it, in debt, stays as it is.
	refused bool
}

func newWindows(limit int64, window time.Duration) windows {
	return windows{limit: limit, w: uint64(window), counts: map[uint64]int64{}}
}

// Capacity implements Model.
func (m *windows) Capacity() int64 { return m.limit * 1000 }

// count returns what was admitted in window j.
func (m *windows) count(j uint64) *big.Rat { return rat(m.counts[j]) }

// firstIn returns the smallest t in [from, (j+1)W) with ok(t), given that
// ok, inside window j, is false up to some instant and true from it on.
// found is false when ok holds nowhere in that range.
func (m *windows) firstIn(j, from uint64, ok func(t uint64) bool) (t uint64, found bool) {
	lo, hi := max(from, j*m.w), (j+1)*m.w-1
	if !ok(hi) {
		return 0, false
	}
	for lo < hi { // invariant: ok(hi)
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return hi, true
}

// wait returns the smallest d >= 0 such that ok(now+d), looking through the
// window of now and the n windows after it. It panics if there is none: the
// model itself would be wrong.
func (m *windows) wait(now uint64, n uint64, ok func(t uint64) bool) time.Duration {
	k := now / m.w
	for j := k; j <= k+n; j++ {
		if t, found := m.firstIn(j, now, ok); found {
			return time.Duration(t - now)
		}
	}
	panic("refmodel: no admitting instant within the windows searched")
}

// decide runs one check against the estimate function est, which gives the
// cost that counts at an instant; n is how many windows after now's the
// searches need.
func (m *windows) decide(now, cost int64, n uint64, est func(t uint64) *big.Rat) ratelimit.Decision {
	t, c, capacity := uint64(now), rat(cost), rat(m.Capacity())
	admits := func(t uint64) bool { return new(big.Rat).Add(est(t), c).Cmp(capacity) <= 0 }
	d := ratelimit.Decision{Limit: m.limit, At: time.Duration(now)}
	if admits(t) {
		d.Allowed = true
		m.counts[t/m.w] += cost
	} else {
		if m.refused {
			// Up to the limit; a count above it, in debt, stays.
			m.counts[t/m.w] = max(m.counts[t/m.w], min(m.counts[t/m.w]+cost, m.Capacity()))
		}
		// With the refused cost counted, if it is: the key as it is after.
		d.RetryAfter = m.wait(t, n, admits)
	}
	// Remaining: the largest whole x with est + 1000x <= capacity.
	if left := new(big.Rat).Sub(capacity, est(t)); left.Sign() > 0 {
		d.Remaining = units(left)
	}
	d.ResetAfter = m.wait(t, n, func(t uint64) bool { return est(t).Sign() == 0 })
	return d
}

// FixedWindow is the fixed window from its definition: windows [kW, (k+1)W);
// admit iff the window's count plus cost <= Limit.
type FixedWindow struct{ windows }

// NewFixedWindow returns a model of a fresh key.
func NewFixedWindow(limit int64, window time.Duration) *FixedWindow {
	return &FixedWindow{newWindows(limit, window)}
}

// Step implements Model.
func (m *FixedWindow) Step(now, cost int64) ratelimit.Decision {
	// Within a window the count is constant; the next window is empty.
	return m.decide(now, cost, 1, func(t uint64) *big.Rat { return m.count(t / m.w) })
}

// SlidingCounter is the sliding counter from its definition: at e into
// window k, estimate = count(k-1) x (W - e)/W + count(k); admit iff
// estimate + cost <= Limit.
type SlidingCounter struct{ windows }

// NewSlidingCounter returns a model of a fresh key.
func NewSlidingCounter(limit int64, window time.Duration) *SlidingCounter {
	return &SlidingCounter{newWindows(limit, window)}
}

func (m *SlidingCounter) estimate(t uint64) *big.Rat {
	k := t / m.w
	est := m.count(k)
	if k > 0 {
		start := k * m.w
		weight := new(big.Rat).SetFrac(
			new(big.Int).SetUint64(m.w-(t-start)),
			new(big.Int).SetUint64(m.w))
		est.Add(est, weight.Mul(weight, m.count(k-1)))
	}
	return est
}

// WithCountRefused makes the model count denied requests' cost too, in
// their window, up to the limit (CountRefused), and returns it.
func (m *SlidingCounter) WithCountRefused() *SlidingCounter {
	m.refused = true
	return m
}

// Step implements Model.
func (m *SlidingCounter) Step(now, cost int64) ratelimit.Decision {
	// Inside a window the counts are fixed and the weight falls, so each
	// search is monotone there. Two windows on, nothing admitted counts.
	return m.decide(now, cost, 2, m.estimate)
}
