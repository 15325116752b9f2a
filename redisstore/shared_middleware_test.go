package redisstore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var _ httplimit.Slots = (*InFlight)(nil)

// TestInFlightBehindMiddleware puts two InFlights on one Redis (two
// replicas) behind httplimit.InFlight: a request in progress on one
// replica takes the key's only slot on both; with Redis stopped, the
// default policy forwards requests and FailClosed refuses them with 429.
func TestInFlightBehindMiddleware(t *testing.T) {
	srv := drillServer(t)
	l := ratelimit.InFlightLimit{Limit: 1, MaxHold: time.Minute}
	key := httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil })
	replica := func(opts ...Option) (*InFlight, http.Handler, chan struct{}) {
		rdb := srv.Client(func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
		t.Cleanup(func() { rdb.Close() })
		// A long deadline: a loaded machine must not turn an answer Redis
		// gives into the failure policy's. A dead Redis refuses at once.
		f, err := NewInFlight(rdb, l, append([]Option{WithTimeout(5 * time.Second), WithCircuit(1, time.Hour)}, opts...)...)
		require.NoError(t, err)
		release := make(chan struct{})
		h := httplimit.InFlight(f, nil, key)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Has("hold") {
				<-release
			}
		}))
		return f, h, release
	}
	_, a, releaseA := replica()
	_, b, _ := replica(WithFailureMode(FailClosed))
	serve := func(h http.Handler, target string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
		return w.Code
	}
	held := make(chan int)
	go func() { held <- serve(a, "/?hold") }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe, err := NewInFlight(srv.Client(nil), l, WithTimeout(5*time.Second))
	require.NoError(t, err)
	for n := int64(0); n == 0; { // until the held request has its slot
		n, err = probe.InUse(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, ctx.Err(), "the held request never took its slot")
	}
	assert.Equal(t, http.StatusTooManyRequests, serve(b, "/"), "the other replica sees the slot held")
	assert.Equal(t, http.StatusTooManyRequests, serve(a, "/"))
	close(releaseA)
	assert.Equal(t, http.StatusOK, <-held)
	assert.Equal(t, http.StatusOK, serve(b, "/"))

	require.NoError(t, srv.Kill())
	assert.Equal(t, http.StatusOK, serve(a, "/"), "fail open, the default")
	assert.Equal(t, http.StatusTooManyRequests, serve(b, "/"), "fail closed")
	assert.Equal(t, http.StatusTooManyRequests, serve(b, "/"), "fail closed, circuit open")
}

// TestHungRedisAnswersByTheDeadline stops Redis (SIGSTOP: it accepts
// connections and never answers) under a Lockout and an InFlight: each
// call answers by its deadline with its policy's Decision, and once Redis
// runs again, Redis decides again.
func TestHungRedisAnswersByTheDeadline(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	defer rdb.Close()
	opts := []Option{WithTimeout(drillTimeout), WithCircuit(100, time.Hour)} // the circuit stays closed: every call waits
	lo, err := NewLockout(rdb, ratelimit.LockoutRule{Failures: 2, Within: time.Hour, Block: time.Hour}, opts...)
	require.NoError(t, err)
	f, err := NewInFlight(rdb, ratelimit.InFlightLimit{Limit: 1, MaxHold: time.Minute}, opts...)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, srv.Pause())
	for range 2 {
		start := time.Now()
		d, err := lo.Check(ctx, "k")
		assert.Less(t, time.Since(start), drillTimeout+slack, "a lockout check waited past its deadline")
		require.ErrorIs(t, err, ErrUnavailable)
		assert.False(t, d.Allowed, "a lockout fails closed")

		start = time.Now()
		_, _, err = lo.Fail(ctx, "k")
		assert.Less(t, time.Since(start), drillTimeout+slack, "a failure waited past its deadline")
		require.ErrorIs(t, err, ErrUnavailable)

		start = time.Now()
		_, d, err = f.Acquire("k")
		assert.Less(t, time.Since(start), drillTimeout+slack, "an acquisition waited past its deadline")
		require.ErrorIs(t, err, ErrUnavailable)
		assert.True(t, d.Allowed, "an in-flight limit fails open")
	}
	require.NoError(t, srv.Resume())
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := lo.Check(ctx, "k")
		if err == nil {
			assert.True(t, d.Allowed)
			break
		}
		require.True(t, time.Now().Before(deadline), "checks did not resume: %v", err)
	}
	rel, d, err := f.Acquire("k")
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	rel()
}
