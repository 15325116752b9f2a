package ratelimit_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestPlansResetKeyCarriesNothingIntoItsNextMove: a key whose move carried
// in more than its new plan holds (10 spent of a limit of 10, moved
// additively into a limit of 2) is reset; from then on it fares exactly as
// a key never seen, through a check on its plan and a move back: what its
// move before the reset carried in is not carried again.
func TestPlansResetKeyCarriesNothingIntoItsNextMove(t *testing.T) {
	clk := ratelimit.NewManualClock(time.Minute)
	var mu sync.Mutex
	on := map[string]string{"k": "big", "fresh": "small"}
	planOf := func(key string) string { mu.Lock(); defer mu.Unlock(); return on[key] }
	move := func(key, plan string) { mu.Lock(); defer mu.Unlock(); on[key] = plan }
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"big":   {Rule: ratelimit.FixedWindow{Limit: 10, Window: time.Hour}},
		"small": {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Hour}},
	}, Default: "big", OnMove: ratelimit.MigrateAdditive}, planOf, ratelimit.WithClock(clk))
	require.NoError(t, err)

	d, err := p.Check("k", 10*ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	move("k", "small")
	d, err = p.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, d.Allowed, "10 spent moved in whole")
	p.Reset("k")

	for _, plan := range []string{"small", "big"} {
		move("k", plan)
		move("fresh", plan)
		for i := range 12 {
			want, err := p.Check("fresh", ratelimit.Unit)
			require.NoError(t, err)
			got, err := p.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, want.Allowed, got.Allowed, "%s, check %d", plan, i)
			assert.Equal(t, want.Remaining, got.Remaining, "%s, check %d", plan, i)
		}
	}
}
