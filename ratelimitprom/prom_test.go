package ratelimitprom_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/ratelimitprom"
)

// TestScrape drives a store, a composite with a shadow layer and a rule
// set through a known trace and scrapes a registry: every number is the
// one the trace makes.
func TestScrape(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	obs := ratelimitprom.NewObserver()
	opts := []ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithObserver(obs)}

	// The specification's vector: token bucket 10/s, burst 20.
	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"},
		append(opts, ratelimit.WithMaxKeys(2), ratelimit.WithShards(1))...)
	require.NoError(t, err)
	for range 25 {
		_, err := store.Check("a", ratelimit.Unit)
		require.NoError(t, err)
	}
	clk.Set(500 * time.Millisecond)
	for range 8 {
		_, err := store.Check("a", ratelimit.Unit)
		require.NoError(t, err)
	}
	clk.Set(2500 * time.Millisecond)
	_, err = store.Check("a", ratelimit.Unit)
	require.NoError(t, err)
	// 26 allowed, 8 refused on "a". Then b (2 units) and c: c makes room
	// by dropping a partly spent key.
	_, err = store.Check("b", 2*ratelimit.Unit)
	require.NoError(t, err)
	_, err = store.Check("c", ratelimit.Unit)
	require.NoError(t, err)

	// A composite: a global cap enforced, a strict per-key limit watched.
	comp, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Minute, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.SlidingLog{Limit: 2, Window: time.Minute, Name: "strict"}, Shadow: true},
	}, opts...)
	require.NoError(t, err)
	for range 5 {
		_, err := comp.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}

	// A rule set whose rule has no Name: the plan's name labels it.
	plans, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}},
	}, Default: "free"}, nil, opts...)
	require.NoError(t, err)
	for range 3 {
		_, err := plans.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	// Two Waits: one admitted after 1 s, one abandoned after 0.25 s.
	done := make(chan error, 1)
	ctx := context.Background()
	go func() { _, err := plans.Wait(ctx, "k", ratelimit.Unit); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(time.Second)
	require.NoError(t, <-done)
	cctx, cancel := context.WithCancel(ctx)
	go func() { _, err := plans.Wait(cctx, "k", ratelimit.Unit); done <- err }()
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(250 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	obs.Failed("api", assert.AnError) // as a backend reports one

	col := ratelimitprom.NewCollector()
	require.NoError(t, col.AddStore("edge", store))
	require.NoError(t, col.AddComposite("mix", comp))
	require.NoError(t, col.AddPlans("plans", plans))
	require.Error(t, col.AddStore("edge", store), "names are unique")

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))
	require.NoError(t, reg.Register(col))

	want := `
# HELP ratelimit_decisions_total Requests decided by a rate limiter, by policy and outcome (allowed, refused, shadow_refused).
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{outcome="allowed",policy="api"} 28
ratelimit_decisions_total{outcome="allowed",policy="free"} 2
ratelimit_decisions_total{outcome="allowed",policy="global"} 2
ratelimit_decisions_total{outcome="refused",policy="api"} 8
ratelimit_decisions_total{outcome="refused",policy="free"} 3
ratelimit_decisions_total{outcome="refused",policy="global"} 0
ratelimit_decisions_total{outcome="refused",policy="strict"} 0
ratelimit_decisions_total{outcome="shadow_refused",policy="api"} 0
ratelimit_decisions_total{outcome="shadow_refused",policy="free"} 0
ratelimit_decisions_total{outcome="shadow_refused",policy="global"} 0
ratelimit_decisions_total{outcome="shadow_refused",policy="strict"} 3
ratelimit_decisions_total{outcome="allowed",policy="strict"} 0
# HELP ratelimit_evictions_total Keys a store dropped to make room, by policy; lossy="true" for keys partly spent, which start again fresh.
# TYPE ratelimit_evictions_total counter
ratelimit_evictions_total{lossy="true",policy="api"} 1
# HELP ratelimit_backend_failures_total Errors of a rate limiter's backend, by policy.
# TYPE ratelimit_backend_failures_total counter
ratelimit_backend_failures_total{policy="api"} 1
# HELP ratelimit_waits_in_flight Waits under way, by policy.
# TYPE ratelimit_waits_in_flight gauge
ratelimit_waits_in_flight{policy="free"} 0
# HELP ratelimit_store_keys Keys a rate limiter's store holds now.
# TYPE ratelimit_store_keys gauge
ratelimit_store_keys{layer="0",plan="",policy="api",store="edge"} 2
ratelimit_store_keys{layer="0",plan="",policy="global",store="mix"} 1
ratelimit_store_keys{layer="1",plan="",policy="strict",store="mix"} 1
ratelimit_store_keys{layer="0",plan="free",policy="free",store="plans"} 1
# HELP ratelimit_store_max_keys The bound on the keys a rate limiter's store holds.
# TYPE ratelimit_store_max_keys gauge
ratelimit_store_max_keys{layer="0",plan="",policy="api",store="edge"} 2
ratelimit_store_max_keys{layer="0",plan="",policy="global",store="mix"} 1e+06
ratelimit_store_max_keys{layer="1",plan="",policy="strict",store="mix"} 1e+06
ratelimit_store_max_keys{layer="0",plan="free",policy="free",store="plans"} 1e+06
# HELP ratelimit_store_evictions_total Keys a rate limiter's store dropped to make room.
# TYPE ratelimit_store_evictions_total counter
ratelimit_store_evictions_total{layer="0",plan="",policy="api",store="edge"} 1
ratelimit_store_evictions_total{layer="0",plan="",policy="global",store="mix"} 0
ratelimit_store_evictions_total{layer="1",plan="",policy="strict",store="mix"} 0
ratelimit_store_evictions_total{layer="0",plan="free",policy="free",store="plans"} 0
# HELP ratelimit_store_lossy_evictions_total Keys a rate limiter's store dropped while partly spent: they start again with a fresh allowance.
# TYPE ratelimit_store_lossy_evictions_total counter
ratelimit_store_lossy_evictions_total{layer="0",plan="",policy="api",store="edge"} 1
ratelimit_store_lossy_evictions_total{layer="0",plan="",policy="global",store="mix"} 0
ratelimit_store_lossy_evictions_total{layer="1",plan="",policy="strict",store="mix"} 0
ratelimit_store_lossy_evictions_total{layer="0",plan="free",policy="free",store="plans"} 0
# HELP ratelimit_policy_limit A rate limiter's rule's capacity in units: burst, capacity or limit per window.
# TYPE ratelimit_policy_limit gauge
ratelimit_policy_limit{layer="0",plan="",policy="api",store="edge"} 20
ratelimit_policy_limit{layer="0",plan="",policy="global",store="mix"} 100
ratelimit_policy_limit{layer="1",plan="",policy="strict",store="mix"} 2
ratelimit_policy_limit{layer="0",plan="free",policy="free",store="plans"} 1
# HELP ratelimit_policy_window_seconds The time span a rate limiter's rule's limit is a quota for.
# TYPE ratelimit_policy_window_seconds gauge
ratelimit_policy_window_seconds{layer="0",plan="",policy="api",store="edge"} 2
ratelimit_policy_window_seconds{layer="0",plan="",policy="global",store="mix"} 60
ratelimit_policy_window_seconds{layer="1",plan="",policy="strict",store="mix"} 60
ratelimit_policy_window_seconds{layer="0",plan="free",policy="free",store="plans"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratelimit_decisions_total", "ratelimit_evictions_total", "ratelimit_backend_failures_total",
		"ratelimit_waits_in_flight", "ratelimit_store_keys", "ratelimit_store_max_keys",
		"ratelimit_store_evictions_total", "ratelimit_store_lossy_evictions_total",
		"ratelimit_policy_limit", "ratelimit_policy_window_seconds"))

	// Cost in units: "a" spent 26 units and "b" 2, "c" 1.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	type hist struct {
		sum   float64
		count uint64
	}
	costs := map[string]float64{}
	waits := map[string]hist{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetName() {
			case "ratelimit_cost_units_total":
				costs[l["policy"]+"/"+l["outcome"]] = m.GetCounter().GetValue()
			case "ratelimit_wait_seconds":
				waits[l["policy"]+"/"+l["result"]] = hist{m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()}
			}
		}
	}
	assert.Equal(t, 29.0, costs["api/allowed"])
	assert.Equal(t, 8.0, costs["api/refused"])
	assert.Equal(t, 3.0, costs["strict/shadow_refused"])
	assert.Equal(t, map[string]hist{"free/admitted": {1, 1}, "free/abandoned": {0.25, 1}}, waits)
}

// TestDecidedAllocatesNothing: once a policy's counters exist, counting a
// decision allocates nothing, so an observed Check stays allocation-free.
func TestDecidedAllocatesNothing(t *testing.T) {
	obs := ratelimitprom.NewObserver()
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000, Name: "api"},
		ratelimit.WithObserver(obs))
	require.NoError(t, err)
	_, _ = store.Check("k", ratelimit.Unit)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = store.Check("k", ratelimit.Unit) }))
}

// A shedder's decisions are counted by class, as well as by policy.
func TestShedByClass(t *testing.T) {
	obs := ratelimitprom.NewObserver()
	shed, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Name: "workers",
		Classes: []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "sheddable", Share: 70}}}, ratelimit.WithObserver(obs))
	require.NoError(t, err)
	for range 8 {
		_, _, err := shed.Admit(context.Background(), 1)
		require.NoError(t, err)
	}
	_, _, err = shed.Admit(context.Background(), 0)
	require.NoError(t, err)
	want := `
# HELP ratelimit_shed_total Decisions of a load shedder, by policy, priority class and outcome (allowed, refused).
# TYPE ratelimit_shed_total counter
ratelimit_shed_total{class="critical",outcome="allowed",policy="workers"} 1
ratelimit_shed_total{class="sheddable",outcome="allowed",policy="workers"} 7
ratelimit_shed_total{class="sheddable",outcome="refused",policy="workers"} 1
`
	assert.NoError(t, testutil.CollectAndCompare(obs, strings.NewReader(want), "ratelimit_shed_total"))
	want = `
# HELP ratelimit_decisions_total Requests decided by a rate limiter, by policy and outcome (allowed, refused, shadow_refused).
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{outcome="allowed",policy="workers"} 8
ratelimit_decisions_total{outcome="refused",policy="workers"} 1
ratelimit_decisions_total{outcome="shadow_refused",policy="workers"} 0
`
	assert.NoError(t, testutil.CollectAndCompare(obs, strings.NewReader(want), "ratelimit_decisions_total"))
}

// Class labels are bounded: past MaxShedClasses names for one policy,
// further ones are counted as class "other"; recording a known class
// allocates nothing.
func TestShedClassesBounded(t *testing.T) {
	obs := ratelimitprom.NewObserver()
	for i := range ratelimitprom.MaxShedClasses + 10 {
		obs.Shed("p", "c"+strconv.Itoa(i), ratelimit.OutcomeRefused)
	}
	obs.Shed("q", "c0", ratelimit.OutcomeAllowed) // another policy has its own
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))
	families, err := reg.Gather()
	require.NoError(t, err)
	classes := map[string]float64{}
	var q float64
	for _, f := range families {
		if f.GetName() != "ratelimit_shed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch labels["policy"] {
			case "p":
				classes[labels["class"]] += m.GetCounter().GetValue()
			case "q":
				assert.Equal(t, "c0", labels["class"])
				q += m.GetCounter().GetValue()
			}
		}
	}
	assert.Len(t, classes, ratelimitprom.MaxShedClasses+1)
	assert.Equal(t, 10.0, classes["other"])
	assert.Equal(t, 1.0, classes["c0"])
	assert.Equal(t, 1.0, q)
	assert.Zero(t, testing.AllocsPerRun(100, func() { obs.Shed("p", "c1", ratelimit.OutcomeAllowed) }))
}
