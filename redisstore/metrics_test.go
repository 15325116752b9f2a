package redisstore

import (
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
