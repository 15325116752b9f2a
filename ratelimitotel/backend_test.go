package ratelimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/ratelimitotel"
)

// backend is a limiter whose keys live elsewhere, as redisstore's are:
// its stats are what it says.
type backend []ratelimit.BackendStats

func (b backend) BackendStats() []ratelimit.BackendStats { return b }

// newCollector returns a Collector and the reader of its meter provider,
// which is shut down when the test ends.
func newCollector(t *testing.T) (*ratelimitotel.Collector, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	col, err := ratelimitotel.NewCollector(mp)
	require.NoError(t, err)
	return col, reader
}

// TestCollectBackend: a backend limiter's rule and counters are collected
// as its BackendStats give them, and a name is taken once.
func TestCollectBackend(t *testing.T) {
	col, reader := newCollector(t)
	b := backend{{Policy: "quote", Limit: 4, Failures: 7, CircuitRefusals: 3, InvalidStates: 1, Mismatches: 2, LocalDenials: 9},
		{Layer: 1, Policy: "login", Limit: 5, Window: time.Minute}}
	require.NoError(t, col.AddBackend("redis", b))
	require.Error(t, col.AddBackend("redis", b))
	require.Error(t, col.AddBackend("nil", nil))
	got := read(t, reader)
	const l0 = "{layer=0,plan=,policy=quote,store=redis}"
	const l1 = "{layer=1,plan=,policy=login,store=redis}"
	want := map[string]point{
		"ratelimit.policy.limit" + l0:             {value: 4},
		"ratelimit.policy.window" + l0:            {value: 0},
		"ratelimit.backend.degraded" + l0:         {value: 7},
		"ratelimit.backend.circuit_refusals" + l0: {value: 3},
		"ratelimit.backend.invalid_states" + l0:   {value: 1},
		"ratelimit.backend.mismatches" + l0:       {value: 2},
		"ratelimit.backend.local_denials" + l0:    {value: 9},
		"ratelimit.policy.limit" + l1:             {value: 5},
		"ratelimit.policy.window" + l1:            {value: 60},
		"ratelimit.backend.degraded" + l1:         {value: 0},
		"ratelimit.backend.circuit_refusals" + l1: {value: 0},
		"ratelimit.backend.invalid_states" + l1:   {value: 0},
		"ratelimit.backend.mismatches" + l1:       {value: 0},
		"ratelimit.backend.local_denials" + l1:    {value: 0},
	}
	assert.Equal(t, want, got)
}

// TestCollectBackendPlanLayer: a backend entry's Plan and Layer are its
// stream's plan and layer attributes.
func TestCollectBackendPlanLayer(t *testing.T) {
	col, reader := newCollector(t)
	require.NoError(t, col.AddBackend("plans", backend{
		{Plan: "free", Policy: "free", Limit: 2, Window: time.Minute},
		{Plan: "pro", Policy: "pro-minute", Limit: 20, Window: time.Minute},
		{Plan: "pro", Layer: 1, Policy: "pro", Limit: 500, Window: time.Hour},
	}))
	got := read(t, reader)
	for series, want := range map[string]float64{
		"ratelimit.policy.limit{layer=0,plan=free,policy=free,store=plans}":      2,
		"ratelimit.policy.limit{layer=0,plan=pro,policy=pro-minute,store=plans}": 20,
		"ratelimit.policy.limit{layer=1,plan=pro,policy=pro,store=plans}":        500,
	} {
		assert.Equal(t, point{value: want}, got[series], series)
	}
}
