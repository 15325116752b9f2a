package ratelimit_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// machinePlans is a key of a rule set of plans of one rule each, kept as a
// backend keeps it: the plan that holds the key, its encoded state and its
// move record, moved with MoveState when the key's plan changes.
type machinePlans struct {
	machines []*ratelimit.Machine
	policy   ratelimit.Migration
	held     int // -1: none
	state    []byte
	record   []byte
}

func (mp *machinePlans) check(t *rapid.T, plan int, now time.Duration, cost ratelimit.Units) ratelimit.Decision {
	if mp.held >= 0 && mp.held != plan {
		mv, err := ratelimit.MoveState(mp.machines[mp.held], mp.machines[plan], mp.policy, mp.state, mp.record, now)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, mv.At, now)
		if len(mv.State) > 0 {
			assert.Greater(t, mv.Whole, mv.At, "a moved state is whole later than the move")
		}
		mp.state, mp.record = mv.State, mv.Record
	}
	mp.held = plan
	d, next, err := mp.machines[plan].Step(mp.state, now, cost, true)
	require.NoError(t, err)
	mp.state = next
	if d.Policy == "" {
		d.Policy = strconv.Itoa(plan)
	}
	return d
}

// TestMoveStateMatchesPlans: a key kept as a backend keeps it, moved with
// MoveState, gets the in-process Plans' Decisions, field for field, on the
// same trace of checks and plan switches, for every algorithm and policy,
// on a clock that starts at its zero (as virtual clocks do), within a
// window of it, or a day from it.
func TestMoveStateMatchesPlans(t *testing.T) {
	rapid.Check(t, checkMoveStateMatchesPlans)
}

// FuzzMoveStateMatchesPlans is TestMoveStateMatchesPlans as a fuzz target.
func FuzzMoveStateMatchesPlans(f *testing.F) {
	f.Fuzz(rapid.MakeFuzz(checkMoveStateMatchesPlans))
}

func checkMoveStateMatchesPlans(t *rapid.T) {
	start := rapid.SampledFrom([]time.Duration{0, 1, 7 * time.Minute, 24 * time.Hour}).Draw(t, "start")
	mk := newMovingKeyAt(t, start, 0, ratelimit.MigrateProportional, ratelimit.MigrateAsIs, ratelimit.MigrateAdditive, ratelimit.MigrateReset)
	mp := &machinePlans{policy: mk.policy, held: -1}
	for _, r := range mk.plans {
		m, err := ratelimit.NewMachine(r.rule)
		require.NoError(t, err)
		mp.machines = append(mp.machines, m)
	}
	next := mk.schedule(t)
	for i := range rapid.IntRange(1, 40).Draw(t, "requests") {
		plan, gap := next(i)
		mk.clk.Advance(gap)
		mk.on = strconv.Itoa(plan)
		c := rapid.Int64Range(1, mk.plans[plan].capacity).Draw(t, "cost")
		cost := ratelimit.Units(c) * ratelimit.Unit
		want, err := mk.p.Check("k", cost)
		require.NoError(t, err)
		got := mp.check(t, plan, mk.clk.Now(), cost)
		require.Equal(t, want, got, "request %d on plan %d at %v", i, plan, mk.clk.Now())
	}
}

// TestMoveStateIntoSlidingLogNearClockZero: a move into a sliding log less
// than a window from the clock's zero logs nothing before zero (the log
// once started its admissions up to a window before now, which no state
// can hold: the move failed, and a backend's next move of the key refused
// its state as ErrInvalidState). What it logs holds the key to no more
// than the amount moved in admits, and moves on again.
func TestMoveStateIntoSlidingLogNearClockZero(t *testing.T) {
	const w = 10 * time.Minute
	log, err := ratelimit.NewMachine(ratelimit.SlidingLog{Limit: 4, Window: w})
	require.NoError(t, err)
	for _, from := range []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.Rate{Count: 4, Per: w}, Burst: 4},
		ratelimit.FixedWindow{Limit: 4, Window: w},
		ratelimit.SlidingLog{Limit: 4, Window: 2 * w},
	} {
		src, err := ratelimit.NewMachine(from)
		require.NoError(t, err)
		for _, now := range []time.Duration{0, 1, time.Minute, w - 1} {
			name := fmt.Sprintf("%T at %v", from, now)
			_, state, err := src.Step(nil, now, 3*ratelimit.Unit, true)
			require.NoError(t, err, name)
			mv, err := ratelimit.MoveState(src, log, ratelimit.MigrateProportional, state, nil, now)
			require.NoError(t, err, name)
			require.NotEmpty(t, mv.State, name)
			d, _, err := log.Step(mv.State, mv.At, 2*ratelimit.Unit, false)
			require.NoError(t, err, name)
			assert.False(t, d.Allowed, "%s: 3 of 4 moved in leave 1", name)
			d, _, err = log.Step(mv.State, mv.At, ratelimit.Unit, false)
			require.NoError(t, err, name)
			assert.True(t, d.Allowed, name)
			back, err := ratelimit.MoveState(log, src, ratelimit.MigrateProportional, mv.State, mv.Record, mv.At)
			require.NoError(t, err, "%s: the moved state moves on", name)
			d, _, err = src.Step(back.State, back.At, 2*ratelimit.Unit, false)
			require.NoError(t, err, name)
			assert.False(t, d.Allowed, "%s: and keeps what it holds", name)
		}
	}
}

// TestMoveStateRefusesBadInput: a record or state that no move could have
// written is ErrInvalidState, an unknown policy ErrInvalidOption; neither
// panics.
func TestMoveStateRefusesBadInput(t *testing.T) {
	from, err := ratelimit.NewMachine(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10})
	require.NoError(t, err)
	to, err := ratelimit.NewMachine(ratelimit.FixedWindow{Limit: 5, Window: time.Second})
	require.NoError(t, err)
	state := []byte("1000 2000000000 0")
	for _, rec := range []string{
		"x", "1 2 3", "1 9 1000 1000", "1 2 3 4 5", "5 5 1000 1000 0 0", "5 4 1000 1000 0 0", "1 9 1000 2000 0 0",
		"1 9 1000 0 0 0", "1 9 100000 20000 0 0", "4611686018427387905 4611686018427387906 1 1 0 0",
		"01 9 1 1 0 0", "1  9 1 1 0 0", "1 9 1000 1000 9 5", "1 9 1000 1000 1 5", "1 9 1000 1000 -1 0",
		"1 9 -5 1000 3 2000", "1 9 500 1000 3 400", "1 9 1000 1000 3 4611686018427387905", "1 9 1000 1000 0 0 0",
	} {
		_, err := ratelimit.MoveState(from, to, ratelimit.MigrateProportional, state, []byte(rec), time.Second)
		assert.True(t, errors.Is(err, ratelimit.ErrInvalidState), "record %q: %v", rec, err)
	}
	for _, st := range []string{"x", "1 2", "1 99999999999999999999 0", "1 2 3 4"} {
		_, err := ratelimit.MoveState(from, to, ratelimit.MigrateProportional, []byte(st), nil, time.Second)
		assert.True(t, errors.Is(err, ratelimit.ErrInvalidState), "state %q: %v", st, err)
	}
	_, err = ratelimit.MoveState(from, to, ratelimit.Migration(9), state, nil, time.Second)
	assert.True(t, errors.Is(err, ratelimit.ErrInvalidOption))
	mv, err := ratelimit.MoveState(from, to, ratelimit.MigrateProportional, state, []byte("1 4000000000 6000 9000 3000000000 3000"), time.Second)
	require.NoError(t, err)
	assert.NotEmpty(t, mv.State)
	assert.NotEmpty(t, mv.Record)
	_, _, err = to.Step(mv.State, mv.At, ratelimit.Unit, true)
	assert.NoError(t, err, "a moved state reads back")
}

// TestPlansKeyOutlivesUpdatesThatKeepItsStore: a key spent under a plan
// that one Update keeps and the next replaces moves with what it spent:
// the plan its record names, whose store the first Update kept, is still
// found when the second replaces that store.
func TestPlansKeyOutlivesUpdatesThatKeepItsStore(t *testing.T) {
	clk := ratelimit.NewManualClock(time.Hour)
	set := func(free, pro ratelimit.Rule) ratelimit.PlanSet {
		return ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{"free": {Rule: free}, "pro": {Rule: pro}}}
	}
	bucket := ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1}
	p, err := ratelimit.NewPlans(set(bucket, bucket), nil, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	for i := range 3 { // Updates that keep the key's plan
		require.NoError(t, p.Update(set(bucket, ratelimit.GCRA{Rate: ratelimit.PerHour(int64(2 + i)), Burst: 2}), ratelimit.MigrateProportional))
	}
	renamed := bucket
	renamed.Name = "free"
	require.NoError(t, p.Update(set(renamed, bucket), ratelimit.MigrateProportional))
	d, err = p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the key started fresh: %+v", d)
}

// TestPlansUpdateThatKeepsStoresKeepsCarry: an Update that keeps every
// store of a key's plan does not move the key, so the key keeps what its
// last move carried in: its next move gives back no more than it would
// have without the Update.
func TestPlansUpdateThatKeepsStoresKeepsCarry(t *testing.T) {
	t0 := time.Duration(1780000000) * time.Second
	tb := func(c int64, per time.Duration) ratelimit.Rule {
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: c, Per: per}, Burst: c}
	}
	team := ratelimit.Plan{Rule: tb(1, 2*time.Second)}
	pro := ratelimit.Plan{Layers: []ratelimit.Layer{{Rule: tb(2, time.Second)}, {Rule: tb(1, time.Second), Shadow: true}}}
	free := ratelimit.Plan{Rule: tb(1, time.Second)}
	var got []ratelimit.Decision
	for _, update := range []bool{false, true} {
		clk := ratelimit.NewManualClock(t0)
		on := "team"
		set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{"free": free, "pro": pro, "team": team}}
		p, err := ratelimit.NewPlans(set, func(string) string { return on }, ratelimit.WithClock(clk))
		require.NoError(t, err)
		_, err = p.Check("a", ratelimit.Unit)
		require.NoError(t, err)
		on = "pro"
		// A cost above the shadow layer's capacity: it sits the move out.
		d, err := p.Check("a", 2*ratelimit.Unit)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		if update {
			require.NoError(t, p.Update(set, ratelimit.MigrateProportional)) // the same rules
		}
		_, err = p.Check("a", ratelimit.Unit) // the shadow layer takes part now
		require.NoError(t, err)
		clk.Advance(1)
		on = "free"
		d, err = p.Check("a", ratelimit.Unit)
		require.NoError(t, err)
		got = append(got, d)
	}
	assert.Equal(t, got[0], got[1], "an Update of the same rules changed the move")
	assert.Equal(t, time.Second, got[1].RetryAfter, "the team plan's debt, carried through pro")
}

// TestMachineFresh: a state is fresh once its rule has given back all it
// holds, as the store's own test of a droppable entry says.
func TestMachineFresh(t *testing.T) {
	m, err := ratelimit.NewMachine(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2})
	require.NoError(t, err)
	_, spent, err := m.Step(nil, time.Second, ratelimit.Unit, true)
	require.NoError(t, err)
	for _, c := range []struct {
		state string
		at    time.Duration
		fresh bool
	}{
		{"", time.Second, true},
		{string(spent), time.Second, false},
		{string(spent), 2*time.Second - 1, false},
		{string(spent), 2 * time.Second, true},
	} {
		got, err := m.Fresh([]byte(c.state), c.at)
		require.NoError(t, err)
		assert.Equal(t, c.fresh, got, "%q at %v", c.state, c.at)
	}
	_, err = m.Fresh([]byte("1 x"), time.Second)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidState)
}
