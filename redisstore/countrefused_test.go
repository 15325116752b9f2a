package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCountRefusedUncounted: a Composite and Wait never count a refusal,
// so they report one on the key as it stands, as in process: RetryAfter
// is when this same request passes.
func TestCountRefusedUncounted(t *testing.T) {
	rdb := needRedis(t)
	const s = time.Second
	for _, tc := range []struct {
		name                   string
		rule                   ratelimit.Rule
		first, second          ratelimit.Units
		gap                    time.Duration
		remaining              int64
		retryAfter, resetAfter time.Duration
	}{
		{"sliding counter", ratelimit.SlidingCounter{Limit: 10, Window: 10 * s, CountRefused: true},
			10 * ratelimit.Unit, ratelimit.Unit, 10 * s, 0, 1 * s, 10 * s},
		{"sub-window", ratelimit.SubWindow{Limit: 2, Window: 2 * s, Buckets: 2, CountRefused: true},
			ratelimit.Unit, 2 * ratelimit.Unit, 1500 * time.Millisecond, 1, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: tc.rule}}}, WithClock(clk), WithPrefix(testPrefix()))
			require.NoError(t, err)
			d, err := c.Check("k", tc.first)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clk.Advance(tc.gap)
			d, err = c.Check("k", tc.second)
			require.NoError(t, err)
			assert.Equal(t, refusal{false, tc.remaining, tc.retryAfter, tc.resetAfter}, refusalOf(d), "Composite")

			clk.Set(unixNow)
			st, err := New(rdb, tc.rule, WithClock(clk), WithPrefix(testPrefix()))
			require.NoError(t, err)
			d, err = st.Check("k", tc.first)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clk.Advance(tc.gap)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan ratelimit.Decision, 1)
			go func() {
				d, err := st.Wait(ctx, "k", tc.second)
				assert.NoError(t, err)
				done <- d
			}()
			require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
			at, ok := clk.NextWake()
			require.True(t, ok)
			assert.Equal(t, unixNow+tc.gap+tc.retryAfter, at, "Wait sleeps until the request passes")
			clk.Set(at)
			select {
			case d = <-done:
				assert.True(t, d.Allowed)
			case <-ctx.Done():
				t.Fatal("Wait did not return once its request passed")
			}
		})
	}
}

type refusal struct {
	Allowed                bool
	Remaining              int64
	RetryAfter, ResetAfter time.Duration
}

func refusalOf(d ratelimit.Decision) refusal {
	return refusal{d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter}
}
