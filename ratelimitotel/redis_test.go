package ratelimitotel_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore"
)

// TestCollectRedisLimiters: the reader collects a Redis Composite's
// streams, each layer's and the shadow layer's, with its failed check on
// its first layer, and a Redis Plans' streams, with the attribute plan, an
// unnamed rule named by its plan; after an Update, the new plan's streams
// and no more of the plan it dropped. The client talks to a loopback
// listener that reads nothing, so that every call fails at its deadline,
// as on a hung server (what the limiters count of a real server's
// failures is tested in redisstore).
func TestCollectRedisLimiters(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	rdb := redis.NewClient(&redis.Options{Addr: l.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	opts := []redisstore.Option{redisstore.WithTimeout(50 * time.Millisecond)}
	comp, err := redisstore.NewComposite(rdb, []redisstore.Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "burst"}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 50, Window: time.Minute, Name: "next"}, Shadow: true}},
	}, opts...)
	require.NoError(t, err)
	plans, err := redisstore.NewPlans(rdb, ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 20, Window: time.Minute, Name: "pro-minute"}},
			{Rule: ratelimit.FixedWindow{Limit: 500, Window: time.Hour}, Shadow: true},
		}},
	}}, func(key string) string { return strings.Split(key, ":")[0] }, opts...)
	require.NoError(t, err)
	_, err = comp.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	_, err = plans.Check("pro:a", ratelimit.Unit)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)

	col, reader := newCollector(t)
	require.NoError(t, col.AddBackend("api", comp))
	require.NoError(t, col.AddBackend("plans", plans))

	const (
		api0  = "{layer=0,plan=,policy=burst,store=api}"
		api1  = "{layer=1,plan=,policy=next,store=api}"
		free  = "{layer=0,plan=free,policy=free,store=plans}"
		pro0  = "{layer=0,plan=pro,policy=pro-minute,store=plans}"
		pro1  = "{layer=1,plan=pro,policy=pro,store=plans}"
		ent   = "{layer=0,plan=enterprise,policy=ent,store=plans}"
		limit = "ratelimit.policy.limit"
		degr  = "ratelimit.backend.degraded"
	)
	got := read(t, reader)
	for series, want := range map[string]float64{
		limit + api0: 3, degr + api0: 1,
		limit + api1: 50, degr + api1: 0,
		limit + free: 2, degr + free: 1,
		limit + pro0: 20, degr + pro0: 0,
		limit + pro1: 500, "ratelimit.policy.window" + pro1: 3600,
	} {
		if assert.Contains(t, got, series) {
			assert.Equal(t, want, got[series].value, series)
		}
	}
	assert.NotContains(t, got, limit+ent)

	require.NoError(t, plans.Update(ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free":       {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
		"enterprise": {Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Minute, Name: "ent"}},
	}}, ratelimit.MigrateProportional))
	got = read(t, reader)
	if assert.Contains(t, got, limit+ent) {
		assert.Equal(t, 1000.0, got[limit+ent].value)
	}
	assert.NotContains(t, got, limit+pro0)
	assert.Equal(t, 1.0, got[degr+free].value)
}
