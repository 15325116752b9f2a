package redisstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestRulesWithoutAScriptAreRefused: rules the scripts do not know are
// refused when the store is built, never decided without their options.
func TestRulesWithoutAScriptAreRefused(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"sub window":           ratelimit.SubWindow{Limit: 10, Window: time.Minute, Buckets: 6},
		"counting refusals":    ratelimit.SlidingCounter{Limit: 10, Window: time.Minute, CountRefused: true},
		"leaky with a delay":   ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 13, Delay: 8},
		"sub window, refusals": ratelimit.SubWindow{Limit: 10, Window: time.Minute, Buckets: 6, CountRefused: true},
	} {
		_, err := New(rdb, rule)
		require.ErrorIs(t, err, ratelimit.ErrInvalidRule, name)
	}
}
