package ratelimit

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A lock-free GCRA check overtaken by others between its clock read and its
// CAS must still report what some order of the checks could: never a
// negative Remaining, never a wait longer than the burst's span.
func TestAtomicGCRAOvertakenChecksStayInBounds(t *testing.T) {
	clk := NewManualClock(time.Second)
	lim, err := New(GCRA{Rate: PerSecond(1_000_000), Burst: 2}, WithClock(clk))
	require.NoError(t, err)
	l := lim.(*atomicGCRA)
	// Deterministically: this check read the clock at 1 s; meanwhile the
	// clock moved on 10 ms and others spent the whole burst.
	stale := int64(time.Second)
	clk.Advance(10 * time.Millisecond)
	for i := 0; i < 2; i++ {
		_, err := lim.Check(Unit)
		require.NoError(t, err)
	}
	s, at, admitted := l.spend(stale, int64(Unit))
	require.False(t, admitted)
	var d Decision
	l.alg.schedule(&d, &s, at, int64(Unit), false)
	assert.GreaterOrEqual(t, d.Remaining, int64(0))
	assert.LessOrEqual(t, d.RetryAfter, 2*time.Microsecond)
	assert.LessOrEqual(t, d.ResetAfter, 2*time.Microsecond)

	// And under real contention on the system clock.
	lim, err = New(GCRA{Rate: PerSecond(1_000_000), Burst: 2})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20_000; i++ {
				d, err := lim.Check(Unit)
				if err != nil || d.Remaining < 0 || d.Remaining > 2 || d.RetryAfter > 2*time.Microsecond || d.ResetAfter > 2*time.Microsecond {
					t.Errorf("out of bounds: %+v %v", d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A composite must record its one instant in every shard it locked: a key
// stepped at that instant is never stepped at an earlier one afterwards,
// even when its next check pairs it with a shard whose own time is behind.
func TestCompositeNeverStepsAKeyBackInTime(t *testing.T) {
	clk := NewManualClock(0)
	c, err := Compose([]Layer{
		{Rule: GCRA{Rate: PerSecond(1), Burst: 2, Name: "user"}, Key: func(k string) string { u, _, _ := strings.Cut(k, "|"); return u }},
		{Rule: GCRA{Rate: PerSecond(1000), Burst: 1000, Name: "route"}, Key: func(k string) string { _, r, _ := strings.Cut(k, "|"); return r }},
	}, WithClock(clk), WithShards(16), WithMaxKeys(1<<16))
	require.NoError(t, err)
	users, routes := c.layers[0].store, c.layers[1].store
	shardOf := func(s keyedStore, key string) int { return s.shardIndex(s.prepare(key)) }
	// Routes hi and lo in different shards of the route layer; users x and
	// k in different shards of the user layer.
	hi, lo := "r0", ""
	for i := 1; lo == ""; i++ {
		if r := "r" + strings.Repeat("x", i); shardOf(routes, r) != shardOf(routes, hi) {
			lo = r
		}
	}
	x, k := "x", ""
	for i := 1; k == ""; i++ {
		if u := "u" + strings.Repeat("y", i); shardOf(users, u) != shardOf(users, x) {
			k = u
		}
	}
	clk.Set(10 * time.Second)
	_, err = c.Check(x+"|"+hi, Unit) // hi's shard reaches 10 s
	require.NoError(t, err)
	clk.Set(0) // a clock that steps back: clamped to 10 s through hi's shard
	for i := 0; i < 2; i++ {
		d, err := c.Check(k+"|"+hi, Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	// k's burst is spent as of 10 s; lo's shard has seen nothing.
	d, err := c.Check(k+"|"+lo, Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, int64(0), d.Remaining)
	assert.Equal(t, time.Second, d.RetryAfter)
	assert.Equal(t, 2*time.Second, d.ResetAfter)
}
