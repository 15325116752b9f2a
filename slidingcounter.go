package ratelimit

import (
	"math"
	"time"

	"github.com/ratekit/ratelimit/internal/wide"
)

// SlidingCounter approximates a sliding window with two fixed-window counts,
// as many API gateways do. Time is cut into windows [kW, (k+1)W) of the
// limiter's clock, W being Window. At e nanoseconds into the current window
// the estimate is
//
//	previous x (W - e)/W + current
//
// where current is the cost admitted in this window and previous the cost
// admitted in the window just before it (zero if that window saw nothing or
// if the key was idle for longer). A request of cost c is admitted iff
// estimate + c <= Limit, compared exactly in integers.
//
// Limit is in whole units, from 1 to 1e15; Window must be positive and less
// than [MaxTime]. Window boundaries are multiples of Window from the clock's
// origin.
//
// The estimate falls continuously as the window moves on, so a denied
// request's RetryAfter may end inside the current window, in the next one
// or, for a cost that needs the whole Limit, at the start of the one after.
// Something admitted in the current window counts, less and less, until the
// end of the next window: that is when ResetAfter ends. Per-key state is 16
// bytes for a Limit up to 2,147,483 units and 24 bytes above it.
//
// CountRefused counts the cost of a denied request as well, in the current
// window, as some CDNs do: a penalty for sending into a full window. A
// denied request then spends, and its Decision (Remaining, RetryAfter,
// ResetAfter) describes the key after that: a client that keeps sending
// while refused keeps the estimate up and stays refused, instead of getting
// a slice of every new window as the estimate falls, until it slows below
// the limit. A window's count stops at Limit, refusals included, which
// bounds the penalty carried into the next window to that of a window
// filled by admitted requests (a count above Limit, a debt left by
// [Store.Settle], takes no more). Only a check counts a refusal: the Check
// of a limiter, a [Store] or a plan of one rule of a [Plans] (and [Peek],
// [Store.Peek] and [Plans.Peek] report a refusal as that Check would,
// counting nothing). Wait, CheckWithin, a [Composite] and a plan of layers
// never spend a refusal, and so report one on the key as it stands: its
// RetryAfter is when this same request passes, as for every rule.
type SlidingCounter struct {
	Limit        int64
	Window       time.Duration
	CountRefused bool   // count denied requests' cost too (see above)
	Name         string // optional: reported as Decision.Policy
}

// scState holds the counts of window win and of the window before it. The
// zero value is a fresh key: window 0 with nothing counted. It is the wide
// form of a key, the one every method works on; a rule small enough keeps
// its keys as scCompact instead.
type scState struct {
	win  int64 // window index: the window is [win*W, (win+1)*W)
	prev int64 // milli-units admitted in window win-1
	cur  int64 // milli-units admitted in window win
}

// scCompact is scState in 16 bytes, for a rule whose counts always fit 32
// bits: no count ever exceeds twice the capacity (a window's count stops at
// the capacity, refusals counted included; only a debt left by Settle takes
// it further, to at most twice the capacity, and refunds only lower it),
// and decodeAt refuses a larger one. So a capacity of at most
// scCompactCap milli-units keeps every count below 2^32.
type scCompact struct {
	win  int64
	prev uint32
	cur  uint32
}

// scCompactCap is the largest capacity in milli-units whose keys are
// scCompact: twice it fits a uint32, so a Limit of up to 2,147,483 units.
// It is a variable only so that tests can bind the wide state to any rule.
var scCompactCap int64 = math.MaxUint32 / 2

func (s *scCompact) wide() scState {
	return scState{win: s.win, prev: int64(s.prev), cur: int64(s.cur)}
}

// compact returns s as a scCompact; its counts are at most twice a
// capacity of at most scCompactCap, so they fit.
func (s *scState) compact() scCompact {
	return scCompact{win: s.win, prev: uint32(s.prev), cur: uint32(s.cur)}
}

// scAlgo is a compiled SlidingCounter rule.
type scAlgo struct {
	w       int64 // window length in ns
	refused bool  // CountRefused
	ruleBase
}

// scCompactAlgo is scAlgo on scCompact keys: each method widens the state,
// runs scAlgo's, and narrows it back, so that there is one sliding counter.
type scCompactAlgo struct{ scAlgo }

func (r SlidingCounter) compile() (*scAlgo, error) {
	b, w, err := compileWindow("SlidingCounter", r.Name, r.Limit, r.Window)
	if err != nil {
		return nil, err
	}
	return &scAlgo{w: w, refused: r.CountRefused, ruleBase: b}, nil
}

func (r SlidingCounter) bind() (binding, error) {
	a, err := r.compile()
	if err != nil || a.capMilli > scCompactCap {
		return bindRule[scState](a, err)
	}
	return bindRule[scCompact](&scCompactAlgo{*a}, nil)
}

// at returns the state as seen at now: the window index, the time into that
// window and its two counts. A now before the state's window is moved to the
// start of that window: the state keeps no finer notion of its own time.
func (a *scAlgo) at(s *scState, now int64) (win, e, prev, cur int64) {
	win = now / a.w
	switch {
	case win < s.win:
		return s.win, 0, s.prev, s.cur
	case win == s.win:
		prev, cur = s.prev, s.cur
	case win == s.win+1:
		prev = s.cur
	}
	return win, now - win*a.w, prev, cur
}

func (a *scAlgo) step(s *scState, now, cost int64, m stepMode) Decision {
	win, e, prev, cur := a.at(s, now)
	w, c := a.w, a.capMilli
	d := a.pol.decision()
	d.At = time.Duration(win*w + e)
	// estimate + cost <= Limit  <=>  prev*(W-e) <= (Limit-cur-cost)*W.
	if room := c - cur - cost; room >= 0 && wide.MulCmp(uint64(prev), uint64(w-e), uint64(room), uint64(w)) <= 0 {
		d.Allowed = true
		cur += cost
		if m.commits() {
			*s = scState{win: win, prev: prev, cur: cur}
		}
	} else {
		if a.refused && m.counts() {
			// Up to the limit; a count above it, in debt, stays.
			cur = max(cur, min(cur+cost, c))
			if m.commits() {
				*s = scState{win: win, prev: prev, cur: cur}
			}
		}
		d.RetryAfter = time.Duration(a.retry(e, prev, cur, cost))
	}
	switch {
	case cur > 0:
		d.ResetAfter = time.Duration(2*w - e) // 2W <= 2*maxSpan fits in int64
	case prev > 0:
		d.ResetAfter = time.Duration(w - e)
	}
	// Largest whole cost x with prev*(W-e)/W + cur + x <= Limit.
	q, r, _ := wide.MulDiv(uint64(prev), uint64(w-e), uint64(w)) // <= prev: fits
	if r != 0 {
		q++
	}
	if rem := c - cur - int64(q); rem > 0 {
		d.Remaining = rem / int64(Unit)
	}
	return d
}

// retry returns the smallest wait after which cost is admitted with nothing
// else arriving, from e ns into a window with counts prev and cur. The
// estimate only falls as time goes on, so it is the first instant that
// passes in the earliest window where any does.
func (a *scAlgo) retry(e, prev, cur, cost int64) int64 {
	w := a.w
	// This window: admitted from offset t on, where t is the smallest with
	// prev*(W-t) <= room*W, that is W-t <= floor(room*W/prev).
	if room := a.capMilli - cur - cost; room >= 0 {
		if t := firstOffset(prev, room, w); t < w {
			return max(t-e, 0)
		}
	}
	// The next window: cur becomes the previous count and nothing is
	// current. The window after that holds nothing and admits any cost.
	if t := firstOffset(cur, a.capMilli-cost, w); t < w {
		return w - e + t
	}
	return 2*w - e
}

// firstOffset returns the smallest t in [0, W] with n*(W-t) <= room*W, for
// n, room >= 0.
func firstOffset(n, room, w int64) int64 {
	if n <= room {
		return 0
	}
	fl, _, _ := wide.MulDiv(uint64(room), uint64(w), uint64(n)) // room < n: fl < W
	return w - int64(fl)
}

func (a *scAlgo) fresh(s *scState, now int64) bool {
	_, _, prev, cur := a.at(s, now)
	// A previous count still weighs (W-e)/W > 0 anywhere in the window.
	return prev == 0 && cur == 0
}

func (a *scCompactAlgo) step(s *scCompact, now, cost int64, m stepMode) (d Decision) {
	w := s.wide()
	d = a.scAlgo.step(&w, now, cost, m)
	if m.commits() {
		*s = w.compact()
	}
	return d
}

func (a *scCompactAlgo) fresh(s *scCompact, now int64) bool {
	w := s.wide()
	return a.scAlgo.fresh(&w, now)
}

// countsRefused reports whether the rule counts refused cost (see
// storeCore.refused).
func (a *scAlgo) countsRefused() bool { return a.refused }
