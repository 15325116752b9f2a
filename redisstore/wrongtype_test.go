package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wrongTypes writes a value of another type than a string at a key.
var wrongTypes = map[string]func(ctx context.Context, rdb *redis.Client, key string) error{
	"hash": func(ctx context.Context, rdb *redis.Client, key string) error {
		return rdb.HSet(ctx, key, "f", "1").Err()
	},
	"list": func(ctx context.Context, rdb *redis.Client, key string) error { return rdb.RPush(ctx, key, "1").Err() },
	"set":  func(ctx context.Context, rdb *redis.Client, key string) error { return rdb.SAdd(ctx, key, "1").Err() },
	"zset": func(ctx context.Context, rdb *redis.Client, key string) error {
		return rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "1"}).Err()
	},
	"stream": func(ctx context.Context, rdb *redis.Client, key string) error {
		return rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"f", "1"}}).Err()
	},
}

// TestWrongTypeIsInvalidState: a key holding a hash, list, set, zset or
// stream instead of a state is a corrupted state, as the package doc says:
// a check on it is refused with ErrInvalidState whatever the failure
// policy (fail open, fail closed, a fallback), Peek, Refund and Settle
// fail with that error and write nothing, none of it counts against the
// circuit (which here opens at the first failure) or as a failure, other
// keys are decided by Redis as before, and Reset, or deleting the key,
// repairs it.
func TestWrongTypeIsInvalidState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 2}
	for typ, write := range wrongTypes {
		local, err := ratelimit.NewStore(rule)
		require.NoError(t, err)
		for name, opt := range map[string]Option{"open": WithFailureMode(FailOpen), "closed": WithFailureMode(FailClosed), "fallback": WithFallback(local)} {
			s, err := New(rdb, rule, WithPrefix(testPrefix()), WithCircuit(1, time.Hour), opt)
			require.NoError(t, err)
			what := typ + ", " + name
			require.NoError(t, write(ctx, rdb, s.Key("bad")))
			require.NoError(t, write(ctx, rdb, s.Key("deleted")))
			for range 3 {
				d, err := s.Check("bad", ratelimit.Unit)
				require.ErrorIs(t, err, ratelimit.ErrInvalidState, what)
				assert.NotErrorIs(t, err, ErrUnavailable, what)
				assert.False(t, d.Allowed, "%s: admitted", what)
			}
			p, err := s.Peek("bad", ratelimit.Unit)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, what)
			assert.False(t, p.Allowed, what)
			g, err := s.Refund("bad", ratelimit.Unit, 0)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, what)
			assert.Zero(t, g)
			sd, _, err := s.Settle("bad", ratelimit.Unit, 2*ratelimit.Unit, 0)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, what)
			assert.False(t, sd.Allowed, what)
			got, err := rdb.Type(ctx, s.Key("bad")).Result()
			require.NoError(t, err)
			assert.Equal(t, typ, got, "%s: the key was written", what)

			// Not a failure: the circuit is closed and healthy keys go to Redis.
			st := s.Stats()
			assert.Zero(t, st.Failures, what)
			assert.Equal(t, uint64(6), st.InvalidStates, what)
			assert.False(t, s.br.one.open(), "%s: the circuit opened", what)
			for i := range 3 {
				d, err := s.Check("good", ratelimit.Unit)
				require.NoError(t, err, what)
				assert.Equal(t, i < 2, d.Allowed, "%s: check %d of a healthy key", what, i)
			}

			// Reset, or deleting the key, repairs it.
			require.NoError(t, s.Reset("bad"), what)
			d, err := s.Check("bad", ratelimit.Unit)
			require.NoError(t, err, what)
			assert.True(t, d.Allowed, what)
			require.NoError(t, rdb.Del(ctx, s.Key("deleted")).Err())
			d, err = s.Check("deleted", ratelimit.Unit)
			require.NoError(t, err, what)
			assert.True(t, d.Allowed, what)
			assert.Zero(t, s.Stats().Failures, what)
		}
	}
}

// TestLeasedWrongTypeIsInvalidState: a Leased's take on a key of the wrong
// type is refused with ErrInvalidState, as the Store's check is.
func TestLeasedWrongTypeIsInvalidState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 100, Window: time.Hour}, WithPrefix(testPrefix()), WithCircuit(1, time.Hour))
	require.NoError(t, err)
	l, err := NewLeased(s, LeaseOptions{Max: 10 * ratelimit.Unit, Hold: time.Hour})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, wrongTypes["hash"](ctx, rdb, s.Key("bad")))
	for range 5 {
		d, err := l.Check("bad", ratelimit.Unit)
		require.ErrorIs(t, err, ratelimit.ErrInvalidState)
		assert.NotErrorIs(t, err, ErrUnavailable)
		assert.False(t, d.Allowed)
	}
	assert.Zero(t, s.Stats().Failures)
	assert.False(t, s.br.one.open())
}

// TestCompositeWrongTypeIsInvalidState: a Composite one of whose layers'
// keys holds another type refuses with ErrInvalidState under fail open,
// its Peek, Refund and Settle fail with that error, and Reset repairs it.
func TestCompositeWrongTypeIsInvalidState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Hour}}},
	}
	for typ, write := range wrongTypes {
		for _, mode := range []FailureMode{FailOpen, FailClosed} {
			c, err := NewComposite(rdb, layers, WithPrefix(testPrefix()), WithFailureMode(mode))
			require.NoError(t, err)
			require.NoError(t, write(ctx, rdb, c.Key(1, "bad")))
			d, err := c.Check("bad", ratelimit.Unit)
			require.ErrorIs(t, err, ratelimit.ErrInvalidState, typ)
			assert.NotErrorIs(t, err, ErrUnavailable, typ)
			assert.False(t, d.Allowed, "%s: admitted", typ)
			p, err := c.Peek("bad", ratelimit.Unit)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, typ)
			assert.False(t, p.Allowed, typ)
			_, err = c.Refund("bad", ratelimit.Unit, 0)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, typ)
			_, _, err = c.Settle("bad", ratelimit.Unit, 2*ratelimit.Unit, 0)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, typ)
			n, err := rdb.Exists(ctx, c.Key(0, "bad")).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "%s: the other layer was written", typ)

			require.NoError(t, c.Reset("bad"), typ)
			d, err = c.Check("bad", ratelimit.Unit)
			require.NoError(t, err, typ)
			assert.True(t, d.Allowed, typ)
		}
	}
}

// TestSharedLimitsWrongTypeIsInvalidState: a lockout's key that is not a
// string, or an in-flight limit's key that is not a sorted set, is a
// corrupted state too: refused with ErrInvalidState under a failure
// policy that would admit (the lockout's fail open, the in-flight limit's
// default fail open), never counted against the circuit.
func TestSharedLimitsWrongTypeIsInvalidState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	lo, err := NewLockout(rdb, ratelimit.LockoutRule{Failures: 3, Within: time.Minute, Block: time.Minute},
		WithPrefix(testPrefix()), WithFailureMode(FailOpen), WithCircuit(1, time.Hour))
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, lo.Key("bad"), "f", "1").Err())
	d, err := lo.Check(ctx, "bad")
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	assert.False(t, d.Allowed, "a lockout's corrupted key admits nothing")
	d, _, err = lo.Fail(ctx, "bad")
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	assert.False(t, d.Allowed)

	f, err := NewInFlight(rdb, ratelimit.InFlightLimit{Limit: 2}, WithPrefix(testPrefix()), WithCircuit(1, time.Hour))
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, f.Key("bad"), "x", 0).Err())
	for range 3 {
		rel, d, err := f.Acquire("bad")
		require.ErrorIs(t, err, ratelimit.ErrInvalidState)
		assert.False(t, d.Allowed, "an in-flight limit's corrupted key takes no slot")
		rel()
	}
	rel, d, err := f.Acquire("good")
	require.NoError(t, err, "the circuit stayed closed")
	assert.True(t, d.Allowed)
	rel()
}
