package redisstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestLeasedPeekRefundSettle: on a key with a live lease, Peek, Refund and
// Settle of what the lease admitted are answered by the lease with no
// round trip, and what they give back reaches Redis when the lease ends:
// after Close, Redis holds exactly the net spending, as the in-process
// store does for the same operations. A request admitted in Redis (not
// from the lease) is refunded there.
func TestLeasedPeekRefundSettle(t *testing.T) {
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":         ratelimit.GCRA{Rate: ratelimit.Every(year), Burst: 100},
		"fixed window": ratelimit.FixedWindow{Limit: 100, Window: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			rs := newReplicas(t, 1, rule, LeaseOptions{Max: 30 * ratelimit.Unit, Hold: time.Minute}, WithClock(clk), WithPrefix(testPrefix()))
			defer closeReplicas(rs)
			l := rs[0].l
			local, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			var last ratelimit.Decision
			for range 17 {
				d, err := l.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				last = d
				_, err = local.Check("k", ratelimit.Unit)
				require.NoError(t, err)
			}
			require.NotZero(t, leaseOf(l, "k"), "the key holds a lease")
			before := rs[0].calls.n.Load()

			p1, err := l.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.True(t, p1.Allowed)
			g, err := l.Refund("k", 2*ratelimit.Unit, last.At)
			require.NoError(t, err)
			assert.Equal(t, 2*ratelimit.Unit, g)
			p2, err := l.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, p1.Remaining+2, p2.Remaining, "the refund is back in the lease")
			_, settled, err := l.Settle("k", ratelimit.Unit, 4*ratelimit.Unit, last.At)
			require.NoError(t, err)
			assert.Equal(t, 4*ratelimit.Unit, settled)
			_, settled, err = l.Settle("k", 3*ratelimit.Unit, ratelimit.Unit, last.At)
			require.NoError(t, err)
			assert.Equal(t, ratelimit.Unit, settled)
			assert.Equal(t, before, rs[0].calls.n.Load(), "the lease answered with no round trip")
			// The same net spending in process: -2, +3, -2.
			for _, op := range []struct{ charged, actual ratelimit.Units }{{2 * ratelimit.Unit, 0}, {ratelimit.Unit, 4 * ratelimit.Unit}, {3 * ratelimit.Unit, ratelimit.Unit}} {
				if op.actual == 0 {
					_, err = local.Refund("k", op.charged, clk.Now())
				} else {
					_, _, err = local.Settle("k", op.charged, op.actual, clk.Now())
				}
				require.NoError(t, err)
			}

			require.NoError(t, l.Close())
			got, err := rs[0].s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			want, err := local.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, want.Remaining, got.Remaining, "Redis holds the net spending")
			assert.Equal(t, want.Allowed, got.Allowed)

			// Admitted in Redis, refunded in Redis.
			d, err := rs[0].s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			g, err = l.Refund("k", ratelimit.Unit, d.At)
			require.NoError(t, err)
			assert.Equal(t, ratelimit.Unit, g)
			got, err = rs[0].s.Peek("k", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, want.Remaining, got.Remaining)
		})
	}
}
