package ratelimitprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/ratelimitprom"
)

// backend is a limiter whose keys live elsewhere, as redisstore's are:
// its stats are what it says.
type backend []ratelimit.BackendStats

func (b backend) BackendStats() []ratelimit.BackendStats { return b }

// TestScrapeBackend: a backend limiter's rule and counters are scraped
// as its BackendStats give them, and a name is taken once.
func TestScrapeBackend(t *testing.T) {
	c := ratelimitprom.NewCollector()
	b := backend{{Policy: "login", Limit: 5, Window: time.Minute, Failures: 7, CircuitRefusals: 3, InvalidStates: 1, LocalDenials: 9}}
	require.NoError(t, c.AddBackend("lockout", b))
	require.Error(t, c.AddBackend("lockout", b))
	require.Error(t, c.AddBackend("nil", nil))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	want := `
# HELP ratelimit_backend_circuit_refusals_total Calls a rate limiter's open circuit kept from its backend.
# TYPE ratelimit_backend_circuit_refusals_total counter
ratelimit_backend_circuit_refusals_total{layer="0",plan="",policy="login",store="lockout"} 3
# HELP ratelimit_backend_degraded_total Calls a rate limiter's backend did not decide, answered by its failure policy.
# TYPE ratelimit_backend_degraded_total counter
ratelimit_backend_degraded_total{layer="0",plan="",policy="login",store="lockout"} 7
# HELP ratelimit_backend_invalid_states_total Calls a rate limiter refused because a key's stored state was corrupted.
# TYPE ratelimit_backend_invalid_states_total counter
ratelimit_backend_invalid_states_total{layer="0",plan="",policy="login",store="lockout"} 1
# HELP ratelimit_backend_local_denials_total Refusals a rate limiter answered without a round trip to its backend.
# TYPE ratelimit_backend_local_denials_total counter
ratelimit_backend_local_denials_total{layer="0",plan="",policy="login",store="lockout"} 9
# HELP ratelimit_backend_mismatches_total Backend replies that disagreed with the rule's decision; should stay zero.
# TYPE ratelimit_backend_mismatches_total counter
ratelimit_backend_mismatches_total{layer="0",plan="",policy="login",store="lockout"} 0
# HELP ratelimit_policy_limit A rate limiter's rule's capacity in units: burst, capacity or limit per window.
# TYPE ratelimit_policy_limit gauge
ratelimit_policy_limit{layer="0",plan="",policy="login",store="lockout"} 5
# HELP ratelimit_policy_window_seconds The time span a rate limiter's rule's limit is a quota for.
# TYPE ratelimit_policy_window_seconds gauge
ratelimit_policy_window_seconds{layer="0",plan="",policy="login",store="lockout"} 60
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}

// TestScrapeBackendPlanLayer: a backend entry's Plan and Layer are its
// series' plan and layer labels.
func TestScrapeBackendPlanLayer(t *testing.T) {
	c := ratelimitprom.NewCollector()
	require.NoError(t, c.AddBackend("plans", backend{
		{Plan: "free", Policy: "free", Limit: 2, Window: time.Minute},
		{Plan: "pro", Policy: "pro-minute", Limit: 20, Window: time.Minute},
		{Plan: "pro", Layer: 1, Policy: "pro", Limit: 500, Window: time.Hour},
	}))
	want := `
# HELP ratelimit_policy_limit A rate limiter's rule's capacity in units: burst, capacity or limit per window.
# TYPE ratelimit_policy_limit gauge
ratelimit_policy_limit{layer="0",plan="free",policy="free",store="plans"} 2
ratelimit_policy_limit{layer="0",plan="pro",policy="pro-minute",store="plans"} 20
ratelimit_policy_limit{layer="1",plan="pro",policy="pro",store="plans"} 500
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "ratelimit_policy_limit"))
}
