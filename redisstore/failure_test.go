package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	drillTimeout = 50 * time.Millisecond
	// slack is how far past its deadline a check may return on a loaded
	// machine under the race detector: scheduling, not waiting on Redis.
	// A check that does wait on a hung Redis waits for the client's own
	// timeouts (seconds: go-redis reads for 3 s, dials for 5 s, and the
	// drills' clients read for 2 s), so a second still tells the two
	// apart while a descheduled process on a busy machine passes.
	slack = time.Second
)

// drillServer starts a redis-server of the test's own, to hang and crash.
func drillServer(t *testing.T) *redistest.Server {
	t.Helper()
	needRedis(t)
	return redistest.New(t)
}

var drillRule = ratelimit.GCRA{Rate: ratelimit.Every(year), Burst: 3}

// drillee is what a drill checks: a Store or a Composite.
type drillee interface {
	Check(key string, cost ratelimit.Units) (ratelimit.Decision, error)
	CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error)
	Stats() Stats
}

// timed runs one check and requires that it end by its deadline.
func timed(t *testing.T, s drillee, key string) (ratelimit.Decision, error) {
	t.Helper()
	start := time.Now()
	d, err := s.Check(key, ratelimit.Unit)
	took := time.Since(start)
	assert.Less(t, took, drillTimeout+slack, "a check waited past its deadline")
	return d, err
}

// awaitResume checks until Redis decides again (the circuit lets a probe
// through after its pause), and returns that Decision.
func awaitResume(t *testing.T, s drillee, key string) ratelimit.Decision {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := timed(t, s, key)
		if err == nil {
			return d
		}
		require.ErrorIs(t, err, ErrUnavailable)
		require.True(t, time.Now().Before(deadline), "checks did not resume: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
}

// drillLayers are the layers of the Composite the drills check: drillRule
// and a generous per-customer limit, so that drillRule decides.
var drillLayers = []Layer{
	{Layer: ratelimit.Layer{Rule: drillRule}},
	{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 100, Window: year}, Key: firstField}},
}

// drillees builds, on rdb under prefix, a Store of drillRule ("store") or
// a Composite of drillLayers ("composite"), with opts, and the in-process
// limiter of the same rule or layers, for a fallback.
func drillees(t *testing.T, kind string, rdb redis.UniversalClient, prefix string, opts ...Option) (drillee, ratelimit.KeyedLimiter, bool) {
	t.Helper()
	opts = append([]Option{WithPrefix(prefix), WithTimeout(drillTimeout), WithCircuit(3, 500*time.Millisecond)}, opts...)
	if kind == "store" {
		s, err := New(rdb, drillRule, opts...)
		require.NoError(t, err)
		local, err := ratelimit.NewStore(drillRule)
		require.NoError(t, err)
		return s, local, s.guard
	}
	c, err := NewComposite(rdb, drillLayers, opts...)
	require.NoError(t, err)
	base := make([]ratelimit.Layer, len(drillLayers))
	for i, l := range drillLayers {
		base[i] = l.Layer
	}
	local, err := ratelimit.Compose(base)
	require.NoError(t, err)
	return c, local, c.guard
}

// TestFailurePolicies: a Store's and a Composite's checks while Redis
// hangs or has crashed get the failure policy's answer (fail open's fresh
// key, fail closed's refusal, the fallback's own decision), the circuit
// opens after 3 failures and stops waiting on Redis, and checks resume
// once Redis is back.
func TestFailurePolicies(t *testing.T) {
	for _, ignoresContext := range []bool{false, true} {
		name := "client stops at deadline"
		if ignoresContext {
			name = "client ignores deadlines"
		}
		t.Run(name, func(t *testing.T) {
			for _, run := range [][2]string{{"store", "hang"}, {"store", "crash"}, {"composite", "hang"}, {"composite", "crash"}} {
				kind, drill := run[0], run[1]
				t.Run(kind+" "+drill, func(t *testing.T) {
					srv := drillServer(t)
					rdb := srv.Client(func(o *redis.Options) {
						o.ContextTimeoutEnabled = !ignoresContext
						o.MaxRetries = -1
						o.ReadTimeout = 2 * time.Second
					})
					defer rdb.Close()
					open, local, guard := drillees(t, kind, rdb, "open:")
					closed, _, _ := drillees(t, kind, rdb, "closed:", WithFailureMode(FailClosed))
					fallback, _, _ := drillees(t, kind, rdb, "fallback:", WithFallback(local))
					assert.Equal(t, ignoresContext, guard)

					// Healthy: Redis decides.
					for _, s := range []drillee{open, closed, fallback} {
						d, err := setupCheck(t, "k", s.CheckContext)
						require.NoError(t, err)
						require.True(t, d.Allowed)
						require.Equal(t, int64(2), d.Remaining)
					}

					if drill == "hang" {
						require.NoError(t, srv.Pause())
					} else {
						require.NoError(t, srv.Kill())
					}

					for i := range 6 {
						d, err := timed(t, open, "k")
						require.ErrorIs(t, err, ErrUnavailable)
						require.ErrorIs(t, err, ratelimit.ErrDegraded, "the Decision is the policy's")
						assert.True(t, d.Allowed, "fail open admits")
						assert.Equal(t, int64(2), d.Remaining, "as a fresh key would")
						if i >= 3 {
							assert.ErrorIs(t, err, ErrCircuitOpen)
						}

						d, err = timed(t, closed, "k")
						require.ErrorIs(t, err, ErrUnavailable)
						require.ErrorIs(t, err, ratelimit.ErrDegraded)
						assert.False(t, d.Allowed, "fail closed denies")
						assert.Positive(t, d.RetryAfter)

						// The local store's burst of 3, then denials.
						d, err = timed(t, fallback, "k")
						require.ErrorIs(t, err, ErrUnavailable)
						require.ErrorIs(t, err, ratelimit.ErrDegraded)
						assert.Equal(t, i < 3, d.Allowed, "fallback check %d", i)
					}
					assert.Equal(t, uint64(6), open.Stats().Failures)
					assert.Equal(t, uint64(3), open.Stats().CircuitRefusals)

					// While the circuit is open a check does not wait for Redis.
					start := time.Now()
					_, err := open.Check("k", ratelimit.Unit)
					require.ErrorIs(t, err, ErrCircuitOpen)
					assert.Less(t, time.Since(start), 10*time.Millisecond)

					if drill == "hang" {
						require.NoError(t, srv.Resume())
					} else {
						require.NoError(t, srv.Restart())
					}
					for _, s := range []drillee{open, closed, fallback} {
						d := awaitResume(t, s, "k")
						if drill == "hang" {
							// The state survived: one unit was spent before,
							// and the checks that timed out may have reached
							// the server once it woke, spending more. They
							// can only spend, never admit.
							assert.LessOrEqual(t, d.Remaining, int64(1))
						} else {
							// The restarted server lost its state (and its
							// script cache: EVAL replaced EVALSHA).
							assert.Equal(t, int64(2), d.Remaining)
						}
						assert.Zero(t, s.Stats().Mismatches)
					}
				})
			}
		})
	}
}

// TestCallerDeadlineFirst: the caller's context bounds a check, not the
// store's (longer) timeout.
func TestCallerDeadlineFirst(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(nil)
	defer rdb.Close()
	s, err := New(rdb, drillRule, WithTimeout(time.Hour))
	require.NoError(t, err)
	require.NoError(t, srv.Pause())
	defer srv.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), drillTimeout)
	defer cancel()
	start := time.Now()
	d, err := s.CheckContext(ctx, "k", ratelimit.Unit)
	assert.Less(t, time.Since(start), drillTimeout+slack)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "the cause is wrapped: %v", err)
	assert.True(t, d.Allowed)
}

// TestSharedDeadline: checks without a context that can end share one
// deadline while it has more than nine tenths of the timeout left, then get
// a new one.
func TestSharedDeadline(t *testing.T) {
	rdb := needRedis(t)
	s, err := New(rdb, drillRule, WithTimeout(time.Second))
	require.NoError(t, err)
	t0 := time.Now()
	a := s.sharedDeadline(t0)
	b := s.sharedDeadline(t0.Add(99 * time.Millisecond))
	assert.Same(t, a, b, "a check within a tenth of the timeout shares the deadline")
	d, ok := b.Deadline()
	require.True(t, ok)
	assert.Equal(t, t0.Add(time.Second), d)
	c := s.sharedDeadline(t0.Add(100 * time.Millisecond))
	assert.NotSame(t, a, c)
	d, _ = c.Deadline()
	assert.Equal(t, t0.Add(1100*time.Millisecond), d)
}

// setupTimeout bounds a drill's checks before anything is broken: the
// drill's own short deadline would turn a check that a loaded machine
// merely delays into the failure policy's answer, failing a correct build.
const setupTimeout = 30 * time.Second

// setupCheck runs one check of key with a deadline of setupTimeout, for a
// drill's setup.
func setupCheck(t *testing.T, key string, check func(context.Context, string, ratelimit.Units) (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	return check(ctx, key, ratelimit.Unit)
}

// TestFallbackWithin: with Redis gone, CheckWithin and Wait go to the
// fallback, which keeps the cap on a leaky bucket's Delay: a request that
// the fallback would queue for longer is refused without spending, on a
// Store and on a Composite.
func TestFallbackWithin(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	defer rdb.Close()
	rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5}
	clk := ratelimit.NewManualClock(unixNow)
	localStore, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	s, err := New(rdb, rule, WithClock(clk), WithTimeout(drillTimeout), WithFallback(localStore))
	require.NoError(t, err)
	layers := []ratelimit.Layer{{Rule: rule}}
	localComp, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
	require.NoError(t, err)
	c, err := NewComposite(rdb, []Layer{{Layer: layers[0]}}, WithClock(clk), WithTimeout(drillTimeout), WithFallback(localComp))
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	for name, lim := range map[string]interface {
		CheckWithin(string, ratelimit.Units, time.Duration) (ratelimit.Decision, error)
		Wait(context.Context, string, ratelimit.Units) (ratelimit.Decision, error)
	}{"store": s, "composite": c} {
		d, err := lim.CheckWithin("k", ratelimit.Unit, 0)
		require.ErrorIs(t, err, ErrUnavailable, name)
		require.True(t, d.Allowed, "%s: the fallback admits the first at once", name)
		d, err = lim.CheckWithin("k", ratelimit.Unit, time.Second/2)
		require.ErrorIs(t, err, ErrUnavailable, name)
		require.False(t, d.Allowed, "%s: the fallback would queue it for a second", name)
		require.Equal(t, time.Second/2, d.RetryAfter, name)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		d, err = lim.Wait(ctx, "k", ratelimit.Unit)
		cancel()
		require.ErrorIs(t, err, ErrUnavailable, name)
		require.True(t, d.Allowed, "%s: the fallback queues it", name)
		require.Equal(t, time.Second, d.Delay, "%s: nothing was spent by the refusal", name)
	}
}
