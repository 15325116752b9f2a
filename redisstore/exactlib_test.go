package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// sharedProbe is Lua that registers, beside a library's step, a function
// returning what the library's exact helpers share between calls:
// arith.lua's zero and one, each as its length and limbs, then how many
// arguments it keeps read (ppCache) and how many of them no
// longer read as their text.
func sharedProbe(fn string) string {
	return "redis.register_function('" + fn + `_probe', function()
  local kept, wrong = 0, 0
  for s, v in pairs(ppCache) do
    kept = kept + 1
    local h, l = pp(s)
    if v[1] ~= h or v[2] ~= l then wrong = wrong + 1 end
  end
  return {#Z, Z[1], Z[2] or -1, #ONE, ONE[1], ONE[2] or -1, kept, wrong}
end)
`
}

// TestExactSharedStateUntouched: the library builds the exact path's
// helpers once, when it loads (see exactHoisted), so the tables they share
// between calls (arith.lua's zero and one, which the arithmetic returns and
// stores as values) must never be written to. A library whose checks all
// take the exact path decides checks of every kind of rule, many rules in
// turn on one loaded library, as in process; after each sequence the
// shared tables are still zero and one, and each argument kept read
// (ppCache) still reads as its text.
func TestExactSharedStateUntouched(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	src, fn := stepLibrarySource("fast = function() return nil end -- shared state")
	require.NoError(t, rdb.FunctionLoadReplace(ctx, src+sharedProbe(fn)).Err())
	lib := &functionCaller{lib: src + sharedProbe(fn), fn: fn, fallback: exactScript}
	var kept int64
	probe := func(t require.TestingT) {
		got, err := rdb.FCall(ctx, fn+"_probe", nil).Int64Slice()
		require.NoError(t, err)
		require.Len(t, got, 8)
		require.Equal(t, []int64{1, 0, -1, 1, 1, -1}, got[:6], "the shared zero and one were written to")
		require.Zero(t, got[7], "kept arguments were written to")
		require.LessOrEqual(t, got[6], int64(256), "the kept arguments outgrew their cache's bound")
		kept = max(kept, got[6])
	}
	probe(t)
	rapid.Check(t, func(t *rapid.T) {
		clk := ratelimit.NewManualClock(rapid.SampledFrom([]time.Duration{0, time.Second, unixNow, ratelimit.MaxTime - year}).Draw(t, "start"))
		prefix := testPrefix()
		type pair struct {
			s     *Store
			local ratelimit.Limiter
			p     ratelimit.Params
		}
		var pairs []pair
		for range rapid.IntRange(1, 3).Draw(t, "rules") {
			var rule ratelimit.Rule
			if rapid.Bool().Draw(t, "everyday") {
				rule = drawEverydayRule(t)
			} else {
				rule = drawRule(t)
			}
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second), WithDenyCache(0))
			require.NoError(t, err)
			s.script = lib
			l, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			prefix += "x"
			pairs = append(pairs, pair{s, l, s.Params()})
		}
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for i := range steps {
			p := pairs[rapid.IntRange(0, len(pairs)-1).Draw(t, "rule")]
			clk.Advance(rapid.SampledFrom([]time.Duration{0, 1, time.Millisecond, p.p.Window / 3, time.Duration(p.p.TauNanos) / 3, year}).Draw(t, "advance"))
			cost := drawCost(t, p.p.Capacity)
			want, err := p.local.Check(cost)
			require.NoError(t, err)
			got, err := p.s.Check("k", cost)
			require.NoError(t, err)
			require.Equal(t, want, got, "check %d", i)
		}
		probe(t)
	})
	assert.Positive(t, kept, "no argument's limbs were kept")
}

// TestFixedWindowExpiryAhead: a fixed window's state whose count is in
// the window after now's (as a Plans' move writes it) is kept until that
// window ends, on the exact path as a script and as the library runs it.
func TestFixedWindowExpiryAhead(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.FixedWindow{Limit: 10, Window: time.Second}
	now := unixNow + 300*time.Millisecond
	for name, script := range map[string]scriptRunner{"script": exactScript, "library": exactFunction} {
		s, err := New(rdb, rule, WithClock(ratelimit.NewManualClock(now)), WithPrefix(testPrefix()), WithExpiryMargin(0), WithDenyCache(0))
		require.NoError(t, err)
		s.script = script
		next := int64(unixNow/time.Second) + 1
		require.NoError(t, rdb.Set(ctx, s.Key("k"), i64(int64(now))+" "+i64(next)+" 3000", 0).Err())
		d, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err, name)
		require.True(t, d.Allowed, name)
		require.Equal(t, 1700*time.Millisecond, d.ResetAfter, name)
		ttl, err := rdb.PTTL(ctx, s.Key("k")).Result()
		require.NoError(t, err)
		assert.InDelta(t, 1700, ttl.Milliseconds(), 50, "%s: the state's expiry", name)
	}
}

// exactBeside returns a store of rule on clk whose checks run script, and
// the in-process limiter of the same rule on clk.
func exactBeside(t *testing.T, rdb *redis.Client, rule ratelimit.Rule, clk ratelimit.Clock, script scriptRunner) (*Store, ratelimit.Limiter) {
	t.Helper()
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
	require.NoError(t, err)
	s.script = script
	l, err := ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	return s, l
}

// TestSlidingCounterAtTheBoundary: a sliding counter's request whose
// estimate plus cost is exactly the limit is admitted, and refused a
// nanosecond earlier, on the exact path as a script and as the library
// runs it, with the comparison's products within doubles' exact range
// and beyond it.
func TestSlidingCounterAtTheBoundary(t *testing.T) {
	rdb := needRedis(t)
	for _, w := range []time.Duration{time.Second, 1_000_000 * time.Second} {
		rule := ratelimit.SlidingCounter{Limit: 2, Window: w}
		for name, script := range map[string]scriptRunner{"script": exactScript, "library": exactFunction} {
			for _, early := range []time.Duration{0, 1} {
				start := unixNow / w * w
				clk := ratelimit.NewManualClock(start)
				s, l := exactBeside(t, rdb, rule, clk, script)
				d, err := s.Check("k", 2*ratelimit.Unit)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				_, err = l.Check(2 * ratelimit.Unit)
				require.NoError(t, err)
				// Half the previous window's two count at its middle: one,
				// and one more is exactly the limit.
				clk.Set(start + w + w/2 - early)
				want, err := l.Check(ratelimit.Unit)
				require.NoError(t, err)
				got, err := s.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, want, got, "%s, window %v, %v early", name, w, early)
				assert.Equal(t, early == 0, got.Allowed, "%s, window %v, %v early", name, w, early)
			}
		}
	}
}

// TestSubWindowShiftOnExactPath: a sub-window counter's counts move on by
// the buckets that have passed, on the exact path as a script and as the
// library runs it, as in process: checks a few buckets apart, then a
// window apart, each decided and written as the Machine does.
func TestSubWindowShiftOnExactPath(t *testing.T) {
	rdb := needRedis(t)
	for _, counts := range []bool{false, true} {
		rule := ratelimit.SubWindow{Limit: 4, Window: time.Second, Buckets: 10, CountRefused: counts}
		for name, script := range map[string]scriptRunner{"script": exactScript, "library": exactFunction} {
			clk := ratelimit.NewManualClock(unixNow)
			s, l := exactBeside(t, rdb, rule, clk, script)
			for i, d := range []time.Duration{0, 100, 300, 0, 250, 100, 900, 0, 1000, 50, 2500} {
				clk.Advance(d * time.Millisecond)
				want, err := l.Check(ratelimit.Unit)
				require.NoError(t, err)
				got, err := s.Check("k", ratelimit.Unit)
				require.NoError(t, err, "%s, CountRefused %v, check %d", name, counts, i)
				require.Equal(t, want, got, "%s, CountRefused %v, check %d", name, counts, i)
			}
		}
	}
}
