package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVirtualRunNeverExceedsThePartner(t *testing.T) {
	var outs [2]bytes.Buffer
	for i := range outs {
		require.NoError(t, run(context.Background(), nil, &outs[i]))
	}
	assert.Equal(t, outs[0].String(), outs[1].String(), "virtual time makes the run deterministic")
	assert.Equal(t, `20 workers, partner limit 100 per 1m0s, 10m0s on virtual time
calls made: 1000, refused by the partner: 0
busiest 1m0s window: 100 calls (the partner allows 100)
calls per worker: 49 to 51
calls per period: 100 100 100 100 100 100 100 100 100 100
`, outs[0].String())
}

func TestVirtualRunsOfOtherShapes(t *testing.T) {
	for _, cfg := range []config{
		{workers: 20, limit: 100, per: time.Minute, duration: time.Hour},
		{workers: 7, limit: 13, per: 3 * time.Second, duration: time.Minute},
		{workers: 1, limit: 5, per: time.Second, duration: 10 * time.Second},
		{workers: 50, limit: 3, per: time.Hour, duration: 24 * time.Hour, margin: 0.1},
	} {
		res, err := simulate(context.Background(), cfg)
		require.NoError(t, err)
		assert.Zero(t, res.refused, "%+v", cfg)
		assert.LessOrEqual(t, busiest(res.calls, cfg.per), int(cfg.limit), "%+v", cfg)
		// Paced at the partner's rate, less the margin: every call the
		// rate allows in the run, from the first instant.
		rate := float64(cfg.limit) * (1 - cfg.margin) / float64(cfg.per)
		want := int(float64(cfg.duration)*rate - 1e-9) // calls at 0, 1/rate, ... before the end
		assert.InDelta(t, want+1, len(res.calls), 1, "%+v", cfg)
		total := 0
		for _, n := range res.perWorker {
			total += n
		}
		assert.Equal(t, len(res.calls), total)
	}
}

func TestRealRunBriefly(t *testing.T) {
	cfg := config{workers: 20, limit: 50, per: 200 * time.Millisecond, duration: 500 * time.Millisecond, real: true, margin: 0.1}
	start := time.Now()
	res, err := simulate(context.Background(), cfg)
	require.NoError(t, err)
	elapsed := time.Since(start)
	require.NotEmpty(t, res.calls)
	// The pacer lets out one call every 1/225 s from the start: however
	// late the goroutines wake, no more than that in the time that passed.
	assert.LessOrEqual(t, len(res.calls), int(elapsed.Seconds()*225)+1)
	for i := 1; i < len(res.calls); i++ {
		assert.GreaterOrEqual(t, res.calls[i], res.calls[i-1])
	}
}

func TestFlags(t *testing.T) {
	var out bytes.Buffer
	require.Error(t, run(context.Background(), []string{"-workers", "0"}, &out))
	require.Error(t, run(context.Background(), []string{"-margin", "1"}, &out))
	require.Error(t, run(context.Background(), []string{"-nope"}, &out))
	require.NoError(t, run(context.Background(), []string{"-workers", "3", "-limit", "7", "-per", "3s", "-duration", "30s"}, &out))
	assert.Contains(t, out.String(), "calls made: 70, refused by the partner: 0")
}
