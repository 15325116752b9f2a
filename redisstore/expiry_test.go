package redisstore

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCeilMsSaturates: the expiry of a state that is fresh again at any
// instant up to the largest int64 nanosecond is that instant in whole ms,
// rounded up, plus the margin: never negative, never short. Every one of
// the last two million representable spans is tried.
func TestCeilMsSaturates(t *testing.T) {
	const ms = int64(time.Millisecond)
	top := int64(math.MaxInt64/ms) + 1 // the largest span's ceiling
	for d := int64(math.MaxInt64); d > math.MaxInt64-2*ms; d-- {
		got := ceilMs(time.Duration(d))
		// (got-1) ms < d <= got ms, in uint64, where got ms fits.
		if got < 1 || got > top || uint64(got-1)*uint64(ms) >= uint64(d) || uint64(d) > uint64(got)*uint64(ms) {
			t.Fatalf("ceilMs(%d) = %d", d, got)
		}
	}
	assert.Equal(t, top, ceilMs(math.MaxInt64))
	assert.Equal(t, int64(0), ceilMs(0))
	assert.Equal(t, int64(1), ceilMs(1))
	assert.Equal(t, int64(1), ceilMs(time.Millisecond))
	assert.Equal(t, int64(2), ceilMs(time.Millisecond+1))
	assert.Equal(t, top+top, expiryMs(math.MaxInt64, top), "the margin adds, without overflow")
	assert.Equal(t, int64(math.MaxInt64), expiryMs(math.MaxInt64, math.MaxInt64), "the sum saturates")
}

// lastInstants are the instants, into a window of 2^62 - 1 ns, at which a
// sliding counter's charge leaves a state fresh again after 2W - e ns:
// spans in the last millisecond below the largest int64 (where rounding
// to whole ms used to overflow) and on either side of it.
var lastInstants = []time.Duration{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 500_000, 999_997, 999_998, 999_999, 1_000_000, 1_000_001, 1_000_002, 2_000_000}

// lastRule is a sliding counter whose window is the longest a rule allows,
// so that a charge's ResetAfter (2W - e) reaches the last int64 instants.
var lastRule = ratelimit.SlidingCounter{Limit: 5, Window: ratelimit.MaxTime - 1}

// TestSettleExpiryAtTheLastInstants: a settlement's charge whose
// ResetAfter falls in the last representable instants is written, with an
// expiry of at least that span, on a key Redis did not hold and on one it
// did: the charge is never lost (Store and Composite).
func TestSettleExpiryAtTheLastInstants(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	m, err := ratelimit.NewMachine(lastRule)
	require.NoError(t, err)
	for _, e := range lastInstants {
		clk := ratelimit.NewManualClock(e)
		s, err := New(rdb, lastRule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
		require.NoError(t, err)
		c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: lastRule}}}, WithClock(clk), WithPrefix(testPrefix()))
		require.NoError(t, err)
		want, _, next, err := m.Settle(nil, e, e, ratelimit.Unit, 3*ratelimit.Unit)
		require.NoError(t, err)
		require.Equal(t, time.Duration(math.MaxInt64-1)-e, want.ResetAfter, "at %d", e)

		// A key Redis does not hold, then the same key held.
		for round := range 2 {
			d, settled, err := s.Settle("k", ratelimit.Unit, 3*ratelimit.Unit, e)
			require.NoError(t, err, "at %d", e)
			assert.Equal(t, 3*ratelimit.Unit, settled)
			cd, csettled, err := c.Settle("k", ratelimit.Unit, 3*ratelimit.Unit, e)
			require.NoError(t, err, "at %d", e)
			assert.Equal(t, 3*ratelimit.Unit, csettled)
			for name, rk := range map[string]string{"store": s.Key("k"), "composite": c.Key(0, "k")} {
				got, err := rdb.Get(ctx, rk).Result()
				require.NoError(t, err, "%s at %d round %d: the charge was lost", name, e, round)
				// PTTL's raw ms: go-redis's Duration would overflow.
				ttl, err := rdb.Do(ctx, "PTTL", rk).Int64()
				require.NoError(t, err)
				assert.GreaterOrEqual(t, ttl, ceilMs(want.ResetAfter), "%s at %d round %d: the expiry is short", name, e, round)
				if round == 0 {
					assert.Equal(t, string(next), got, "%s at %d", name, e)
					assert.Equal(t, want, map[string]ratelimit.Decision{"store": d, "composite": cd}[name], "%s at %d", name, e)
				}
			}
		}
	}
}
