package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// TestMachineRefundMatchesLimiter checks that a Machine refunding and
// stepping an encoded state gives back exactly what the single-key limiter
// gives back, and then decides exactly as it does, on the same trace of
// checks, refunds at admitted and arbitrary instants, and clock readings
// that leap years or go back.
func TestMachineRefundMatchesLimiter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rule, scale := drawMachineRule(t)
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, int64(ratelimit.MaxTime)).Draw(t, "start")))
		lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		capacity := m.Params().Capacity
		var state []byte
		var ats []time.Duration
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < n; i++ {
			switch rapid.IntRange(0, 9).Draw(t, "move") {
			case 0:
				clk.Set(clk.Now() - time.Duration(rapid.Int64Range(0, int64(scale)).Draw(t, "back")))
			case 1:
				clk.Advance(time.Duration(rapid.Int64Range(0, int64(10*year)).Draw(t, "leap")))
			case 2, 3:
				// Refunds often follow their check at once.
			default:
				clk.Advance(time.Duration(rapid.Int64Range(0, int64(scale)/4+1).Draw(t, "gap")))
			}
			cost := ratelimit.Units(rapid.Int64Range(1, int64(capacity)+2000).Draw(t, "cost"))
			if rapid.IntRange(0, 3).Draw(t, "whole") == 0 {
				cost = min(capacity, ratelimit.Unit*ratelimit.Units(rapid.Int64Range(1, 3).Draw(t, "units")))
			}
			now := clk.Now()
			if rapid.Bool().Draw(t, "refund") {
				at := now
				switch {
				case len(ats) > 0 && rapid.IntRange(0, 3).Draw(t, "admitted") > 0:
					at = rapid.SampledFrom(ats).Draw(t, "at")
				default:
					at = now + time.Duration(rapid.Int64Range(-int64(scale), int64(scale)).Draw(t, "offset"))
				}
				got, next, err := m.Refund(state, now, at, cost)
				require.NoError(t, err, "refund %d on state %q", i, state)
				if len(state) == 0 {
					// A key no check has touched holds nothing: the
					// limiter is not asked, so that its clamp stays the
					// Machine's (which records nothing for it).
					assert.Zero(t, got)
					assert.Empty(t, next)
					continue
				}
				want, err := ratelimit.Refund(lim, cost, at)
				require.NoError(t, err)
				require.Equal(t, want, got, "refund %d at %d of %d admitted at %d, state %q", i, now, cost, at, state)
				_, _, err = m.Step(next, 0, 1, false)
				require.NoError(t, err, "state %q does not read back", next)
				state = next
				continue
			}
			cost = min(cost, capacity)
			want, err := lim.Check(cost)
			require.NoError(t, err)
			got, next, err := m.Step(state, now, cost, true)
			require.NoError(t, err, "step %d on state %q", i, state)
			require.Equal(t, want, got, "step %d at %d, cost %d, state %q", i, now, cost, state)
			if got.Allowed {
				ats = append(ats, got.At)
			}
			state = next
		}
	})
}

func TestMachineRefundErrors(t *testing.T) {
	m, err := ratelimit.NewMachine(ratelimit.FixedWindow{Limit: 5, Window: time.Second})
	require.NoError(t, err)
	_, state, err := m.Step(nil, time.Second, 3*ratelimit.Unit, true)
	require.NoError(t, err)

	for _, cost := range []ratelimit.Units{0, -1} {
		g, next, err := m.Refund(state, time.Second, time.Second, cost)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
		assert.Zero(t, g)
		assert.Equal(t, state, next)
	}
	for _, bad := range []string{"x", "1 2", "1 1 10001", "01 1 1", "9223372036854775807 0 0"} { // 10001: past twice the limit, the most a debt holds
		g, next, err := m.Refund([]byte(bad), time.Second, time.Second, ratelimit.Unit)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidState, bad)
		assert.Zero(t, g)
		assert.Equal(t, bad, string(next))
	}

	// A cost above the capacity is capped; an at after now is now; the
	// state records the later of now and its own latest instant.
	g, next, err := m.Refund(state, time.Second+time.Millisecond, time.Hour, 100*ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 3*ratelimit.Unit, g)
	assert.Equal(t, "1001000000 1 0", string(next))
	g, next, err = m.Refund(state, 0, time.Second, ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Unit, g)
	assert.Equal(t, "1000000000 1 2000", string(next), "a now before the state's latest instant is raised to it")

	// Nothing held, nothing given: the state still records the instant.
	g, next, err = m.Refund(state, 2*time.Second, time.Second, ratelimit.Unit)
	require.NoError(t, err)
	assert.Zero(t, g)
	assert.Equal(t, "2000000000 1 3000", string(next))

	// A fresh key gives nothing and writes nothing.
	g, next, err = m.Refund(nil, time.Second, time.Second, ratelimit.Unit)
	require.NoError(t, err)
	assert.Zero(t, g)
	assert.Empty(t, next)
}
