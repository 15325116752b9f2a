package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSettleExpiry: a charge moves the key's expiry to the settled state's
// ResetAfter plus the margin, as a check would set it; a refund keeps the
// key's; a charge creates a key Redis did not hold, with its expiry, and a
// refund on such a key creates nothing.
func TestSettleExpiry(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerMinute(1), Burst: 10}, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(2*time.Second))
	require.NoError(t, err)
	a, err := s.Check("k", 3*ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, 3*time.Minute, a.ResetAfter)

	d, settled, err := s.Settle("k", 3*ratelimit.Unit, 15*ratelimit.Unit, a.At)
	require.NoError(t, err)
	assert.Equal(t, 15*ratelimit.Unit, settled)
	assert.False(t, d.Allowed, "in debt")
	assert.Equal(t, 15*time.Minute, d.ResetAfter)
	ttl, err := rdb.PTTL(ctx, s.Key("k")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, d.ResetAfter+time.Second, "the expiry moved with the debt")
	assert.LessOrEqual(t, ttl, d.ResetAfter+2*time.Second)

	// A refund keeps the expiry (its state is fresh no later).
	d, settled, err = s.Settle("k", 10*ratelimit.Unit, 5*ratelimit.Unit, a.At)
	require.NoError(t, err)
	assert.Equal(t, 5*ratelimit.Unit, settled)
	assert.Equal(t, 10*time.Minute, d.ResetAfter)
	after, err := rdb.PTTL(ctx, s.Key("k")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, after, ttl)
	assert.Greater(t, after, 15*time.Minute)

	d, settled, err = s.Settle("new", ratelimit.Unit, 4*ratelimit.Unit, clk.Now())
	require.NoError(t, err)
	assert.Equal(t, 4*ratelimit.Unit, settled)
	assert.Equal(t, 4*time.Minute, d.ResetAfter)
	ttl, err = rdb.PTTL(ctx, s.Key("new")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, d.ResetAfter+time.Second)
	assert.LessOrEqual(t, ttl, d.ResetAfter+2*time.Second)

	_, settled, err = s.Settle("none", 2*ratelimit.Unit, ratelimit.Unit, clk.Now())
	require.NoError(t, err)
	assert.Equal(t, 2*ratelimit.Unit, settled, "nothing to give back")
	n, err := rdb.Exists(ctx, s.Key("none")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)

	// Cost errors reach no server.
	_, _, err = s.Settle("k", 0, ratelimit.Unit, 0)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	_, _, err = s.Settle("k", ratelimit.Unit, 0, 0)
	assert.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	_, _, err = s.Settle("k", 11*ratelimit.Unit, ratelimit.Unit, 0)
	assert.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
}

// TestSettleAndTheDenyCache: a charge leaves a cached refusal that answers
// as Redis does after the charge (a longer wait); a refund drops it.
func TestSettleAndTheDenyCache(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}
	prefix := testPrefix()
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	plain, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithDenyCache(0))
	require.NoError(t, err)
	var last ratelimit.Decision
	for range 5 {
		last, err = s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, last.Allowed)
	}
	d, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 100*time.Millisecond, d.RetryAfter)

	_, settled, err := s.Settle("k", ratelimit.Unit, 5*ratelimit.Unit, last.At)
	require.NoError(t, err)
	require.Equal(t, 5*ratelimit.Unit, settled)
	clk.Advance(time.Millisecond)
	denials := s.Stats().LocalDenials
	cached, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, denials+1, s.Stats().LocalDenials, "the cache answered")
	want, err := plain.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, want, cached, "the cached refusal knows of the charge")
	assert.Equal(t, 499*time.Millisecond, cached.RetryAfter)

	// A refund drops it: the cached state would still refuse, Redis's
	// admits.
	clk.Advance(400 * time.Millisecond)
	_, settled, err = s.Settle("k", 5*ratelimit.Unit, ratelimit.Unit, clk.Now())
	require.NoError(t, err)
	require.Equal(t, ratelimit.Unit, settled)
	denials = s.Stats().LocalDenials
	d, err = s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the cached refusal outlived the refund")
	assert.Equal(t, denials, s.Stats().LocalDenials)
}

// TestSettleConcurrent: checks and settlements from many goroutines on one
// key, time standing still, charge exactly what they report: the key's
// schedule runs ahead by the admitted costs plus the settled differences,
// none lost and none twice, and never past the debt bound; none
// conflicts (each is one script).
func TestSettleConcurrent(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow) // time stands still
	// 10 per second: a unit is 100 ms of schedule.
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
	require.NoError(t, err)
	var spent atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				d, err := s.Check("k", ratelimit.Unit)
				if !assert.NoError(t, err) {
					return
				}
				if !d.Allowed {
					continue
				}
				actual := ratelimit.Units(1+(w+i)%3) * ratelimit.Unit
				_, settled, err := s.Settle("k", ratelimit.Unit, actual, d.At)
				if !assert.NoError(t, err) {
					return
				}
				spent.Add(int64(settled))
			}
		}()
	}
	wg.Wait()
	state, err := rdb.Get(ctx, s.Key("k")).Result()
	require.NoError(t, err)
	f := strings.Fields(state)
	require.Len(t, f, 3)
	tat, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	assert.Equal(t, spent.Load()*int64(100*time.Millisecond)/int64(ratelimit.Unit), tat-int64(unixNow), "the schedule holds what was reported spent")
	assert.LessOrEqual(t, spent.Load(), int64(20*ratelimit.Unit), "past the debt bound")
	t.Logf("%d milli-units spent", spent.Load())
}

// beforeScript is a client hook that calls itself with every script
// command (EVAL or EVALSHA) before the client sends it.
type beforeScript func(cmd redis.Cmder)

func (h beforeScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h beforeScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h beforeScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h(cmd)
		}
		return next(ctx, cmd)
	}
}

// interloper runs before each settle.lua a Composite sends (a refund,
// mode 'r', or a settlement, mode 's'), as a check from another process
// landing just before it would; add its hook to a client.
type interloper struct {
	before func()
	sent   atomic.Int64
}

func (h *interloper) hook() redis.Hook {
	return beforeScript(func(cmd redis.Cmder) {
		// EVALSHA sha numkeys keys... now mode ...
		args := cmd.Args()
		if len(args) < 3 {
			return
		}
		n, _ := strconv.Atoi(fmt.Sprint(args[2]))
		if m := 4 + n; len(args) > m && (args[m] == "r" || args[m] == "s") {
			h.sent.Add(1)
			h.before()
		}
	})
}

// TestCompositeSettleAfterAnotherCheck: a Composite's refund or
// settlement that another process's check lands just before is made
// once, at once, on the state that check left (never ErrConflict, which a
// compare-and-set computed in Go would have retried into): the same
// Decisions and amounts as the in-process Composite given the same
// requests in the same order.
func TestCompositeSettleAfterAnotherCheck(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	rules := []ratelimit.Rule{
		ratelimit.SlidingLog{Limit: 20, Window: time.Hour},
		ratelimit.SubWindow{Limit: 30, Window: time.Hour, Buckets: 4},
	}
	layers := make([]Layer, len(rules))
	local := make([]ratelimit.Layer, len(rules))
	for i, r := range rules {
		layers[i] = Layer{Layer: ratelimit.Layer{Rule: r}}
		local[i] = ratelimit.Layer{Rule: r}
	}
	want, err := ratelimit.Compose(local, ratelimit.WithClock(clk))
	require.NoError(t, err)
	prefix := testPrefix()
	other, err := NewComposite(rdb, layers, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	h := &interloper{before: func() {
		clk.Advance(time.Millisecond)
		d, err := other.Check("k", ratelimit.Unit)
		assert.NoError(t, err)
		w, err := want.Check("k", ratelimit.Unit)
		assert.NoError(t, err)
		assert.Equal(t, w, d)
	}}
	hooked := shared.Client(nil)
	defer hooked.Close()
	hooked.AddHook(h.hook())
	// Loaded, so that no NOSCRIPT makes the client send it twice.
	require.NoError(t, settleScript.Load(context.Background(), rdb).Err())
	c, err := NewComposite(hooked, layers, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	a, err := c.Check("k", 3*ratelimit.Unit)
	require.NoError(t, err)
	w, err := want.Check("k", 3*ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, w, a)

	for _, actual := range []ratelimit.Units{8 * ratelimit.Unit, ratelimit.Unit} {
		h.sent.Store(0)
		d, settled, err := c.Settle("k", 3*ratelimit.Unit, actual, a.At)
		require.NoError(t, err)
		wd, wx, err := want.Settle("k", 3*ratelimit.Unit, actual, a.At)
		require.NoError(t, err)
		assert.Equal(t, wd, d)
		assert.Equal(t, wx, settled)
		assert.Equal(t, int64(1), h.sent.Load(), "one script, sent once")
	}
	h.sent.Store(0)
	g, err := c.Refund("k", 2*ratelimit.Unit, a.At)
	require.NoError(t, err)
	wg, err := want.Refund("k", 2*ratelimit.Unit, a.At)
	require.NoError(t, err)
	assert.Equal(t, wg, g)
	assert.Equal(t, int64(1), h.sent.Load(), "one script, sent once")
	h.before = func() {}
	got, err := c.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	wd, err := want.Peek("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, wd, got)
	st := c.Stats()
	assert.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
}

// TestCompositeSettleExpiry: a composite's charge moves each enforced
// layer's expiry on with its debt, as the Store's does.
func TestCompositeSettleExpiry(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	c, err := NewComposite(rdb, []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(1), Burst: 10}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour}}},
	}, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(2*time.Second))
	require.NoError(t, err)
	a, err := c.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	d, settled, err := c.Settle("k", ratelimit.Unit, 15*ratelimit.Unit, a.At)
	require.NoError(t, err)
	assert.Equal(t, 15*ratelimit.Unit, settled)
	assert.False(t, d.Allowed)
	keys, err := c.keys("k", ratelimit.Unit)
	require.NoError(t, err)
	ttl, err := rdb.PTTL(ctx, keys[0]).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 15*time.Minute+time.Second, "the expiry moved with the debt")
	assert.LessOrEqual(t, ttl, 15*time.Minute+2*time.Second)
}

// TestSettleToTheLastInstant: a charge that moves a bucket's schedule to
// the last int64 instants settles as the Machine settles it, Redis holds
// the state it writes, and every check on that state, on each path,
// decides and writes as the Machine does.
func TestSettleToTheLastInstant(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 1000, Per: 2481125}, Burst: 999999999999989}
	const start = 4261124999999972708
	clk := ratelimit.NewManualClock(start)
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
	require.NoError(t, err)
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	state := "4261124999999972708 4261124999999972708 0"
	require.NoError(t, rdb.Set(ctx, s.Key("k"), state, time.Hour).Err())
	want, wx, next, err := m.Settle([]byte(state), start, start, ratelimit.Unit, 1999999999999979000)
	require.NoError(t, err)
	require.Equal(t, "4261124999999972708 9223372036854775805 4108", string(next))
	d, settled, err := s.Settle("k", ratelimit.Unit, 1999999999999979000, start)
	require.NoError(t, err)
	assert.Equal(t, want, d)
	assert.Equal(t, wx, settled)
	got, err := rdb.Get(ctx, s.Key("k")).Result()
	require.NoError(t, err)
	require.Equal(t, string(next), got)
	state = got
	for _, now := range []time.Duration{start, start + 1, ratelimit.MaxTime} {
		clk.Set(now)
		want, after, err := m.Step([]byte(state), now, ratelimit.Unit, true)
		require.NoError(t, err)
		for _, script := range []*redis.Script{fastScript, exactScript} {
			f, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
			require.NoError(t, err)
			f.script = script
			require.NoError(t, rdb.Set(ctx, f.Key("k"), state, time.Hour).Err())
			got, err := f.Check("k", ratelimit.Unit)
			if script == fastScript {
				// Its span is beyond the fast path's range: it declines,
				// whatever the state.
				require.ErrorContains(t, err, declined)
				continue
			}
			require.NoError(t, err, "at %d on %q", now, state)
			assert.Equal(t, want, got, "at %d on %q", now, state)
			w, err := rdb.Get(ctx, f.Key("k")).Result()
			require.NoError(t, err)
			assert.Equal(t, string(after), w, "at %d on %q", now, state)
		}
		// And the store's own check moves the key on.
		got, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, want, got, "at %d on %q", now, state)
		assert.False(t, got.Allowed)
		w, err := rdb.Get(ctx, s.Key("k")).Result()
		require.NoError(t, err)
		require.Equal(t, string(after), w)
		state = w
	}
	assert.Equal(t, "4611686018427387904 9223372036854775805 4108", state)
	assert.Zero(t, s.Stats().InvalidStates+s.Stats().Mismatches)
}
