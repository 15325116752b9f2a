package ratelimit

import "time"

// FixedWindow counts admitted cost in fixed windows [kW, (k+1)W) of the
// limiter's clock, W being Window, and admits a request of cost c iff the
// window's count plus c is at most Limit. The count starts from zero at
// every window boundary, so up to twice Limit can pass in a span of Window
// that straddles a boundary: Limit at the end of one window and Limit again
// at the start of the next.
//
// Limit is in whole units, from 1 to 1e15; Window must be positive and less
// than [MaxTime]. Window boundaries are multiples of Window from the clock's
// origin (for [SystemClock], the start of the process), not wall-clock
// minutes or hours.
//
// A denied request's RetryAfter is the time to the end of the current
// window, when the count starts again from zero; every Decision's ResetAfter
// is that same time, since a check is only ever refused in a window where
// something was admitted. Per-key state is 16 bytes.
type FixedWindow struct {
	Limit  int64
	Window time.Duration
	Name   string // optional: reported as Decision.Policy
}

// fwState is the count of the window with index win. The zero value is a
// fresh key: window 0 with nothing counted.
type fwState struct {
	win   int64 // window index: the window is [win*W, (win+1)*W)
	count int64 // milli-units admitted in that window: up to 2 Limit, with debt
}

// fwAlgo is a compiled FixedWindow rule.
type fwAlgo struct {
	w int64 // window length in ns
	ruleBase
}

// compileWindow validates the Limit and Window fields shared by the window
// rules, returning the rule's base and the window in ns.
func compileWindow(rule, name string, limit int64, window time.Duration) (ruleBase, int64, error) {
	cm, err := capacityMilli(rule, "Limit", limit)
	if err != nil {
		return ruleBase{}, 0, err
	}
	switch {
	case window <= 0:
		return ruleBase{}, 0, &RuleError{Rule: rule, Field: "Window", Reason: "must be positive"}
	case int64(window) > maxSpan:
		return ruleBase{}, 0, &RuleError{Rule: rule, Field: "Window", Reason: "must be less than MaxTime"}
	}
	return ruleBase{capMilli: cm, pol: policy{name: name, limit: limit, window: window}}, int64(window), nil
}

func (r FixedWindow) compile() (*fwAlgo, error) {
	b, w, err := compileWindow("FixedWindow", r.Name, r.Limit, r.Window)
	if err != nil {
		return nil, err
	}
	return &fwAlgo{w: w, ruleBase: b}, nil
}

func (r FixedWindow) bind() (binding, error) { return bindRule[fwState](r.compile()) }

// at returns the window index for now and the count that applies in it. A
// now before the state's window is moved to the start of that window: the
// state keeps no finer notion of its own time.
func (a *fwAlgo) at(s *fwState, now int64) (win, now2, count int64) {
	win = now / a.w
	if win <= s.win {
		if win < s.win {
			win, now = s.win, s.win*a.w
		}
		return win, now, s.count
	}
	return win, now, 0
}

func (a *fwAlgo) step(s *fwState, now, cost int64, m stepMode) Decision {
	// A count in a later window than now's (a key moved in by a Plans, see
	// fwAlgo.withSpent) holds until that window ends.
	asked := now
	win, now, count := a.at(s, now)
	d := a.pol.decision()
	d.At = time.Duration(now)
	// win*W <= now <= MaxTime and W <= maxSpan, so the window's end fits.
	left := (win+1)*a.w - asked
	if count+cost <= a.capMilli { // both <= 1e18: no overflow
		d.Allowed = true
		count += cost
		if m.commits() {
			*s = fwState{win: win, count: count}
		}
	} else {
		d.RetryAfter = time.Duration(left)
	}
	// The count is positive here, admitted or not (a denied cost is at most
	// the limit, so the count was already above zero), and falls to zero
	// only when the window ends.
	d.ResetAfter = time.Duration(left)
	d.Remaining = max(a.capMilli-count, 0) / int64(Unit) // none in debt (Store.Settle)
	return d
}

func (a *fwAlgo) fresh(s *fwState, now int64) bool {
	_, _, count := a.at(s, now)
	return count == 0
}
