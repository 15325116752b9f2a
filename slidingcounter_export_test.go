package ratelimit

// SetSlidingCounterCompactCap sets the largest capacity, in milli-units,
// of a SlidingCounter whose keys are kept in the compact state, for rules
// bound from then on (0: none), and returns a function that restores it.
func SetSlidingCounterCompactCap(c int64) (restore func()) {
	old := scCompactCap
	scCompactCap = c
	return func() { scCompactCap = old }
}

// SlidingCounterState reports which state a rule's keys are kept in:
// "compact" (16 bytes), "wide" (24 bytes), or "" for a rule that does not
// bind.
func SlidingCounterState(r SlidingCounter) string {
	b, err := r.bind()
	if err != nil {
		return ""
	}
	switch b.(type) {
	case bound[scCompact, *scCompactAlgo]:
		return "compact"
	case bound[scState, *scAlgo]:
		return "wide"
	}
	return ""
}
