package redisstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestRulesWithoutAScriptAreRefused: rules the scripts do not know would
// be refused when the store is built, never decided without their options.
// Every rule and option now has a script, in a Store and in a Composite
// (which, as in process, never spends a refusal).
func TestRulesWithoutAScriptAreRefused(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"counting refusals":    ratelimit.SlidingCounter{Limit: 10, Window: time.Minute, CountRefused: true},
		"sub window":           ratelimit.SubWindow{Limit: 10, Window: time.Minute, Buckets: 6},
		"sub window, refusals": ratelimit.SubWindow{Limit: 10, Window: time.Minute, Buckets: 6, CountRefused: true},
		"leaky with a delay":   ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8},
	} {
		_, err := New(rdb, rule)
		require.NoError(t, err, name)
		_, err = NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: rule}}})
		require.NoError(t, err, name)
	}
}

// TestLeakyDelayKeys: a leaky bucket's Delay is named in its keys, so that
// a rule with another Delay starts its keys fresh; without a Delay the keys
// are those the rule always had.
func TestLeakyDelayKeys(t *testing.T) {
	rdb := needRedis(t)
	key := func(delay int64) string {
		s, err := New(rdb, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: delay})
		require.NoError(t, err)
		return s.Key("k")
	}
	require.NotEqual(t, key(0), key(8))
	require.NotEqual(t, key(8), key(9))
	require.Equal(t, key(8), key(8))
}
