package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// expiryProbe runs one layer's step as the scripts do, with the path
// forced by override, but holds back its write and returns, after the
// step's reply, the expiry in ms the step would have set: no clock is
// read to learn it, so it is exact.
func expiryProbe(override string) *redis.Script {
	return redis.NewScript(layerStepSource(override) + `
local held = {}
local hold = setmetatable({call = function(cmd, key, v, px, ms)
  if cmd == 'SET' then
    held.ms = ms
    return true
  end
  return redis.call(cmd, key, v, px, ms)
end}, {__index = redis})
local r = layerstep(ARGV, hold, KEYS[1], redis.call('GET', KEYS[1]))
if r.err then return r end
return {r[1], r[2], r[3], r[4], tostring(held.ms)}
`)
}

var (
	fastProbe = expiryProbe(`local decide = fast
fast = function(...)
  local o, r, n, a = decide(...)
  if not o then error('RATELIMIT ` + declined + `') end
  return o, r, n, a
end`)
	exactProbe = expiryProbe("fast = function() return nil end")
)

// TestScriptExpiries: on each path, for every algorithm, admitted and
// refused, the expiry a check sets is the Decision's ResetAfter in whole
// ms rounded up, plus the margin, exactly: a state is kept until it is as
// good as a fresh key's (for a sliding counter whose current window holds
// something, two windows less the time into it), never rounded down. The
// instants are off the millisecond so that rounding shows.
func TestScriptExpiries(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rules := map[string]ratelimit.Rule{
		"gcra":            ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 4},
		"token bucket":    ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 3},
		"leaky bucket":    ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(3), Capacity: 4},
		"fixed window":    ratelimit.FixedWindow{Limit: 3, Window: time.Second},
		"sliding counter": ratelimit.SlidingCounter{Limit: 3, Window: time.Second},
		"sliding log":     ratelimit.SlidingLog{Limit: 3, Window: time.Second},
		"sub-window":      ratelimit.SubWindow{Limit: 3, Window: 3 * time.Second, Buckets: 3},
	}
	const margin = 2 * time.Second
	for name, rule := range rules {
		for path, probe := range map[string]*redis.Script{"fast": fastProbe, "exact": exactProbe} {
			clk := ratelimit.NewManualClock(unixNow + 123_456)
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(margin), WithDenyCache(0))
			require.NoError(t, err)
			m, err := ratelimit.NewMachine(rule)
			require.NoError(t, err)
			rk := s.Key("k")
			admitted, refused := 0, 0
			for step := range 24 {
				reply, err := probe.Run(ctx, rdb, []string{rk}, s.args(ratelimit.Unit, 0, false)...).Slice()
				require.NoError(t, err, "%s, %s path, step %d", name, path, step)
				require.Len(t, reply, 5)
				old, _ := reply[0].(string)
				at, err := strconv.ParseInt(reply[1].(string), 10, 64)
				require.NoError(t, err)
				d, _, err := m.Step([]byte(old), time.Duration(at), ratelimit.Unit, true)
				require.NoError(t, err)
				assert.Equal(t, strconv.FormatInt(expiryMs(d.ResetAfter, ceilMs(margin)), 10), reply[4],
					"%s, %s path, step %d: ResetAfter %v", name, path, step, d.ResetAfter)
				if d.Allowed {
					admitted++
				} else {
					refused++
				}
				// The check itself, to move the key on.
				_, err = s.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				clk.Advance(time.Duration(step%5) * 97_345_679)
			}
			assert.NotZero(t, admitted, "%s, %s path", name, path)
			assert.NotZero(t, refused, "%s, %s path", name, path)
		}
	}
}

// TestExpiryRoundsUpANanosecond: on each path, a bucket in debt whose
// ResetAfter is a nanosecond or a few past a whole millisecond is kept a
// millisecond more: its expiry is rounded up at every remainder.
func TestExpiryRoundsUpANanosecond(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2}
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	const margin = 2 * time.Second
	for path, probe := range map[string]*redis.Script{"fast": fastProbe, "exact": exactProbe} {
		for _, extra := range []int64{0, 1, 999, 1000, 1001, 999_999} {
			clk := ratelimit.NewManualClock(unixNow)
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(margin), WithDenyCache(0))
			require.NoError(t, err)
			rk := s.Key("k")
			now := int64(unixNow)
			state := strconv.FormatInt(now, 10) + " " + strconv.FormatInt(now+5_000_000+extra, 10) + " 0"
			require.NoError(t, rdb.Set(ctx, rk, state, time.Hour).Err())
			reply, err := probe.Run(ctx, rdb, []string{rk}, s.args(ratelimit.Unit, 0, false)...).Slice()
			require.NoError(t, err, "%s path, %q", path, state)
			require.Len(t, reply, 5)
			d, _, err := m.Step([]byte(state), unixNow, ratelimit.Unit, true)
			require.NoError(t, err)
			assert.Equal(t, strconv.FormatInt(expiryMs(d.ResetAfter, ceilMs(margin)), 10), reply[4],
				"%s path, %q: ResetAfter %v", path, state, d.ResetAfter)
		}
	}
}
