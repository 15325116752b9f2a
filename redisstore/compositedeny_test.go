package redisstore

import (
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// denyLayers are the layer sets the Composite's deny cache tests run: a
// global layer every request key shares, a per-customer one and a
// per-request one, of several algorithms.
func denyLayers() map[string][]Layer {
	all := func(string) string { return "all" }
	return map[string][]Layer{
		"buckets": {
			{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(30), Burst: 12, Name: "global"}, Key: all}},
			{Layer: ratelimit.Layer{Rule: ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: time.Second}, Burst: 5, Name: "customer"}, Key: firstField}},
			{Layer: ratelimit.Layer{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 5, Name: "route"}}},
		},
		"windows": {
			{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 12, Window: time.Second, Name: "global"}, Key: all}},
			{Layer: ratelimit.Layer{Rule: ratelimit.SlidingLog{Limit: 5, Window: time.Second, Name: "customer"}, Key: firstField}},
			{Layer: ratelimit.Layer{Rule: ratelimit.SubWindow{Limit: 6, Window: 3 * time.Second, Buckets: 3, Name: "route"}}},
		},
		"mixed": {
			{Layer: ratelimit.Layer{Rule: ratelimit.SlidingCounter{Limit: 12, Window: time.Second, Name: "global"}, Key: all}},
			{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5, Name: "customer"}, Key: firstField}},
		},
	}
}

// TestCompositeDenyCacheOtherSpender: one process checks through its
// Composite's deny cache while another, without one, spends on the same
// request key and on others that share its global and per-customer
// layers, both with costs of several sizes. Every refusal the cache
// answers reaches no server (no script is sent) and is one Redis gives at
// that instant (a peek of the same cost, which spends nothing), with a
// RetryAfter never shorter and a Remaining never higher, although the
// other process has spent since the cached refusal; the cache never
// admits.
func TestCompositeDenyCacheOtherSpender(t *testing.T) {
	needRedis(t)
	for name, layers := range denyLayers() {
		clk := ratelimit.NewManualClock(unixNow)
		prefix := testPrefix()
		counted, calls := countedClient(t)
		cached, err := NewComposite(counted, layers, WithClock(clk), WithPrefix(prefix), WithHashTag(firstField), WithTimeout(5*time.Second))
		require.NoError(t, err)
		other, err := NewComposite(needRedis(t), layers, WithClock(clk), WithPrefix(prefix), WithHashTag(firstField), WithDenyCache(0), WithTimeout(5*time.Second))
		require.NoError(t, err)
		otherSpender(t, name, clk, cached, other, calls, []string{"x 1", "x 2", "y 1"}, 600, requireCachedCompositeRefusal)
	}
}

// TestCompositeDenyCacheSavesRoundTrips: a request key hammered at 100
// times its limit from one process reaches Redis only for what it is
// admitted and about once per retry period for what it is refused, on a
// client clock and on the server's; each refusal answered locally is one
// Redis gives (on the server's clock, held to Redis's answer just after:
// see hammer).
func TestCompositeDenyCacheSavesRoundTrips(t *testing.T) {
	rdb := needRedis(t)
	for name, layers := range denyLayers() {
		for _, serverClock := range []bool{false, true} {
			clk := ratelimit.NewManualClock(unixNow)
			opts := []Option{WithPrefix(testPrefix()), WithHashTag(firstField), WithTimeout(5 * time.Second)}
			if !serverClock {
				opts = append(opts, WithClock(clk))
			}
			c, err := NewComposite(rdb, layers, opts...)
			require.NoError(t, err)
			// The same keys, without a cache: what Redis itself answers.
			plain, err := NewComposite(rdb, layers, append(opts, WithDenyCache(0))...)
			require.NoError(t, err)
			const requests = 1000
			admitted := hammer(t, clk, serverClock, c, plain, "x 1", requests, requireCachedCompositeRefusal)
			local := int(c.Stats().LocalDenials)
			t.Logf("%s (server clock %v): %d admitted, %d refused locally: %d round trips", name, serverClock, admitted, local, requests-local)
			assert.Greater(t, local, requests*8/10, "%s: most refusals are answered locally", name)
		}
	}
}

// TestCompositeDenyCacheForgetsOnRefundAndReset: a Composite's own refund,
// settlement that gives back, or reset drops its cached refusals (of this
// request key and of every other, which may share a layer's key), so that
// the next check goes to Redis, which admits it.
func TestCompositeDenyCacheForgetsOnRefundAndReset(t *testing.T) {
	rdb := needRedis(t)
	all := func(string) string { return "all" }
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 2, Window: year, Name: "global"}, Key: all}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 5, Window: year, Name: "key"}}},
	}
	for _, op := range []string{"refund", "settle", "reset"} {
		clk := ratelimit.NewManualClock(unixNow)
		c, err := NewComposite(rdb, layers, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		var at time.Duration
		for _, key := range []string{"a", "b"} {
			d, err := c.Check(key, ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			at = d.At
		}
		for range 2 {
			d, err := c.Check("c", ratelimit.Unit)
			require.NoError(t, err)
			require.False(t, d.Allowed, "the global layer is spent")
		}
		require.Equal(t, uint64(1), c.Stats().LocalDenials, "the second refusal was the cache's")
		switch op {
		case "refund":
			g, err := c.Refund("b", ratelimit.Unit, at)
			require.NoError(t, err)
			require.Equal(t, ratelimit.Unit, g)
		case "settle":
			_, _, err := c.Settle("b", ratelimit.Unit, ratelimit.Unit/2, at)
			require.NoError(t, err)
		case "reset":
			require.NoError(t, c.Reset("b")) // the global layer's key too
		}
		d, err := c.Check("c", ratelimit.Unit/2)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "%s: the cache still refused what Redis admits", op)
		assert.Equal(t, uint64(1), c.Stats().LocalDenials, op)
	}
}

// TestCompositeDenyCacheOff: WithDenyCache(0), or a shadow layer (whose
// OnShadow must hear of every request), leaves every check to Redis.
func TestCompositeDenyCacheOff(t *testing.T) {
	rdb := needRedis(t)
	rule := ratelimit.FixedWindow{Limit: 1, Window: 100 * year}
	shadowed := 0
	for _, c := range []struct {
		layers []Layer
		opts   []Option
	}{
		{[]Layer{{Layer: ratelimit.Layer{Rule: rule}}}, []Option{WithDenyCache(0)}},
		{[]Layer{{Layer: ratelimit.Layer{Rule: rule}}, {Layer: ratelimit.Layer{Rule: rule, Shadow: true, OnShadow: func(ratelimit.ShadowReport) { shadowed++ }}}}, nil},
	} {
		comp, err := NewComposite(rdb, c.layers, append(c.opts, WithPrefix(testPrefix()), WithTimeout(5*time.Second))...)
		require.NoError(t, err)
		for range 5 {
			_, err := comp.Check("k", ratelimit.Unit)
			require.NoError(t, err)
		}
		assert.Zero(t, comp.Stats().LocalDenials)
	}
	assert.Equal(t, 5, shadowed, "the shadow layer heard of every request")
}
