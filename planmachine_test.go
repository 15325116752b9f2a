package ratelimit_test

import (
	"errors"
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
// same trace of checks and plan switches, for every algorithm and policy.
func TestMoveStateMatchesPlans(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mk := newMovingKey(t, 0, ratelimit.MigrateProportional, ratelimit.MigrateAsIs, ratelimit.MigrateAdditive, ratelimit.MigrateReset)
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
	})
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
