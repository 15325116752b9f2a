package ratelimit

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func compileSlidingLog(t require.TestingT, r SlidingLog) *slAlgo {
	a, err := r.compile()
	require.NoError(t, err)
	return a
}

// TestSlidingLogMemoryShrinks fills a log with many distinct admissions,
// lets them all expire, and checks that the next admission leaves a small
// array behind and that the idle key counts as fresh in between.
func TestSlidingLogMemoryShrinks(t *testing.T) {
	const events = 100_000
	a := compileSlidingLog(t, SlidingLog{Limit: events, Window: time.Second})
	var s slState
	for i := range int64(events) {
		d := a.step(&s, i, int64(Unit), stepCheck)
		require.True(t, d.Allowed)
	}
	require.Equal(t, events, len(s.buf))
	require.GreaterOrEqual(t, cap(s.buf), events)
	assert.False(t, a.fresh(&s, events))

	idle := int64(time.Hour)
	assert.True(t, a.fresh(&s, idle), "nothing counts after the window: a store may drop the key")
	d := a.step(&s, idle, int64(Unit), stepCheck)
	require.True(t, d.Allowed)
	assert.Equal(t, int64(events-1), d.Remaining)
	assert.Equal(t, 1, len(s.buf))
	assert.LessOrEqual(t, cap(s.buf), slMinSlots, "the burst's array is released")
}

// TestSlidingLogMemoryBound checks the documented bound on a steady stream:
// one entry per admission instant still in the window, and an array of at
// most max(16, 4 x entries) slots after every admission.
func TestSlidingLogMemoryBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 1000).Draw(t, "limit")
		window := rapid.Int64Range(1, 1000).Draw(t, "window")
		a := compileSlidingLog(t, SlidingLog{Limit: limit, Window: time.Duration(window)})
		var s slState
		var now int64
		for range rapid.IntRange(1, 3000).Draw(t, "steps") {
			now += rapid.OneOf(rapid.Int64Range(0, 3), rapid.Int64Range(0, 2*window)).Draw(t, "advance")
			cost := rapid.OneOf(rapid.Just(int64(Unit)), rapid.Int64Range(1, limit*1000)).Draw(t, "cost")
			if !a.step(&s, now, cost, stepCheck).Allowed {
				continue
			}
			n := len(s.buf)
			assert.LessOrEqual(t, int64(n), limit*1000)
			assert.LessOrEqual(t, int64(n), window, "one entry per instant in the window")
			assert.LessOrEqual(t, cap(s.buf), max(slKeepSlots, 4*n), "%d entries", n)
			for i := 1; i < n; i++ {
				require.Less(t, s.at(i-1).t, s.at(i).t, "entries are in strictly increasing time")
			}
			require.Greater(t, s.at(0).t+a.window, now, "every entry kept still counts")
		}
	})
}

// TestSlidingLogMerge checks that admissions at one instant share an entry.
func TestSlidingLogMerge(t *testing.T) {
	a := compileSlidingLog(t, SlidingLog{Limit: 1000, Window: time.Second})
	var s slState
	for range 1000 {
		require.True(t, a.step(&s, 7, int64(Unit), stepCheck).Allowed)
	}
	assert.False(t, a.step(&s, 7, 1, stepCheck).Allowed)
	assert.Equal(t, 1, len(s.buf))
}

// slSnapshot is everything a step could change: the header and the whole
// ring, including slots outside the live entries.
type slSnapshot struct {
	head, n, size int
	base          uint64
	ring          []slEvent
}

func snapshot(s *slState) slSnapshot {
	return slSnapshot{head: s.head, n: len(s.buf), size: cap(s.buf), base: s.base, ring: slices.Clone(s.buf[:cap(s.buf)])}
}

// TestSlidingLogPeekAndDenialChangeNothing checks that a step with commit
// false, on the state or on a copy of it, and a denied step, write nothing;
// that a peek predicts the committed decision exactly, as a composite limit
// relies on; and that a time earlier than the newest entry is clamped to it.
func TestSlidingLogPeekAndDenialChangeNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 50).Draw(t, "limit")
		window := rapid.Int64Range(1, 100).Draw(t, "window")
		a := compileSlidingLog(t, SlidingLog{Limit: limit, Window: time.Duration(window)})
		var s slState
		var now int64
		for range rapid.IntRange(1, 500).Draw(t, "steps") {
			now += rapid.Int64Range(-5, window).Draw(t, "advance")
			now = max(now, 0)
			cost := rapid.OneOf(rapid.Just(int64(Unit)), rapid.Int64Range(1, limit*1000)).Draw(t, "cost")
			before := snapshot(&s)
			cp := s
			peekCopy := a.step(&cp, now, cost, stepPeek)
			peek := a.step(&s, now, cost, stepPeek)
			require.Equal(t, before, snapshot(&s), "a peek writes nothing")
			require.Equal(t, peek, peekCopy, "a copy looks the same")
			if n := len(s.buf); n > 0 && now < s.at(n-1).t {
				clamped := a.step(&s, s.at(n-1).t, cost, stepPeek)
				require.Equal(t, clamped, peek, "an earlier time is the newest entry's")
			}
			got := a.step(&s, now, cost, stepCheck)
			require.Equal(t, peek, got, "a peek predicts the commit")
			if !got.Allowed {
				require.Equal(t, before, snapshot(&s), "a denial writes nothing")
			}
		}
	})
}

// TestSlidingLogRetryAfterExact checks RetryAfter and ResetAfter at the
// nanosecond: with nothing else arriving, a denied request is still denied
// 1 ns before RetryAfter and admitted at it, and the key is fresh at
// ResetAfter and not 1 ns before.
func TestSlidingLogRetryAfterExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 20).Draw(t, "limit")
		window := rapid.Int64Range(1, 1000).Draw(t, "window")
		a := compileSlidingLog(t, SlidingLog{Limit: limit, Window: time.Duration(window)})
		var s slState
		var now int64
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			now += rapid.Int64Range(0, window/3+1).Draw(t, "advance")
			cost := rapid.OneOf(rapid.Just(int64(Unit)), rapid.Int64Range(1, limit*1000)).Draw(t, "cost")
			d := a.step(&s, now, cost, stepCheck)
			if reset := int64(d.ResetAfter); reset > 0 {
				require.False(t, a.fresh(&s, now+reset-1))
				require.True(t, a.fresh(&s, now+reset))
			}
			if d.Allowed {
				continue
			}
			retry := int64(d.RetryAfter)
			require.Positive(t, retry)
			require.False(t, a.step(&s, now+retry-1, cost, stepPeek).Allowed, "denied 1 ns before RetryAfter")
			require.True(t, a.step(&s, now+retry, cost, stepPeek).Allowed, "admitted at RetryAfter")
		}
	})
}

// TestSlidingLogCumulativeWraps checks that cumulative costs may wrap around
// 2^64: a log whose running total starts just below the wrap decides exactly
// as one starting from zero.
func TestSlidingLogCumulativeWraps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 50).Draw(t, "limit")
		window := rapid.Int64Range(1, 100).Draw(t, "window")
		a := compileSlidingLog(t, SlidingLog{Limit: limit, Window: time.Duration(window)})
		var plain slState
		wrapping := slState{base: math.MaxUint64 - uint64(rapid.Int64Range(0, 3*limit*1000).Draw(t, "belowWrap"))}
		var now int64
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			now += rapid.Int64Range(0, window/2+1).Draw(t, "advance")
			cost := rapid.OneOf(rapid.Just(int64(Unit)), rapid.Int64Range(1, limit*1000)).Draw(t, "cost")
			require.Equal(t, a.step(&plain, now, cost, stepCheck), a.step(&wrapping, now, cost, stepCheck))
		}
	})
}
