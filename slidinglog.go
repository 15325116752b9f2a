package ratelimit

import (
	"math/bits"
	"time"
)

// SlidingLog admits at most Limit units in any window of length Window: it
// keeps a log of the admitted requests and, at time now, counts those in
// (now-Window, now]. A request admitted at t stops counting at exactly
// t+Window. A request of cost c is admitted iff the cost still counted plus
// c is at most Limit. A denied request's RetryAfter is the time until enough
// of the oldest admitted cost has left the window; ResetAfter is the time
// until the newest admitted request leaves it.
//
// It is the exact sliding window, with no burst at window boundaries and no
// estimate (what [Store.Settle] charges past the limit counts in the window
// too, and admits nothing while it does), at a price: unlike every other rule its per-key state grows with
// the traffic. It keeps one entry (16 bytes) per distinct instant at which
// something was admitted within the last Window: at most min(Limit*1000,
// admissions in one Window) entries (at most Limit with whole-unit costs),
// as requests admitted at the same nanosecond share an entry. Expired
// entries are dropped when the next request is admitted; the entries live
// after an admission sit in an array of at most max(16, 4 x entries) slots,
// which shrinks as soon as it is mostly empty. A key with nothing left in
// its window is as good as a fresh one, so a [Store] may drop it and its
// array with it.
//
// Limit is in whole units, from 1 to 1e15; Window must be positive and at
// most [MaxTime]-1.
type SlidingLog struct {
	Limit  int64
	Window time.Duration
	Name   string // optional: reported as Decision.Policy
}

// slEvent is one log entry: an admission instant and the cumulative cost
// admitted up to and including it. Cumulative costs are kept modulo 2^64:
// only differences between entries in the log are used, and those never
// exceed 2*Limit*1000 < 2^63 (Limit, and as much again of debt: see
// [Store.Settle]), so the wrap-around is harmless.
type slEvent struct {
	t   int64  // ns
	cum uint64 // milli-units, modulo 2^64
}

// slState is a sliding log's per-key state: a ring buffer of entries in
// time order (strictly increasing t). The zero value is a fresh key.
//
// The ring is the whole backing array of buf, buf[:cap(buf)], whose length
// is a power of two; len(buf) is the number of entries, which start at index
// head and wrap around. base is the cumulative cost just before the oldest
// entry, so the cost counted from entry i onwards is newest.cum - cum(i-1).
//
// Unlike every other state this one holds a pointer. Copies of a state
// share its entries: after a step commits through one of them the others
// are stale and must not be used again. Looking at a copy (commit false)
// is always safe, as nothing is written then.
type slState struct {
	buf  []slEvent
	head int
	base uint64
}

// Ring sizes. A ring of at most slKeepSlots slots is never shrunk, so that
// small logs do not reallocate over and over as their windows empty and
// fill; a larger ring shrinks as soon as at most a quarter of it is in use.
const (
	slKeepSlots = 16
	slMinSlots  = 4
)

// at returns the i-th entry from the oldest (0 <= i < len(s.buf)).
func (s *slState) at(i int) *slEvent {
	ring := s.buf[:cap(s.buf)]
	return &ring[(s.head+i)&(len(ring)-1)]
}

// slAlgo is a compiled SlidingLog rule.
type slAlgo struct {
	window int64 // ns
	ruleBase
}

func (r SlidingLog) compile() (*slAlgo, error) {
	b, w, err := compileWindow("SlidingLog", r.Name, r.Limit, r.Window)
	if err != nil {
		return nil, err
	}
	return &slAlgo{window: w, ruleBase: b}, nil
}

func (r SlidingLog) bind() (binding, error) { return bindRule[slState](r.compile()) }

// expired returns how many of the oldest entries no longer count at now:
// those with t + window <= now. now is at least the newest entry's time.
func (a *slAlgo) expired(s *slState, now int64) int {
	n := len(s.buf)
	if n == 0 || s.at(0).t+a.window > now {
		return 0 // the common case: the oldest entry still counts
	}
	// The oldest entry has expired: find the first live one by bisection
	// over entries 1..n (n meaning none is live).
	lo, hi := 1, n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).t+a.window > now {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func (a *slAlgo) step(s *slState, now, cost int64, m stepMode) Decision {
	d := a.pol.decision()
	n := len(s.buf)
	if n > 0 {
		// Time is never earlier than the newest entry: t + window <= MaxTime +
		// maxSpan fits in an int64, and every wait below is positive.
		now = max(now, s.at(n-1).t)
	}
	d.At = time.Duration(now)
	k := a.expired(s, now)
	var inside int64 // the cost still counted: cum(newest) - cum(k-1)
	prev := s.base   // cum(k-1)
	if k > 0 {
		prev = s.at(k - 1).cum
	}
	if k < n {
		inside = int64(s.at(n-1).cum - prev)
	}
	if inside+cost <= a.capMilli {
		d.Allowed = true
		d.Remaining = (a.capMilli - inside - cost) / int64(Unit)
		d.ResetAfter = time.Duration(a.window) // the new entry is the newest
		if m.commits() {
			s.admit(k, now, cost)
		}
		return d
	}
	// Denied: inside > 0, so entries k..n-1 are live. Wait until the first
	// entry j whose expiry leaves room: cum(newest) - cum(j) + cost <= cap,
	// that is cum(j) - prev >= need. Entry n-1 always qualifies, as cost <=
	// capMilli. inside <= 2 capMilli, in debt: no overflow.
	need := uint64(inside + cost - a.capMilli)
	lo, hi := k, n-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).cum-prev >= need {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	d.RetryAfter = time.Duration(s.at(lo).t + a.window - now)
	d.Remaining = max(a.capMilli-inside, 0) / int64(Unit) // none in debt (Store.Settle)
	d.ResetAfter = time.Duration(s.at(n-1).t + a.window - now)
	return d
}

// admit drops the k oldest (expired) entries and records cost at now, the
// state's newest time, merging it into the newest entry if that is at now.
func (s *slState) admit(k int, now, cost int64) {
	if k > 0 {
		s.base = s.at(k - 1).cum
		s.head = (s.head + k) & (cap(s.buf) - 1)
		s.buf = s.buf[:len(s.buf)-k]
	}
	n := len(s.buf)
	cum, merge := s.base, false
	if n > 0 {
		last := s.at(n - 1)
		cum, merge = last.cum, last.t == now
	}
	keep := n + 1 // entries after this admission
	if merge {
		keep = n
	}
	switch size := cap(s.buf); {
	case keep > size:
		s.resize(max(1, 2*size))
	case size > slKeepSlots && keep <= size/4:
		s.resize(max(slMinSlots, 1<<bits.Len(uint(2*keep-1))))
	}
	if merge {
		s.at(n - 1).cum = cum + uint64(cost)
		return
	}
	s.buf = s.buf[:n+1]
	*s.at(n) = slEvent{t: now, cum: cum + uint64(cost)}
}

// resize moves the entries, oldest first, to a new ring of size slots (a
// power of two that holds them all).
func (s *slState) resize(size int) {
	n := len(s.buf)
	buf := make([]slEvent, n, size)
	for i := range n {
		buf[i] = *s.at(i)
	}
	s.buf, s.head = buf, 0
}

func (a *slAlgo) fresh(s *slState, now int64) bool {
	n := len(s.buf)
	return n == 0 || s.at(n-1).t+a.window <= now
}
