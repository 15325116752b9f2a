package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ratekit/ratelimit"
)

func TestLeakyBucketVectors(t *testing.T) {
	t.Run("5/s capacity 10: 14 at once, one more at 1 s", func(t *testing.T) {
		ds := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10}, []burst{
			{at: 0, n: 14, allowed: 10},
			{at: 1000 * ms, n: 1, allowed: 1},
		})
		for i := 0; i < 10; i++ {
			assert.Equal(t, time.Duration(i)*200*ms, ds[i].Delay, "request %d", i+1)
		}
		for i := 10; i < 14; i++ {
			assert.Zero(t, ds[i].Delay, "a denied request has no Delay")
		}
		assert.Equal(t, 1000*ms, ds[14].Delay, "goes on at 2000 ms")
	})
	t.Run("NGINX rate=10r/s burst=20 is capacity 21", func(t *testing.T) {
		ds := runBursts(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 21}, []burst{{at: 0, n: 25, allowed: 21}})
		for i := 0; i < 21; i++ {
			assert.Equal(t, time.Duration(i)*100*ms, ds[i].Delay, "request %d", i+1)
		}
	})
}
