package ratelimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestLockoutMachineMatchesLockout steps a LockoutMachine on its own
// encoded state beside an in-process Lockout on random traces: every
// Decision and every started flag is the same, field for field, and every
// state the machine writes reads back.
func TestLockoutMachineMatchesLockout(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rule := drawLockoutRule(t)
		clk := ratelimit.NewManualClock(0)
		lo, err := ratelimit.NewLockout(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		m, err := ratelimit.NewLockoutMachine(rule)
		require.NoError(t, err)
		states := map[string][]byte{}
		keys := []string{"a", "b"}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.OneOf(rapid.Int64Range(0, 60),
					rapid.Int64Range(0, int64(ratelimit.MaxTime)/3)).Draw(t, "by")))
			},
			"check": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				want := lo.Check(k)
				got, next, started, err := m.Step(states[k], clk.Now(), false)
				require.NoError(t, err)
				assert.Equal(t, want, got)
				assert.False(t, started)
				assert.Equal(t, states[k], next)
			},
			"fail": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				want, wantStarted := lo.Fail(k)
				got, next, started, err := m.Step(states[k], clk.Now(), true)
				require.NoError(t, err)
				assert.Equal(t, want, got)
				assert.Equal(t, wantStarted, started)
				states[k] = next
			},
			"reset": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				lo.Reset(k)
				delete(states, k)
			},
		})
	})
}

// TestLockoutMachineRefusesBadStates checks that a state no rule could
// have written is an error matching ErrInvalidState, with a refusal.
func TestLockoutMachineRefusesBadStates(t *testing.T) {
	m, err := ratelimit.NewLockoutMachine(ratelimit.LockoutRule{Failures: 3, Within: time.Minute, Block: time.Hour})
	require.NoError(t, err)
	for _, state := range []string{
		"x", "10 5", "10 0 5", "10 5 0", "10 0 0 1",
		"10 0 0 1 1000 2 2000", // three failures: the third would have started a block
		"10 0 0 5 1000 4 1000", // out of order
		"10 0 0 11 1000",       // later than the latest instant
		"10 0 0 5 500",         // half a failure
		"10 99999999999999999999 1",
	} {
		d, _, _, err := m.Step([]byte(state), 10, true)
		assert.True(t, errors.Is(err, ratelimit.ErrInvalidState), "state %q: %v", state, err)
		assert.False(t, d.Allowed, "state %q", state)
	}
	_, _, _, err = m.Step([]byte("10 0 0 4 1000 9 1000"), 10, true)
	assert.NoError(t, err)
}
