package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCircuitBounded: a circuit keeps at most maxMasters breakers by
// address; when full it drops the closed ones, and keeps those that are
// open or counting failures.
func TestCircuitBounded(t *testing.T) {
	c := newCircuit(nil, false)
	a := c.byAddr("a")
	assert.Same(t, a, c.byAddr("a"))
	now := time.Now()
	a.failure(now, false, 1, time.Hour)
	require.True(t, a.open())
	b := c.byAddr("b")
	b.failure(now, false, 5, time.Hour) // counting, not open
	for i := range maxMasters - 2 {
		c.byAddr(strconv.Itoa(i))
	}
	assert.Len(t, *c.masters.Load(), maxMasters)
	n := c.byAddr("new")
	assert.NotSame(t, &c.one, n)
	assert.Len(t, *c.masters.Load(), 3, "the closed breakers were not dropped")
	assert.Same(t, a, c.byAddr("a"), "an open breaker was dropped")
	assert.Same(t, b, c.byAddr("b"), "a breaker counting failures was dropped")
	assert.True(t, c.byAddr("a").open())

	// Full of open breakers: a new master shares the one breaker.
	for i := range maxMasters - 3 {
		c.byAddr("x"+strconv.Itoa(i)).failure(now, false, 1, time.Hour)
	}
	n.failure(now, false, 1, time.Hour)
	assert.Same(t, &c.one, c.byAddr("more"))
}

// TestBreakerOneProbe: when an open circuit's pause has passed, of the
// checks that read it so at once, exactly one probes Redis; the others,
// and checks that read it after, fail fast until the probe answers.
func TestBreakerOneProbe(t *testing.T) {
	var b breaker
	now := time.Now()
	b.failure(now.Add(-time.Hour), false, 1, time.Minute)
	require.True(t, b.open())
	// Three checks read the circuit before any of them moves it on.
	read := b.openUntil.Load()
	lets := 0
	for i := range 3 {
		probe, ok := b.allowRead(read, now, time.Second)
		assert.Equal(t, ok, probe, "check %d", i)
		if ok {
			lets++
		}
	}
	assert.Equal(t, 1, lets, "checks let through to probe a dead Redis")
	_, ok := b.allow(now, time.Second)
	assert.False(t, ok, "a check after the probe was let through")
	_, ok = b.allow(now.Add(time.Second), time.Second)
	assert.True(t, ok, "no probe once the probe's pause has passed")
}
