package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestInFlightSameDecisionsAsInProcess runs an InFlight in Redis beside the
// in-process InFlight on random traces, on one client clock: acquisitions
// alone and with a rate limit (a Store beside an in-process Store of the
// same rule), releases given once, twice or never, and MaxHold taking slots
// back, from Unix times past 2^53 ns up to MaxTime. Every Decision, and
// every count of slots in use, is the same, field for field.
func TestInFlightSameDecisionsAsInProcess(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		l := ratelimit.InFlightLimit{
			Limit:   rapid.Int64Range(1, 4).Draw(t, "limit"),
			MaxHold: time.Duration(rapid.SampledFrom([]int64{0, 1, 7, int64(time.Second) + 3, int64(ratelimit.MaxTime) - 1}).Draw(t, "hold")),
			Name:    rapid.SampledFrom([]string{"", "quote"}).Draw(t, "name"),
		}
		rule := ratelimit.GCRA{Rate: ratelimit.Every(time.Duration(rapid.Int64Range(1, 10).Draw(t, "pace"))), Burst: rapid.Int64Range(1, 3).Draw(t, "burst")}
		start := rapid.SampledFrom([]time.Duration{0, unixNow, ratelimit.MaxTime - year}).Draw(t, "start")
		clk := ratelimit.NewManualClock(start)
		local, err := ratelimit.NewInFlight(l, ratelimit.WithClock(clk))
		require.NoError(t, err)
		localRate, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		prefix := testPrefix()
		f, err := NewInFlight(rdb, l, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
		require.NoError(t, err)
		rate, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
		require.NoError(t, err)
		ctx := context.Background()
		keys := []string{"a", "b"}
		type pair struct{ local, redis ratelimit.Release }
		var held []pair
		take := func(t *rapid.T, with bool) {
			k := rapid.SampledFrom(keys).Draw(t, "key")
			var (
				lr, rr     ratelimit.Release
				want, got  ratelimit.Decision
				werr, gerr error
			)
			if with {
				cost := ratelimit.Unit * ratelimit.Units(rapid.Int64Range(1, 2).Draw(t, "cost"))
				lr, want, werr = local.AcquireWith(ctx, k, localRate, cost)
				rr, got, gerr = f.AcquireWith(ctx, k, rate, cost)
			} else {
				lr, want, werr = local.Acquire(k)
				rr, got, gerr = f.Acquire(k)
			}
			require.Equal(t, werr == nil, gerr == nil, "errors: %v, %v", werr, gerr)
			require.Equal(t, want, got, "acquire %q at %d", k, clk.Now())
			held = append(held, pair{lr, rr})
		}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.OneOf(rapid.Int64Range(0, 9), rapid.Int64Range(0, int64(2*time.Second))).Draw(t, "by")))
			},
			"acquire":      func(t *rapid.T) { take(t, false) },
			"acquire with": func(t *rapid.T) { take(t, true) },
			"release": func(t *rapid.T) {
				if len(held) == 0 {
					t.Skip("nothing held")
				}
				i := rapid.IntRange(0, len(held)-1).Draw(t, "which")
				held[i].local()
				held[i].redis()
				if rapid.Bool().Draw(t, "forget it") {
					held = append(held[:i], held[i+1:]...)
				}
			},
			"": func(t *rapid.T) {
				for _, k := range keys {
					n, err := f.InUse(ctx, k)
					require.NoError(t, err)
					require.Equal(t, local.InUse(k), n, "in use %q at %d", k, clk.Now())
				}
			},
		})
		require.Zero(t, f.Stats())
		require.Zero(t, rate.Stats().Mismatches)
	})
}

// TestInFlightAtMostLimitAcrossClients: 1,000 acquisitions at once from
// three clients (three processes' connections) on one key never have more
// than Limit slots in progress together, also while a fourth process that
// took slots and was killed holds them: they are held until MaxHold takes
// them back, and not a moment longer.
func TestInFlightAtMostLimitAcrossClients(t *testing.T) {
	needRedis(t)
	const (
		limit   = 10
		crashed = 4
		total   = 1000
		workers = 12 // per client: bounded, the machine is shared
	)
	l := ratelimit.InFlightLimit{Limit: limit, MaxHold: time.Minute, Name: "quote"}
	clk := ratelimit.NewManualClock(unixNow)
	prefix := testPrefix()
	newReplica := func() (*InFlight, *redis.Client) {
		c := shared.Client(nil)
		f, err := NewInFlight(c, l, WithClock(clk), WithPrefix(prefix), WithTimeout(10*time.Second))
		require.NoError(t, err)
		return f, c
	}
	// A replica takes slots and dies without releasing them.
	dead, deadClient := newReplica()
	for range crashed {
		_, d, err := dead.Acquire("k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, deadClient.Close())

	var replicas []*InFlight
	for range 3 {
		f, c := newReplica()
		t.Cleanup(func() { c.Close() })
		replicas = append(replicas, f)
	}
	// run makes total acquisitions from every replica at once. A slot taken
	// is held until an acquisition is refused, which then releases the
	// oldest slot held: the key stays near its limit, so that one slot too
	// many would show. holding is at most what Redis holds at any instant
	// (a slot joins it after Redis gave it, and leaves before its release).
	run := func(most int) (admitted int) {
		var (
			mu      sync.Mutex
			holding []ratelimit.Release
			peak    int
			done    atomic.Int64
		)
		var wg sync.WaitGroup
		for _, f := range replicas {
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Add(1) <= total {
						rel, d, err := f.Acquire("k")
						if !assert.NoError(t, err) {
							return
						}
						mu.Lock()
						if d.Allowed {
							admitted++
							holding = append(holding, rel)
							peak = max(peak, len(holding))
							mu.Unlock()
							continue
						}
						var oldest ratelimit.Release
						if len(holding) > 0 {
							oldest, holding = holding[0], holding[1:]
						}
						mu.Unlock()
						if oldest != nil {
							oldest()
						}
					}
				}()
			}
		}
		wg.Wait()
		assert.LessOrEqual(t, peak, most, "slots in progress at once")
		// Then, one at a time, take what is left: the slots held come to
		// exactly most.
		for {
			rel, d, err := replicas[0].Acquire("k")
			require.NoError(t, err)
			if !d.Allowed {
				break
			}
			holding = append(holding, rel)
		}
		assert.Len(t, holding, most, "slots held once the key is full")
		for _, rel := range holding {
			rel()
		}
		return admitted
	}
	n := run(limit - crashed)
	assert.Positive(t, n)
	held, err := replicas[0].InUse(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, int64(crashed), held, "the dead replica's slots are still held before MaxHold")

	clk.Advance(time.Minute - 1)
	held, err = replicas[1].InUse(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, int64(crashed), held, "a nanosecond before MaxHold")
	clk.Advance(1)
	held, err = replicas[2].InUse(context.Background(), "k")
	require.NoError(t, err)
	assert.Zero(t, held, "MaxHold took the dead replica's slots back")
	run(limit)

	// All slots were released: the key is gone from Redis.
	exists, err := replicas[0].rdb.Exists(context.Background(), replicas[0].Key("k")).Result()
	require.NoError(t, err)
	assert.Zero(t, exists)
}

// TestInFlightAcquireWithAllOrNothing: a request the rate limit refuses
// takes no slot, one refused a slot spends nothing, and neither is seen by
// another client.
func TestInFlightAcquireWithAllOrNothing(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	prefix := testPrefix()
	f, err := NewInFlight(rdb, ratelimit.InFlightLimit{Limit: 1}, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	rate, err := New(rdb, ratelimit.FixedWindow{Limit: 2, Window: time.Hour}, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	ctx := context.Background()

	rel, d, err := f.AcquireWith(ctx, "k", rate, ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Equal(t, int64(1), d.Remaining, "the rate limit's Decision")
	_, d, err = f.AcquireWith(ctx, "k", rate, ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "no slot free")
	peek, err := rate.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, peek.Allowed, "a request refused a slot spends nothing")
	assert.Equal(t, int64(0), peek.Remaining, "one left, the one peeked at")
	rel()
	rel() // idempotent

	d, err = rate.Check("k", ratelimit.Unit) // spend the rest
	require.NoError(t, err)
	require.True(t, d.Allowed)
	_, d, err = f.AcquireWith(ctx, "k", rate, ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Positive(t, d.RetryAfter, "the rate limit's refusal, with its wait")
	n, err := f.InUse(ctx, "k")
	require.NoError(t, err)
	assert.Zero(t, n, "a request the rate limit refuses takes no slot")

	_, _, err = f.AcquireWith(ctx, "k", nil, ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrInvalidRule)

	// Another rate limiter is asked after the slot is taken, and the slot
	// given back if it refuses.
	other, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 1, Window: time.Hour}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	orel, d, err := f.AcquireWith(ctx, "o", other, ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	orel()
	_, d, err = f.AcquireWith(ctx, "o", other, ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	n, err = f.InUse(ctx, "o")
	require.NoError(t, err)
	assert.Zero(t, n, "the slot is given back when the other limiter refuses")
	_, _, err = f.AcquireWith(ctx, "k", rate, 5*ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	// With no slot free, rate is not asked: a cost it would reject is
	// refused, as in process.
	rel, _, err = f.Acquire("k")
	require.NoError(t, err)
	defer rel()
	_, d, err = f.AcquireWith(ctx, "k", rate, 5*ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
}

// TestInFlightFailurePolicies stops Redis under in-flight limits of each
// policy: by default a request goes on holding no slot (fail open), fail
// closed refuses, a fallback takes an in-process slot; every answer
// carries an error matching ErrUnavailable and ErrDegraded; once Redis is
// back, it decides again.
func TestInFlightFailurePolicies(t *testing.T) {
	srv := drillServer(t)
	// A dead Redis refuses connections at once; the long deadline keeps a
	// loaded machine from turning Redis's answers into the policy's.
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	defer rdb.Close()
	l := ratelimit.InFlightLimit{Limit: 2, MaxHold: time.Minute}
	local, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: 1})
	require.NoError(t, err)
	opts := []Option{WithTimeout(5 * time.Second), WithCircuit(2, 50*time.Millisecond)}
	open, err := NewInFlight(rdb, l, opts...)
	require.NoError(t, err)
	closed, err := NewInFlight(rdb, l, append(opts, WithFailureMode(FailClosed))...)
	require.NoError(t, err)
	fallback, err := NewInFlight(rdb, l, append(opts, WithInFlightFallback(local))...)
	require.NoError(t, err)

	rel, d, err := open.Acquire("k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, srv.Kill())
	rel() // fails, counted; MaxHold would take the slot back
	for range 4 {
		_, d, err := open.Acquire("k")
		require.ErrorIs(t, err, ErrUnavailable)
		require.ErrorIs(t, err, ratelimit.ErrDegraded)
		assert.True(t, d.Allowed, "fail open")
		_, d, err = closed.Acquire("k")
		require.ErrorIs(t, err, ErrUnavailable)
		assert.False(t, d.Allowed, "fail closed")
		assert.Equal(t, 50*time.Millisecond, d.RetryAfter)
	}
	lrel, d, err := fallback.Acquire("k")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.True(t, d.Allowed)
	_, d, err = fallback.Acquire("k")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, d.Allowed, "the fallback's own limit of 1")
	lrel()
	assert.Zero(t, local.InUse("k"))
	assert.NotZero(t, open.Stats().Failures)

	require.NoError(t, srv.Restart())
	deadline := time.Now().Add(10 * time.Second)
	for {
		rel, d, err := closed.Acquire("k")
		if err == nil {
			assert.True(t, d.Allowed)
			assert.Equal(t, int64(1), d.Remaining, "Redis restarted empty")
			rel()
			break
		}
		require.ErrorIs(t, err, ErrUnavailable)
		require.True(t, time.Now().Before(deadline), "acquisitions did not resume: %v", err)
		time.Sleep(10 * time.Millisecond) // waiting out the circuit's pause on the wall clock
	}
}
