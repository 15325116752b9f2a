package ratelimit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

func TestGCRAVectors(t *testing.T) {
	t.Run("10/s burst 20: 21st RetryAfter 100 ms", func(t *testing.T) {
		ds := runBursts(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, []burst{{at: 0, n: 21, allowed: 20}})
		assert.Equal(t, 100*ms, ds[20].RetryAfter)
	})
}

func TestGCRAEqualsTokenBucket(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r, c := drawValidBucket(t)
		rc := ruleCase{scale: r.Per, capMilli: c * 1000}
		trace := drawTrace(t, rc)
		_, _, tb := replay(t, ratelimit.TokenBucket{Rate: r, Burst: c}, trace)
		_, _, gcra := replay(t, ratelimit.GCRA{Rate: r, Burst: c}, trace)
		require.Equal(t, tb, gcra)
	})
}
