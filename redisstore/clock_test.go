package redisstore

import (
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClockStepsBackPerKey: with a client clock that steps back, each key
// clamps to its own latest instant, as a single-key limiter does; the
// in-process Store clamps per shard, and decides a key checked for the
// first time after the step at its shard's latest instant (see the Time
// sections of both docs).
func TestClockStepsBackPerKey(t *testing.T) {
	rdb := needRedis(t)
	const s = time.Second
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}
	clk := ratelimit.NewManualClock(unixNow + 10*s)
	st, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	local, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithShards(1))
	require.NoError(t, err)
	for _, k := range []string{"a", "b"} {
		d, err := st.Check(k, ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		_, err = local.Check(k, ratelimit.Unit)
		require.NoError(t, err)
		clk.Set(unixNow + 9*s) // b's first check comes after the clock stepped back
	}
	clk.Set(unixNow + 9*s + s/2)
	d, err := st.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Decision{Limit: 1, RetryAfter: s / 2, ResetAfter: s / 2, At: unixNow + 9*s + s/2, Window: s}, d, "b alone")
	d, err = local.Check("b", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Decision{Limit: 1, RetryAfter: s, ResetAfter: s, At: unixNow + 10*s, Window: s}, d, "b in its shard")
	d, err = st.Check("a", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, unixNow+10*s, d.At, "a clamps to its own latest instant")
}
