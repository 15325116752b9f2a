package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// twoLayers is a per-second burst and a per-day quota, and a shadow layer
// that is never listed.
func twoLayers() []ratelimit.Layer {
	return []ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "burst"}},
		{Rule: ratelimit.FixedWindow{Limit: 5, Window: 24 * time.Hour, Name: "daily"}},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "watch"}, Shadow: true},
	}
}

// TestCheckLayers: every enforced layer's Decision, as it stands after the
// request, beside the Decision CheckContext makes for the same trace.
func TestCheckLayers(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose(twoLayers(), ratelimit.WithClock(clk))
	require.NoError(t, err)
	twin, err := ratelimit.Compose(twoLayers(), ratelimit.WithClock(clk))
	require.NoError(t, err)
	ctx := context.Background()
	type layer struct {
		policy    string
		allowed   bool
		remaining int64
	}
	check := func(want ...layer) ratelimit.Decision {
		t.Helper()
		d, ls, err := c.CheckLayers(ctx, "k", ratelimit.Unit, 0, make([]ratelimit.Decision, 0, 1))
		require.NoError(t, err)
		td, err := twin.CheckContext(ctx, "k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, td, d, "the combined Decision is CheckContext's")
		require.Len(t, ls, len(want))
		for i, w := range want {
			assert.Equal(t, w.policy, ls[i].Policy)
			assert.Equal(t, w.allowed, ls[i].Allowed, "%s", w.policy)
			assert.Equal(t, w.remaining, ls[i].Remaining, "%s", w.policy)
		}
		return d
	}
	for i := range int64(3) {
		check(layer{"burst", true, 2 - i}, layer{"daily", true, 4 - i})
	}
	// The burst refuses; the daily quota admitted but was not spent.
	d := check(layer{"burst", false, 0}, layer{"daily", true, 2})
	assert.False(t, d.Allowed)
	clk.Advance(time.Second)
	check(layer{"burst", true, 2}, layer{"daily", true, 1})
	check(layer{"burst", true, 1}, layer{"daily", true, 0})
	// The daily quota refuses; the burst is as it stands, 1 left, fresh
	// by the next second.
	_, ls, err := c.CheckLayers(ctx, "k", ratelimit.Unit, 0, nil)
	require.NoError(t, err)
	_, _ = twin.CheckContext(ctx, "k", ratelimit.Unit)
	assert.Equal(t, int64(1), ls[0].Remaining)
	assert.Equal(t, time.Second, ls[0].ResetAfter)
	assert.False(t, ls[1].Allowed)

	// Cost errors and an ended context append nothing.
	_, ls, err = c.CheckLayers(ctx, "k", 0, 0, nil)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	assert.Empty(t, ls)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	_, ls, err = c.CheckLayers(ended, "k", ratelimit.Unit, 0, nil)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, ls)
}

// TestPlansCheckLayers: a plan of layers lists each; a plan of one rule
// lists it, named after the plan when the rule has no Name.
func TestPlansCheckLayers(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"pro":  {Layers: twoLayers()},
			"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2}},
		},
		Default: "free",
	}, func(key string) string { return key }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	_, ls, err := p.CheckLayers(context.Background(), "pro", ratelimit.Unit, 0, nil)
	require.NoError(t, err)
	require.Len(t, ls, 2)
	assert.Equal(t, "burst", ls[0].Policy)
	assert.Equal(t, "daily", ls[1].Policy)
	d, ls, err := p.CheckLayers(context.Background(), "free", ratelimit.Unit, 0, nil)
	require.NoError(t, err)
	require.Len(t, ls, 1)
	assert.Equal(t, "free", ls[0].Policy)
	assert.Equal(t, d, ls[0])
}

// TestCheckLayersWithin: with a maxDelay, a request that would wait too
// long is refused as CheckWithin refuses it, and its layers are as they
// stand.
func TestCheckLayersWithin(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	layers := []ratelimit.Layer{{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5, Name: "q"}}}
	c, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
	require.NoError(t, err)
	twin, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for range 3 {
		d, ls, err := c.CheckLayers(context.Background(), "k", ratelimit.Unit, 1500*time.Millisecond, nil)
		require.NoError(t, err)
		td, err := twin.CheckWithin("k", ratelimit.Unit, 1500*time.Millisecond)
		require.NoError(t, err)
		assert.Equal(t, td, d)
		require.Len(t, ls, 1)
	}
	d, ls, _ := c.CheckLayers(context.Background(), "k", ratelimit.Unit, 1500*time.Millisecond, nil)
	assert.False(t, d.Allowed, "the third would wait 2 s")
	assert.Equal(t, int64(3), ls[0].Remaining, "two queued, nothing spent for the third")
	assert.Zero(t, ls[0].Delay)
}
