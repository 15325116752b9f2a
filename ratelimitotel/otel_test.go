package ratelimitotel_test

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/ratelimitotel"
)

// point is a data point's value; for a histogram, its count and sum.
type point struct {
	value float64
	count uint64
}

// read collects reader's metrics as points named "instrument{k=v,...}",
// attributes sorted.
func read(t *testing.T, reader *sdkmetric.ManualReader) map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]point{}
	name := func(m string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		sort.Strings(kv)
		return m + "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, ratelimitotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[name(m.Name, p.Attributes)] = point{value: float64(p.Value)}
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					out[name(m.Name, p.Attributes)] = point{value: p.Value}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[name(m.Name, p.Attributes)] = point{value: float64(p.Value)}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[name(m.Name, p.Attributes)] = point{value: p.Value}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[name(m.Name, p.Attributes)] = point{value: p.Sum, count: p.Count}
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// TestManualReader drives a store, a composite with a shadow layer and a
// rule set through a known trace, and reads the SDK's ManualReader: every
// number is the one the trace makes.
func TestManualReader(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { require.NoError(t, mp.Shutdown(context.Background())) }()
	obs, err := ratelimitotel.NewObserver(mp)
	require.NoError(t, err)
	col, err := ratelimitotel.NewCollector(mp)
	require.NoError(t, err)

	clk := ratelimit.NewManualClock(0)
	opts := []ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithObserver(obs)}

	// The specification's vector: token bucket 10/s, burst 20.
	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"},
		append(opts, ratelimit.WithMaxKeys(2), ratelimit.WithShards(1))...)
	require.NoError(t, err)
	check := func(key string, cost ratelimit.Units) {
		_, err := store.Check(key, cost)
		require.NoError(t, err)
	}
	for range 25 {
		check("a", ratelimit.Unit)
	}
	clk.Set(500 * time.Millisecond)
	for range 8 {
		check("a", ratelimit.Unit)
	}
	clk.Set(2500 * time.Millisecond)
	check("a", ratelimit.Unit)
	check("b", 2*ratelimit.Unit)
	check("c", ratelimit.Unit) // no room: a partly spent key goes

	comp, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Minute, Name: "global"}, Key: func(string) string { return "" }},
		{Rule: ratelimit.SlidingLog{Limit: 2, Window: time.Minute, Name: "strict"}, Shadow: true},
	}, opts...)
	require.NoError(t, err)
	for range 5 {
		_, err := comp.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}

	plans, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}},
	}, Default: "free"}, nil, opts...)
	require.NoError(t, err)
	for range 3 {
		_, err := plans.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
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
	obs.Failed("api", errors.New("backend down")) // as a backend reports one

	require.NoError(t, col.AddStore("edge", store))
	require.NoError(t, col.AddComposite("mix", comp))
	require.NoError(t, col.AddPlans("plans", plans))
	require.Error(t, col.AddStore("edge", store), "names are unique")

	got := read(t, reader)
	want := map[string]point{
		"ratelimit.decisions{outcome=allowed,policy=api}":                 {value: 28},
		"ratelimit.decisions{outcome=refused,policy=api}":                 {value: 8},
		"ratelimit.decisions{outcome=allowed,policy=global}":              {value: 2},
		"ratelimit.decisions{outcome=shadow_refused,policy=strict}":       {value: 3},
		"ratelimit.decisions{outcome=allowed,policy=free}":                {value: 2},
		"ratelimit.decisions{outcome=refused,policy=free}":                {value: 3},
		"ratelimit.cost{outcome=allowed,policy=api}":                      {value: 29},
		"ratelimit.cost{outcome=refused,policy=api}":                      {value: 8},
		"ratelimit.cost{outcome=allowed,policy=global}":                   {value: 2},
		"ratelimit.cost{outcome=shadow_refused,policy=strict}":            {value: 3},
		"ratelimit.cost{outcome=allowed,policy=free}":                     {value: 2},
		"ratelimit.cost{outcome=refused,policy=free}":                     {value: 3},
		"ratelimit.wait.duration{policy=free,result=admitted}":            {value: 1, count: 1},
		"ratelimit.wait.duration{policy=free,result=abandoned}":           {value: 0.25, count: 1},
		"ratelimit.waits.in_flight{policy=free}":                          {value: 0},
		"ratelimit.evictions{lossy=true,policy=api}":                      {value: 1},
		"ratelimit.backend.failures{policy=api}":                          {value: 1},
		"ratelimit.store.keys{layer=0,plan=,policy=api,store=edge}":       {value: 2},
		"ratelimit.store.keys{layer=0,plan=,policy=global,store=mix}":     {value: 1},
		"ratelimit.store.keys{layer=1,plan=,policy=strict,store=mix}":     {value: 1},
		"ratelimit.store.keys{layer=0,plan=free,policy=free,store=plans}": {value: 1},
	}
	for _, s := range []struct {
		attrs                                    string
		maxKeys, evictions, lossy, limit, window float64
	}{
		{"layer=0,plan=,policy=api,store=edge", 2, 1, 1, 20, 2},
		{"layer=0,plan=,policy=global,store=mix", 1e6, 0, 0, 100, 60},
		{"layer=1,plan=,policy=strict,store=mix", 1e6, 0, 0, 2, 60},
		{"layer=0,plan=free,policy=free,store=plans", 1e6, 0, 0, 1, 1},
	} {
		want["ratelimit.store.max_keys{"+s.attrs+"}"] = point{value: s.maxKeys}
		want["ratelimit.store.evictions{"+s.attrs+"}"] = point{value: s.evictions}
		want["ratelimit.store.lossy_evictions{"+s.attrs+"}"] = point{value: s.lossy}
		want["ratelimit.policy.limit{"+s.attrs+"}"] = point{value: s.limit}
		want["ratelimit.policy.window{"+s.attrs+"}"] = point{value: s.window}
	}
	assert.Equal(t, want, got)

	// Unregistered, the collector reports nothing more.
	require.NoError(t, col.Unregister())
	for name := range read(t, reader) {
		assert.False(t, strings.HasPrefix(name, "ratelimit.store.") || strings.HasPrefix(name, "ratelimit.policy."), name)
	}
}

// TestDecidedAllocatesNothing: once a policy's attributes exist, recording
// a decision allocates nothing, so an observed Check stays allocation-free.
func TestDecidedAllocatesNothing(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := ratelimitotel.NewObserver(mp)
	require.NoError(t, err)
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000, Name: "api"},
		ratelimit.WithObserver(obs))
	require.NoError(t, err)
	_, _ = store.Check("k", ratelimit.Unit)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = store.Check("k", ratelimit.Unit) }))
}

// A shedder's decisions are counted by class, as well as by policy.
func TestShedByClass(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { require.NoError(t, mp.Shutdown(context.Background())) }()
	obs, err := ratelimitotel.NewObserver(mp)
	require.NoError(t, err)
	_, ok := any(obs).(ratelimit.ShedObserver)
	require.True(t, ok, "the Observer is a ShedObserver")
	shed, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Name: "workers",
		Classes: []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "sheddable", Share: 70}}}, ratelimit.WithObserver(obs))
	require.NoError(t, err)
	for range 8 {
		_, _, err := shed.Admit(context.Background(), 1)
		require.NoError(t, err)
	}
	_, _, err = shed.Admit(context.Background(), 0)
	require.NoError(t, err)
	got := read(t, reader)
	want := map[string]point{
		"ratelimit.shed{class=critical,outcome=allowed,policy=workers}":  {value: 1},
		"ratelimit.shed{class=sheddable,outcome=allowed,policy=workers}": {value: 7},
		"ratelimit.shed{class=sheddable,outcome=refused,policy=workers}": {value: 1},
		"ratelimit.decisions{outcome=allowed,policy=workers}":            {value: 8},
		"ratelimit.decisions{outcome=refused,policy=workers}":            {value: 1},
		"ratelimit.cost{outcome=allowed,policy=workers}":                 {value: 8},
		"ratelimit.cost{outcome=refused,policy=workers}":                 {value: 1},
	}
	assert.Equal(t, want, got)
}

// Class attributes are bounded: past MaxShedClasses names for one policy,
// further ones are counted as class "other"; recording a known class
// allocates nothing.
func TestShedClassesBounded(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { require.NoError(t, mp.Shutdown(context.Background())) }()
	obs, err := ratelimitotel.NewObserver(mp)
	require.NoError(t, err)
	for i := range ratelimitotel.MaxShedClasses + 10 {
		obs.Shed("p", "c"+strconv.Itoa(i), ratelimit.OutcomeRefused)
	}
	obs.Shed("q", "c0", ratelimit.OutcomeAllowed) // another policy has its own
	got := read(t, reader)
	classes := map[string]bool{}
	for name, p := range got {
		if strings.HasPrefix(name, "ratelimit.shed{") && strings.HasSuffix(name, "policy=p}") {
			classes[name] = true
			if strings.Contains(name, "class=other,") {
				assert.Equal(t, 10.0, p.value)
			}
		}
	}
	assert.Len(t, classes, ratelimitotel.MaxShedClasses+1)
	assert.Equal(t, point{value: 1}, got["ratelimit.shed{class=c0,outcome=allowed,policy=q}"])
	assert.Zero(t, testing.AllocsPerRun(100, func() { obs.Shed("p", "c1", ratelimit.OutcomeAllowed) }))
}
