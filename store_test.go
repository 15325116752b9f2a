package ratelimit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

func TestStoreSmoke(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for i := range 21 {
		d, err := s.Check("a", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, i < 20, d.Allowed)
	}
	d, err := s.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, 2, s.Len())
}
