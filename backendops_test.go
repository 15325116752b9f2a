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
		p := drawMachinePair(t)
		m, lim, scale, capacity := p.m, p.lim, p.scale, p.capacity
		var state []byte
		var ats []time.Duration
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < n; i++ {
			p.move(t, true) // refunds often follow their check at once
			cost := p.cost(t, 2000)
			now := p.clk.Now()
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
			got, next := p.check(t, i, state, now, cost)
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
	for _, bad := range []string{"x", "1 2", "1 1 10001", "01 1 1", "9223372036854775807 0 0"} { // 10001: past the debt bound
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

// TestMachineSettleMatchesLimiter checks that a Machine settling and
// stepping an encoded state settles exactly what the single-key limiter
// settles, with the same Decision, and then decides exactly as it does
// (debt included), on traces of checks and settlements that charge far
// past the debt bound or refund, at admitted and arbitrary instants.
func TestMachineSettleMatchesLimiter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawMachinePair(t)
		m, lim, scale, capacity := p.m, p.lim, p.scale, p.capacity
		var state []byte
		var ats []time.Duration
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < n; i++ {
			p.move(t, true) // settlements often follow their check at once
			cost := p.cost(t, 0)
			now := p.clk.Now()
			if rapid.IntRange(0, 2).Draw(t, "settle") == 0 {
				actual := ratelimit.Units(rapid.Int64Range(1, 3*int64(capacity)+2000).Draw(t, "actual"))
				if rapid.Bool().Draw(t, "near") {
					actual = max(1, cost+ratelimit.Units(rapid.Int64Range(-2, 2).Draw(t, "delta")))
				}
				at := now
				if len(ats) > 0 && rapid.Bool().Draw(t, "admitted") {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				} else {
					at = now + time.Duration(rapid.Int64Range(-int64(scale), int64(scale)).Draw(t, "offset"))
				}
				got, x, next, err := m.Settle(state, now, at, cost, actual)
				require.NoError(t, err, "settle %d on state %q", i, state)
				if len(state) == 0 && actual <= cost {
					// Nothing held: nothing to give back, nothing to write,
					// and the limiter is not asked (its clamp stays the
					// Machine's, which records nothing).
					assert.Equal(t, cost, x)
					assert.Empty(t, next)
					want, _, err := m.Step(nil, now, cost, false)
					require.NoError(t, err)
					assert.Equal(t, want, got)
					continue
				}
				want, wx, err := ratelimit.Settle(lim, cost, actual, at)
				require.NoError(t, err)
				require.Equal(t, wx, x, "settle %d at %d of %d as %d admitted at %d, state %q", i, now, cost, actual, at, state)
				require.Equal(t, want, got, "settle %d at %d of %d as %d, state %q", i, now, cost, actual, state)
				_, _, err = m.Step(next, 0, 1, false)
				require.NoError(t, err, "state %q does not read back", next)
				state = next
				continue
			}
			got, next := p.check(t, i, state, now, cost)
			if got.Allowed {
				ats = append(ats, got.At)
			}
			state = next
		}
	})
}

func TestMachineSettleErrors(t *testing.T) {
	m, err := ratelimit.NewMachine(ratelimit.FixedWindow{Limit: 5, Window: time.Second})
	require.NoError(t, err)
	_, state, err := m.Step(nil, time.Second, 3*ratelimit.Unit, true)
	require.NoError(t, err)

	for _, c := range [][2]ratelimit.Units{{0, 1}, {-1, 1}, {1, 0}, {1, -5}} {
		_, x, next, err := m.Settle(state, time.Second, time.Second, c[0], c[1])
		assert.ErrorIs(t, err, ratelimit.ErrInvalidCost, c)
		assert.Zero(t, x)
		assert.Equal(t, state, next)
	}
	_, _, next, err := m.Settle(state, time.Second, time.Second, 6*ratelimit.Unit, ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	assert.Equal(t, state, next)
	for _, bad := range []string{"x", "1 2", "1 1 10001", "01 1 1", "9223372036854775807 0 0"} {
		d, x, next, err := m.Settle([]byte(bad), time.Second, time.Second, ratelimit.Unit, 2*ratelimit.Unit)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidState, bad)
		assert.False(t, d.Allowed)
		assert.Zero(t, x)
		assert.Equal(t, bad, string(next))
	}

	// A charge past the limit goes into debt, up to twice the limit.
	d, x, next, err := m.Settle(state, time.Second, time.Second, ratelimit.Unit, 20*ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 8*ratelimit.Unit, x, "3 in use, 1 charged: 7 more reach 10")
	assert.Equal(t, "1000000000 1 10000", string(next))
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Second, d.RetryAfter)

	// A refund gives back what Refund gives; a fresh key writes nothing.
	d, x, next, err = m.Settle(state, time.Second, time.Second, 3*ratelimit.Unit, ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Unit, x)
	assert.Equal(t, "1000000000 1 1000", string(next))
	assert.True(t, d.Allowed)
	_, x, next, err = m.Settle(nil, time.Second, time.Second, 3*ratelimit.Unit, ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 3*ratelimit.Unit, x)
	assert.Empty(t, next)
	_, x, next, err = m.Settle(nil, time.Second, time.Second, ratelimit.Unit, 7*ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 7*ratelimit.Unit, x)
	assert.Equal(t, "1000000000 1 6000", string(next))
}

// TestMachineSettleToTheLastInstant: a charge that moves a bucket's
// schedule to the last int64 instants (a rule whose twice Burst/Rate, from
// the state's instant, passes the largest int64) settles, and the state it
// writes reads back and decides as the limiter does.
func TestMachineSettleToTheLastInstant(t *testing.T) {
	rule := ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 1000, Per: 2481125}, Burst: 999999999999989}
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	const start = 4261124999999972708
	state := []byte("4261124999999972708 4261124999999972708 0")
	clk := ratelimit.NewManualClock(start)
	lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	want, wx, err := ratelimit.Settle(lim, ratelimit.Unit, 1999999999999979000, start)
	require.NoError(t, err)
	got, x, next, err := m.Settle(state, start, start, ratelimit.Unit, 1999999999999979000)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, wx, x)
	assert.Equal(t, "4261124999999972708 9223372036854775805 4108", string(next))
	for _, now := range []time.Duration{start, start + 1, ratelimit.MaxTime} {
		clk.Set(now)
		want, err := lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		got, after, err := m.Step(next, now, ratelimit.Unit, true)
		require.NoError(t, err, "state %q does not read back", next)
		assert.Equal(t, want, got, "at %d", now)
		assert.False(t, got.Allowed)
		next = after
	}
	assert.Equal(t, "4611686018427387904 9223372036854775805 4108", string(next))
}
