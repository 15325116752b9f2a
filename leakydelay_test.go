package ratelimit_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

func TestLeakyBucketDelayVectors(t *testing.T) {
	t.Run("NGINX rate=5r/s burst=12 delay=8: 9 at once, 4 delayed, the rest refused", func(t *testing.T) {
		rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8}
		ds := runBursts(t, rule, []burst{{at: 0, n: 16, allowed: 13}})
		for i := 0; i < 9; i++ {
			assert.Zero(t, ds[i].Delay, "request %d goes on at once", i+1)
		}
		for i := 9; i < 13; i++ {
			assert.Equal(t, time.Duration(i-8)*200*ms, ds[i].Delay, "request %d is paced", i+1)
		}
		for i := 13; i < 16; i++ {
			assert.False(t, ds[i].Allowed, "request %d", i+1)
			assert.Equal(t, 200*ms, ds[i].RetryAfter, "the queue is as full as without delay")
		}
	})
	t.Run("after a pause the queue has drained in part: fewer go on at once", func(t *testing.T) {
		rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8}
		ds := runBursts(t, rule, []burst{{at: 0, n: 13, allowed: 13}, {at: 1000 * ms, n: 6, allowed: 5}})
		// At 1 s, 8 units are still queued: the first of the new burst finds
		// 8 ahead and goes on at once, the next wait 200 ms each more.
		for i, want := range []time.Duration{0, 200 * ms, 400 * ms, 600 * ms, 800 * ms} {
			assert.Equal(t, want, ds[13+i].Delay, "request %d of the second burst", i+1)
		}
	})
	t.Run("nodelay is Delay Capacity-1", func(t *testing.T) {
		rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 21, Delay: 20}
		ds := runBursts(t, rule, []burst{{at: 0, n: 25, allowed: 21}})
		for i := 0; i < 21; i++ {
			assert.Zero(t, ds[i].Delay, "request %d", i+1)
			assert.Equal(t, int64(20-i), ds[i].Remaining, "request %d still takes its place", i+1)
		}
		assert.Equal(t, 100*ms, ds[21].RetryAfter)
	})
	t.Run("Delay 0 is the plain queue", func(t *testing.T) {
		plain := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(7), Capacity: 9}, []burst{{at: 0, n: 12, allowed: 9}})
		zero := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(7), Capacity: 9, Delay: 0}, []burst{{at: 0, n: 12, allowed: 9}})
		assert.Equal(t, plain, zero)
	})
}

func TestLeakyBucketDelayValidation(t *testing.T) {
	for _, d := range []int64{-1, 11} {
		_, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 10, Delay: d})
		var re *ratelimit.RuleError
		require.ErrorAs(t, err, &re, "delay %d", d)
		assert.Equal(t, "Delay", re.Field)
	}
	_, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 10, Delay: 10})
	assert.NoError(t, err)
}

// TestLeakyBucketDelayModel checks the option against the queue model, on
// odd rates too.
func TestLeakyBucketDelayModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r, c := drawValidBucket(t)
		delay := rapid.Int64Range(0, c).Draw(t, "delay")
		name := drawName(t)
		runModel(t, modelCase{
			rule:  ratelimit.LeakyBucket{Rate: r, Capacity: c, Delay: delay, Name: name},
			model: refmodel.NewQueue(r, c).WithDelay(delay),
			scale: r.Per, valid: true, name: name, window: bucketWindow(r, c),
		})
	})
}

func TestLeakyBucketDelayJSON(t *testing.T) {
	var spec ratelimit.RuleSpec
	require.NoError(t, json.Unmarshal([]byte(`{"algorithm":"leaky_bucket","rate":"5/s","capacity":13,"delay":8}`), &spec))
	assert.Equal(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8}, spec.Rule)
	b, err := json.Marshal(spec)
	require.NoError(t, err)
	assert.Equal(t, `{"algorithm":"leaky_bucket","rate":"5/s","capacity":13,"delay":8}`, string(b))
	err = json.Unmarshal([]byte(`{"algorithm":"leaky_bucket","rate":"5/s","capacity":13,"delay":14}`), &spec)
	assert.ErrorContains(t, err, "delay must be from 0 to Capacity")
	m, err := ratelimit.NewMachine(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8})
	require.NoError(t, err)
	assert.Equal(t, uint64(1600*ms), m.Params().DelayNanos)
	d, _, err := m.Step(nil, 0, ratelimit.Unit, true)
	require.NoError(t, err)
	assert.Zero(t, d.Delay)
}
