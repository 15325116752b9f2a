package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backend is what ratelimitprom's and ratelimitotel's AddBackend take.
type backend interface {
	BackendStats() []ratelimit.BackendStats
}

// TestBackendStats: a Store, a Lockout and an InFlight report their rule,
// and the calls Redis did not decide, to metrics collectors.
func TestBackendStats(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(nil)
	defer rdb.Close()
	opts := []Option{WithTimeout(drillTimeout)}
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "api"}, opts...)
	require.NoError(t, err)
	lo, err := NewLockout(rdb, ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: time.Hour, Name: "login"}, opts...)
	require.NoError(t, err)
	f, err := NewInFlight(rdb, ratelimit.InFlightLimit{Limit: 4, Name: "quote"}, opts...)
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	_, _ = s.Check("k", ratelimit.Unit)
	_, _ = lo.Check(t.Context(), "k")
	_, _, _ = f.Acquire("k")
	for _, c := range []struct {
		b    backend
		want ratelimit.BackendStats
	}{
		{s, ratelimit.BackendStats{Policy: "api", Limit: 3, Window: time.Second, Failures: 1}},
		{lo, ratelimit.BackendStats{Policy: "login", Limit: 5, Window: time.Minute, Failures: 1}},
		{f, ratelimit.BackendStats{Policy: "quote", Limit: 4, Failures: 1}},
	} {
		assert.Equal(t, []ratelimit.BackendStats{c.want}, c.b.BackendStats())
	}
}

// TestCompositeBackendStats: a Composite reports every layer's rule in
// layer order, its shadow layer's too, and counts a check that Redis, once
// killed, did not decide, on its first layer's entry alone.
func TestCompositeBackendStats(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(nil)
	defer rdb.Close()
	c, err := NewComposite(rdb, []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "burst"}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(100), Burst: 10, Name: "hourly"}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 50, Window: time.Minute, Name: "next"}, Shadow: true}},
	}, WithTimeout(drillTimeout))
	require.NoError(t, err)
	_, err = c.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	_, err = c.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, []ratelimit.BackendStats{
		{Layer: 0, Policy: "burst", Limit: 3, Window: time.Second, Failures: 1},
		{Layer: 1, Policy: "hourly", Limit: 10, Window: 6 * time.Minute},
		{Layer: 2, Policy: "next", Limit: 50, Window: time.Minute},
	}, c.BackendStats())
}

// TestLeasedBackendStats: a Leased reports its Store's rule and counts a
// check that Redis, once killed, did not decide.
func TestLeasedBackendStats(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(nil)
	defer rdb.Close()
	s, err := New(rdb, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 100, Name: "hot"}, WithTimeout(drillTimeout))
	require.NoError(t, err)
	l, err := NewLeased(s, LeaseOptions{Max: 10 * ratelimit.Unit, Hold: time.Second})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, srv.Kill())
	_, err = l.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, []ratelimit.BackendStats{{Policy: "hot", Limit: 100, Window: time.Second, Failures: 1}}, l.BackendStats())
}

// TestPlansBackendStats: a Plans reports each plan's layers of the rule set
// in force, an unnamed rule under its plan's name; a plan's refusals
// answered by its deny cache are on its first entry, the checks Redis did
// not decide (on any plan) on the default plan's; the entries add up to
// its Stats; and after an Update the new set's plans are reported.
func TestPlansBackendStats(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(nil)
	defer rdb.Close()
	clk := ratelimit.NewManualClock(time.Hour)
	set := ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
		"pro": {Layers: []ratelimit.Layer{
			{Rule: ratelimit.FixedWindow{Limit: 20, Window: time.Minute, Name: "pro-minute"}},
			{Rule: ratelimit.FixedWindow{Limit: 500, Window: time.Hour}, Shadow: true},
		}},
		"team": {Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Minute, Name: "team-minute"}},
	}}
	planOf := func(key string) string { return key[:strings.IndexByte(key, ':')] }
	p, err := NewPlans(rdb, set, planOf, WithClock(clk), WithTimeout(drillTimeout))
	require.NoError(t, err)
	for range 3 { // admitted, refused by Redis, refused by the deny cache
		_, err := p.Check("team:a", ratelimit.Unit)
		require.NoError(t, err)
	}
	require.NoError(t, srv.Kill())
	for _, key := range []string{"free:a", "pro:a"} {
		_, err := p.Check(key, ratelimit.Unit)
		require.ErrorIs(t, err, ErrUnavailable)
	}
	got := p.BackendStats()
	assert.Equal(t, []ratelimit.BackendStats{
		{Plan: "free", Policy: "free", Limit: 2, Window: time.Minute, Failures: 2},
		{Plan: "pro", Layer: 0, Policy: "pro-minute", Limit: 20, Window: time.Minute},
		{Plan: "pro", Layer: 1, Policy: "pro", Limit: 500, Window: time.Hour},
		{Plan: "team", Policy: "team-minute", Limit: 1, Window: time.Minute, LocalDenials: 1},
	}, got)
	var sum ratelimit.BackendStats
	for _, e := range got {
		sum.Failures += e.Failures
		sum.CircuitRefusals += e.CircuitRefusals
		sum.InvalidStates += e.InvalidStates
		sum.Mismatches += e.Mismatches
		sum.LocalDenials += e.LocalDenials
	}
	st := p.Stats().Stats
	assert.Equal(t, ratelimit.BackendStats{Failures: st.Failures, CircuitRefusals: st.CircuitRefusals,
		InvalidStates: st.InvalidStates, Mismatches: st.Mismatches, LocalDenials: st.LocalDenials}, sum)

	require.NoError(t, p.Update(ratelimit.PlanSet{Default: "free", Plans: map[string]ratelimit.Plan{
		"free":       {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
		"enterprise": {Rule: ratelimit.FixedWindow{Limit: 1000, Window: time.Minute, Name: "ent"}},
	}}, ratelimit.MigrateProportional))
	assert.Equal(t, []ratelimit.BackendStats{
		{Plan: "enterprise", Policy: "ent", Limit: 1000, Window: time.Minute},
		{Plan: "free", Policy: "free", Limit: 2, Window: time.Minute, Failures: 2},
	}, p.BackendStats())
}
