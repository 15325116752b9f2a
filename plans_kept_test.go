package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestPlansKeyOutlivesMoreKeepingUpdatesThanReplacedPlans: a key spends its
// limit, more Updates than the replaced plans a rule set keeps leave its
// plan's rule (and so its store) as it is, and a later Update changes the
// rule: the key moves out of the kept store spent, rather than starting
// fresh, whether or not it was checked in between (a check of a key its
// plan's store holds leaves its record as it is).
func TestPlansKeyOutlivesMoreKeepingUpdatesThanReplacedPlans(t *testing.T) {
	set := func(limit int64) ratelimit.PlanSet {
		return ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
			"p": {Rule: ratelimit.FixedWindow{Limit: limit, Window: time.Hour}},
		}, Default: "p"}
	}
	for _, between := range []bool{false, true} {
		clk := ratelimit.NewManualClock(0)
		p, err := ratelimit.NewPlans(set(10), nil, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for range 10 {
			d, err := p.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		for range 70 { // more than the 64 replaced plans a rule set keeps
			require.NoError(t, p.Update(set(10), ratelimit.MigrateAsIs)) // the same rule: the store is kept
			if between {
				d, err := p.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.False(t, d.Allowed, "the kept store holds the key, spent")
			}
		}
		require.NoError(t, p.Update(set(20), ratelimit.MigrateAsIs)) // none of 10 left is none of 20 left
		d, err := p.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.False(t, d.Allowed, "checked in between: %v", between)
	}
}
