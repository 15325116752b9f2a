package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeekWritesNothing: a peek neither creates a key nor changes one, not
// its state nor its expiry, and a rule that counts refusals counts none.
func TestPeekWritesNothing(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	rule := ratelimit.SlidingCounter{Limit: 2, Window: time.Minute, CountRefused: true}
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)

	d, err := s.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(1), d.Remaining)
	assert.Zero(t, rdb.Exists(ctx, s.Key("k")).Val(), "a peek created the key")

	for range 2 {
		d, err = s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	before := rdb.Get(ctx, s.Key("k")).Val()
	ttl := rdb.PTTL(ctx, s.Key("k")).Val()
	clk.Advance(time.Second)
	for range 3 {
		d, err = s.Peek("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.False(t, d.Allowed)
	}
	assert.Equal(t, before, rdb.Get(ctx, s.Key("k")).Val(), "a peek wrote")
	assert.LessOrEqual(t, rdb.PTTL(ctx, s.Key("k")).Val(), ttl, "a peek moved the expiry")

	_, err = s.Peek("k", 0)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	_, err = s.Peek("k", 3*ratelimit.Unit)
	assert.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
}

// TestRefundKeepsExpiry: a refund keeps the expiry the check set, never
// creates a key, and a refunded key is as before the check.
func TestRefundKeepsExpiry(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerMinute(10), Burst: 5}, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)

	g, err := s.Refund("k", ratelimit.Unit, clk.Now())
	require.NoError(t, err)
	assert.Zero(t, g)
	assert.Zero(t, rdb.Exists(ctx, s.Key("k")).Val(), "a refund created the key")

	first, err := s.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	d, err := s.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	ttl := rdb.PTTL(ctx, s.Key("k")).Val()
	require.Positive(t, ttl)
	g, err = s.Refund("k", 2*ratelimit.Unit, d.At)
	require.NoError(t, err)
	assert.Equal(t, 2*ratelimit.Unit, g)
	after := rdb.PTTL(ctx, s.Key("k")).Val()
	assert.Positive(t, after, "the refund dropped the expiry")
	assert.LessOrEqual(t, after, ttl)

	again, err := s.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, d, again, "check then refund leaves the key as it was")
	assert.Equal(t, first.Remaining-2, again.Remaining)

	_, err = s.Refund("k", 0, d.At)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
}

// TestResetKeepsTheClamp: a reset leaves a fresh key that still clamps
// time, expiring after the margin; a key Redis does not hold stays absent.
func TestResetKeepsTheClamp(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 1, Window: time.Second}, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(time.Minute))
	require.NoError(t, err)

	require.NoError(t, s.Reset("k"))
	assert.Zero(t, rdb.Exists(ctx, s.Key("k")).Val())

	d, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, s.Reset("k"))
	assert.Equal(t, i64(int64(unixNow)), rdb.Get(ctx, s.Key("k")).Val())
	ttl := rdb.PTTL(ctx, s.Key("k")).Val()
	assert.Positive(t, ttl)
	assert.LessOrEqual(t, ttl, time.Minute)

	// Time back into the previous window: the key still decides at its
	// latest instant, in the window it was reset in.
	clk.Set(unixNow - time.Second)
	d, err = s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, unixNow, d.At)

	// A corrupted state has no clamp to keep: the key is deleted.
	require.NoError(t, rdb.Set(ctx, s.Key("bad"), "x y", 0).Err())
	_, err = s.Check("bad", ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	require.NoError(t, s.Reset("bad"))
	assert.Zero(t, rdb.Exists(ctx, s.Key("bad")).Val())
}

// TestRefundAndResetClearTheDenyCache: a refusal cached here no longer
// refuses once this store refunds or resets the key.
func TestRefundAndResetClearTheDenyCache(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 1, Window: time.Hour}, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	for _, op := range []string{"refund", "reset"} {
		t.Run(op, func(t *testing.T) {
			clk.Advance(time.Hour)
			a, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, a.Allowed)
			for range 2 {
				d, err := s.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.False(t, d.Allowed)
			}
			denials := s.Stats().LocalDenials
			require.Positive(t, denials, "the refusal is cached")
			if op == "refund" {
				g, err := s.Refund("k", ratelimit.Unit, a.At)
				require.NoError(t, err)
				require.Equal(t, ratelimit.Unit, g)
			} else {
				require.NoError(t, s.Reset("k"))
			}
			d, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, d.Allowed, "the cached refusal outlived the %s", op)
			assert.Equal(t, denials, s.Stats().LocalDenials)
		})
	}
}

// checkAndRefund has 16 goroutines check key for a unit rounds times each
// on l, and refund two of every three admissions at once, and returns how
// many checks were admitted, the milli-units given back, and how many
// refunds conflicted on every attempt.
func checkAndRefund(t *testing.T, l interface {
	Check(string, ratelimit.Units) (ratelimit.Decision, error)
	Refund(string, ratelimit.Units, time.Duration) (ratelimit.Units, error)
}, key string, rounds int) (admitted, given, conflicts int64) {
	t.Helper()
	var na, ng, nc atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				d, err := l.Check(key, ratelimit.Unit)
				if !assert.NoError(t, err) {
					return
				}
				if !d.Allowed {
					continue
				}
				na.Add(1)
				if (w+i)%3 == 0 {
					continue // kept
				}
				g, err := l.Refund(key, ratelimit.Unit, d.At)
				if errors.Is(err, ErrConflict) {
					nc.Add(1)
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				ng.Add(int64(g))
			}
		}()
	}
	wg.Wait()
	return na.Load(), ng.Load(), nc.Load()
}

// TestRefundConcurrent: checks and refunds from many goroutines on one key
// never let the key's spending exceed its limit, none of the refunds
// conflicts (each is one script), and many refunds of one admission give
// it back once.
func TestRefundConcurrent(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"fixed window": ratelimit.FixedWindow{Limit: 10, Window: time.Hour},
		"gcra":         ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 10},
		"sliding log":  ratelimit.SlidingLog{Limit: 10, Window: time.Hour},
		"sub-window":   ratelimit.SubWindow{Limit: 10, Window: time.Hour, Buckets: 3},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow) // time stands still
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
			require.NoError(t, err)
			admitted, given, conflicts := checkAndRefund(t, s, "k", 100)
			assert.Zero(t, conflicts, "refunds conflicted")
			spent := admitted*int64(ratelimit.Unit) - given
			assert.LessOrEqual(t, spent, 10*int64(ratelimit.Unit), "more spent than the limit")
			// Redis holds exactly what was spent and not given back.
			left := 10 - spent/int64(ratelimit.Unit)
			d, err := s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, left > 0, d.Allowed)
			if left > 0 {
				assert.Equal(t, left-1, d.Remaining)
			}
			t.Logf("%d admitted, %d milli-units given back", admitted, given)

			// One admission refunded by many at once: given back once.
			require.NoError(t, s.Reset("k"))
			a, err := s.Check("k", 3*ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, a.Allowed)
			var once atomic.Int64
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g, err := s.Refund("k", 3*ratelimit.Unit, a.At)
					assert.NoError(t, err)
					once.Add(int64(g))
				}()
			}
			wg.Wait()
			assert.Equal(t, int64(3*ratelimit.Unit), once.Load(), "the admission was not given back exactly once")
		})
	}
}

// TestOpsWhenRedisFails: a Redis that hangs or is down makes Peek, Refund
// and Reset return an error wrapping ErrUnavailable by their deadline.
func TestOpsWhenRedisFails(t *testing.T) {
	for _, drill := range []string{"hang", "crash"} {
		t.Run(drill, func(t *testing.T) {
			srv := drillServer(t)
			rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
			defer rdb.Close()
			s, err := New(rdb, drillRule, WithTimeout(drillTimeout), WithCircuit(100, time.Second))
			require.NoError(t, err)
			closed, err := New(rdb, drillRule, WithTimeout(drillTimeout), WithFailureMode(FailClosed))
			require.NoError(t, err)
			local, err := ratelimit.NewStore(drillRule)
			require.NoError(t, err)
			_, err = local.Check("k", 2*ratelimit.Unit)
			require.NoError(t, err)
			fallback, err := New(rdb, drillRule, WithTimeout(drillTimeout), WithFallback(local))
			require.NoError(t, err)
			d, err := setupCheck(t, "k", s.CheckContext)
			require.NoError(t, err)
			if drill == "hang" {
				require.NoError(t, srv.Pause())
				defer srv.Resume()
			} else {
				require.NoError(t, srv.Kill())
			}
			within := func(what string, f func() error) {
				start := time.Now()
				err := f()
				assert.Less(t, time.Since(start), drillTimeout+slack, "%s waited past its deadline", what)
				assert.ErrorIs(t, err, ErrUnavailable, what)
			}
			within("refund", func() error {
				g, err := s.Refund("k", ratelimit.Unit, d.At)
				assert.Zero(t, g)
				return err
			})
			within("peek", func() error {
				p, err := s.Peek("k", ratelimit.Unit)
				assert.True(t, p.Allowed, "fail open")
				return err
			})
			within("reset", func() error { return s.Reset("k") })
			within("peek, fail closed", func() error {
				p, err := closed.Peek("k", ratelimit.Unit)
				assert.False(t, p.Allowed, "fail closed")
				return err
			})
			within("peek, fallback", func() error {
				p, err := fallback.Peek("k", ratelimit.Unit)
				assert.True(t, p.Allowed)
				assert.Zero(t, p.Remaining, "the fallback's Peek: one of three left before this one")
				return err
			})
			assert.Equal(t, 1, local.Len())
			lp, err := local.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Zero(t, lp.Remaining, "a peek spent in the fallback")
			ctx, cancel := context.WithTimeout(context.Background(), drillTimeout/2)
			defer cancel()
			within("refund with the caller's deadline", func() error {
				_, err := s.RefundContext(ctx, "k", ratelimit.Unit, d.At)
				return err
			})
		})
	}
}

// TestCompositeRefundConcurrent: checks and refunds from many goroutines
// on a two-layer Composite spend no layer past its limit, and each layer
// holds exactly what was admitted and not given back: a refund writes
// every layer or none.
func TestCompositeRefundConcurrent(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow) // time stands still
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 5, Window: time.Hour}, Key: firstField}},
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 3}}},
	}
	c, err := NewComposite(rdb, layers, WithClock(clk), WithPrefix(testPrefix()), WithHashTag(firstField), WithTimeout(5*time.Second))
	require.NoError(t, err)
	admitted, given, conflicts := checkAndRefund(t, c, "acme /a", 50)
	spent := admitted*int64(ratelimit.Unit) - given
	require.LessOrEqual(t, spent, 3*int64(ratelimit.Unit), "more spent than the tighter limit")
	t.Logf("%d admitted, %d milli-units given back, %d refunds conflicted", admitted, given, conflicts)
	// Both layers hold exactly the net spend: the tighter one refuses
	// exactly when it is all spent, and the looser one has the rest.
	left := 3 - spent/int64(ratelimit.Unit)
	d, err := c.Peek("acme /a", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, left > 0, d.Allowed)
	if left > 0 {
		assert.Equal(t, left-1, d.Remaining)
	}
	wide, err := NewComposite(rdb, layers[:1], WithClock(clk), WithPrefix(c.o.prefix), WithHashTag(firstField))
	require.NoError(t, err)
	d, err = wide.Peek("acme /a", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 5-spent/int64(ratelimit.Unit)-1, d.Remaining, "the per-customer layer")
}

// TestCompositeOpsWhenRedisFails: a Composite's Peek, Refund and Reset
// return an error wrapping ErrUnavailable by their deadline when Redis is
// down.
func TestCompositeOpsWhenRedisFails(t *testing.T) {
	srv := drillServer(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	defer rdb.Close()
	c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: drillRule}}}, WithTimeout(drillTimeout))
	require.NoError(t, err)
	d, err := c.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.NoError(t, srv.Pause())
	defer srv.Resume()
	start := time.Now()
	_, err = c.Refund("k", ratelimit.Unit, d.At)
	assert.ErrorIs(t, err, ErrUnavailable)
	_, err = c.Peek("k", ratelimit.Unit)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorIs(t, c.Reset("k"), ErrUnavailable)
	assert.Less(t, time.Since(start), 3*drillTimeout+slack, "waited past the deadlines")
}

// TestOneStateRefusesAReplyWithoutIt: a read's reply that carries no state
// (a status and an instant only, which parseOp accepts for writes) is a
// mismatch, counted, for Peek as for Refund and Settle, not an index past
// the reply.
func TestOneStateRefusesAReplyWithoutIt(t *testing.T) {
	var s Store
	_, err := s.oneState(opReply{instant: 1})
	require.ErrorIs(t, err, ErrMismatch)
	require.Equal(t, uint64(1), s.mismatches.Load())
	state, err := s.oneState(opReply{states: [][]byte{[]byte("x")}})
	require.NoError(t, err)
	require.Equal(t, []byte("x"), state)
	require.Equal(t, uint64(1), s.mismatches.Load())
}
