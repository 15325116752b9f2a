package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterLockoutAndInFlight runs a Lockout, and an InFlight with a
// rate limit (one script over two keys of one hash tag), on a Cluster
// client of three masters beside their in-process counterparts: the same
// Decisions for keys spread over every master.
func TestClusterLockoutAndInFlight(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	clk := ratelimit.NewManualClock(unixNow)
	prefix := testPrefix()
	ctx := context.Background()

	rule := ratelimit.LockoutRule{Failures: 3, Within: time.Minute, Block: time.Hour, Growth: 2, Forget: time.Hour, Name: "login"}
	lo, err := NewLockout(rdb, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
	require.NoError(t, err)
	localLo, err := ratelimit.NewLockout(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)

	l := ratelimit.InFlightLimit{Limit: 2, MaxHold: time.Second, Name: "quote"}
	f, err := NewInFlight(rdb, l, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
	require.NoError(t, err)
	localF, err := ratelimit.NewInFlight(l, ratelimit.WithClock(clk))
	require.NoError(t, err)
	rateRule := ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 3}
	rate, err := New(rdb, rateRule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
	require.NoError(t, err)
	localRate, err := ratelimit.NewStore(rateRule, ratelimit.WithClock(clk))
	require.NoError(t, err)

	const keys = 30
	masters := map[string]bool{}
	for i := range keys {
		key := fmt.Sprintf("user-%d", i)
		slot := cl.Slot(t, f.Key(key))
		require.Equal(t, slot, cl.Slot(t, rate.Key(key)), "an InFlight's key and a Store's share a slot")
		masters[cl.Owner(t, cl.Slot(t, lo.Key(key))).Addr()] = true
	}
	require.Len(t, masters, 3, "keys on every master")
	for step := range 12 {
		for i := range keys {
			key := fmt.Sprintf("user-%d", i)
			want, wantStarted := localLo.Fail(key)
			got, started, err := lo.Fail(ctx, key)
			require.NoError(t, err)
			require.Equal(t, want, got, "step %d key %s: lockout", step, key)
			require.Equal(t, wantStarted, started)

			_, want, werr := localF.AcquireWith(ctx, key, localRate, ratelimit.Unit)
			_, got, gerr := f.AcquireWith(ctx, key, rate, ratelimit.Unit)
			require.NoError(t, werr)
			require.NoError(t, gerr)
			require.Equal(t, want, got, "step %d key %s: in-flight with a rate", step, key)
		}
		clk.Advance(time.Duration(step%4) * 300 * time.Millisecond)
	}
	assert.Zero(t, lo.Stats())
	assert.Zero(t, f.Stats())
}
