package ratelimitprom_test

import (
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/ratelimitprom"
	"github.com/ratekit/ratelimit/ratelimitprom/internal/promtest"
	"github.com/ratekit/ratelimit/redisstore"
)

// hungRedis returns a client of a Redis that never answers: a loopback
// listener that takes connections and reads nothing, so that every call
// fails at its deadline, as on a hung server. What the limiters count of
// a real server's failures is tested in redisstore; here the series are.
func hungRedis(t *testing.T) redis.UniversalClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: l.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() {
		rdb.Close()
		l.Close()
	})
	return rdb
}

// redisLimiters returns a Redis Composite of three layers (the last in
// shadow) and a Redis Plans of three plans on rdb, each having failed one
// check, and the rule set Update then installs.
func redisLimiters(t *testing.T, rdb redis.UniversalClient) (*redisstore.Composite, *redisstore.Plans, ratelimit.PlanSet) {
	t.Helper()
	opts := []redisstore.Option{redisstore.WithTimeout(50 * time.Millisecond)}
	comp, err := redisstore.NewComposite(rdb, []redisstore.Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "burst"}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour, Name: "hourly"}}},
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
	next := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free":       {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
		"enterprise": {Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Minute, Name: "ent"}},
	}}
	return comp, plans, next
}

// TestPrometheusScrapesRedisLimiters: a real Prometheus server (see package
// promtest) scrapes a Redis Composite's series, each layer's and the
// shadow layer's, with its failed check on its first layer, and a Redis
// Plans' series, labelled by plan, an unnamed rule by its plan's name;
// after an Update, the new plan's series.
func TestPrometheusScrapesRedisLimiters(t *testing.T) {
	comp, plans, next := redisLimiters(t, hungRedis(t))
	col := ratelimitprom.NewCollector()
	require.NoError(t, col.AddBackend("api", comp))
	require.NoError(t, col.AddBackend("plans", plans))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	prom := promtest.Start(t, strings.TrimPrefix(srv.URL, "http://"))

	deadline := time.Now().Add(60 * time.Second)
	for query, want := range map[string]float64{
		`ratelimit_backend_degraded_total{store="api",plan="",layer="0",policy="burst"}`:      1,
		`ratelimit_backend_degraded_total{store="api",plan="",layer="1",policy="hourly"}`:     0,
		`ratelimit_policy_limit{store="api",plan="",layer="2",policy="next"}`:                 50,
		`ratelimit_policy_window_seconds{store="api",plan="",layer="1",policy="hourly"}`:      3600,
		`ratelimit_policy_limit{store="plans",plan="free",layer="0",policy="free"}`:           2,
		`ratelimit_backend_degraded_total{store="plans",plan="free",layer="0",policy="free"}`: 1,
		`ratelimit_policy_limit{store="plans",plan="pro",layer="0",policy="pro-minute"}`:      20,
		`ratelimit_policy_limit{store="plans",plan="pro",layer="1",policy="pro"}`:             500,
		`count(ratelimit_policy_limit{store="plans"})`:                                        3,
	} {
		promtest.Await(t, prom, query, want, deadline)
	}

	require.NoError(t, plans.Update(next, ratelimit.MigrateProportional))
	deadline = time.Now().Add(60 * time.Second)
	promtest.Await(t, prom, `ratelimit_policy_limit{store="plans",plan="enterprise",layer="0",policy="ent"}`, 1000, deadline)
	promtest.Await(t, prom, `absent(ratelimit_policy_limit{store="plans",plan="pro"})`, 1, deadline)
}
