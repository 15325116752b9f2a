package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestCostErrorsSayTheNumbers: a cost error names the cost, the capacity
// and the rule, and still matches its sentinel.
func TestCostErrorsSayTheNumbers(t *testing.T) {
	named, err := ratelimit.New(ratelimit.FixedWindow{Limit: 20, Window: time.Second, Name: "api"})
	require.NoError(t, err)
	_, err = named.Check(21 * ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	assert.Contains(t, err.Error(), `cost 21 exceeds the capacity 20 of rule "api"`)

	s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2})
	require.NoError(t, err)
	_, err = s.Check("k", 2*ratelimit.Unit+ratelimit.Unit/2)
	require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	assert.Contains(t, err.Error(), "cost 2.5 exceeds the capacity 2 of the rule")
	_, err = s.Check("k", 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	assert.Contains(t, err.Error(), "cost 0 is not positive")

	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Second, Name: "wide"}},
		{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "narrow"}},
	})
	require.NoError(t, err)
	_, err = c.Check("k", 4*ratelimit.Unit)
	var ce *ratelimit.CostError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, ratelimit.CostError{Cost: 4 * ratelimit.Unit, Capacity: 3 * ratelimit.Unit, Policy: "narrow"}, *ce)
}
