package redisstore

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// refuseFCALL is a client hook that answers every FCALL and FUNCTION as a
// server without Redis Functions does, sending nothing.
type refuseFCALL struct{ refused int }

func (h *refuseFCALL) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseFCALL) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refuseFCALL) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "fcall" || n == "function" {
			h.refused++
			cmd.SetErr(errors.New("ERR unknown command '" + n + "', with args beginning with: "))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

// TestStepRunsAsAFunction: on one server the check's step runs by FCALL,
// the library loaded on first use and loaded again after FUNCTION FLUSH;
// a server without Redis Functions gets EVALSHA, deciding the same.
func TestStepRunsAsAFunction(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}
	clk := ratelimit.NewManualClock(unixNow)
	prefix := testPrefix()
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	calls := func() int64 {
		st, err := rdb.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		return statCalls(st, "fcall")
	}
	before := calls()
	d, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Greater(t, calls(), before, "the check was an FCALL")
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "ratekit_*"}).Result()
	require.NoError(t, err)
	require.NotEmpty(t, libs)

	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	d, err = s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(3), d.Remaining, "the second check, after the library was loaded again")

	h := &refuseFCALL{}
	old := shared.Client(nil)
	defer old.Close()
	old.AddHook(h)
	o, err := New(old, rule, WithClock(clk), WithPrefix(prefix))
	require.NoError(t, err)
	for want := int64(2); want >= 0; want-- {
		d, err = o.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, want, d.Remaining)
	}
	assert.Equal(t, 1, h.refused, "FCALL is not tried again on a server without it")
}

// statCalls returns the calls INFO commandstats counts for cmd.
func statCalls(info, cmd string) int64 {
	m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// TestFunctionArgumentCache: the library's fast path keeps the arguments
// it has read (argCache in fast.lua), at most 256 texts before it starts
// afresh, and the texts of the expiries it has written (pxCache), as many,
// each the number's own digits. Rules whose arguments together have many
// more texts than that, checked in turn twice over (so that the second
// round reads some from the cache and some after it started afresh),
// decide as in process.
func TestFunctionArgumentCache(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow)
	prefix := testPrefix()
	type pair struct {
		s     *Store
		local ratelimit.Limiter
	}
	var pairs []pair
	for i := range 200 {
		rules := []ratelimit.Rule{
			ratelimit.GCRA{Rate: ratelimit.PerSecond(int64(i + 1)), Burst: int64(i%7 + 1)},
			ratelimit.FixedWindow{Limit: int64(i%5 + 1), Window: time.Duration(i+1) * time.Millisecond},
		}
		for _, rule := range rules {
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix))
			require.NoError(t, err)
			l, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			pairs = append(pairs, pair{s, l})
		}
	}
	// The library carries a probe of its cache beside the step: the cache
	// must stay within its bound, however many texts pass through it.
	ctx := context.Background()
	src, fn := stepLibrarySource("")
	probed := src + "redis.register_function('" + fn + `_probe', function()
  local n = 0
  for _ in pairs(argCache) do n = n + 1 end
  local m, bad = 0, 0
  for px, s in pairs(pxCache) do
    m = m + 1
    if s ~= string.format('%d', px) then bad = bad + 1 end
  end
  return {n, argCached, m, pxCached, bad}
end)
`
	require.NoError(t, rdb.FunctionLoadReplace(ctx, probed).Err())
	lib := &functionCaller{lib: probed, fn: fn, fallback: stepScript}
	for _, p := range pairs {
		p.s.script = lib
	}
	most, mostPx := int64(0), int64(0)
	for round := range 2 {
		for i, p := range pairs {
			if i%50 == 0 {
				got, err := rdb.FCall(ctx, fn+"_probe", nil).Int64Slice()
				require.NoError(t, err)
				require.Equal(t, got[0], got[1], "the cache's count is not its size")
				require.LessOrEqual(t, got[0], int64(256), "the argument cache outgrew its bound")
				most = max(most, got[0])
				require.Equal(t, got[2], got[3], "the expiry cache's count is not its size")
				require.LessOrEqual(t, got[2], int64(256), "the expiry cache outgrew its bound")
				require.Zero(t, got[4], "the expiry cache keeps a text that is not its number's")
				mostPx = max(mostPx, got[2])
			}
			cost := ratelimit.Units(i%4+1) * ratelimit.Unit / 4
			want, err := p.local.Check(cost)
			require.NoError(t, err)
			got, err := p.s.Check("k", cost)
			require.NoError(t, err)
			require.Equal(t, want, got, "round %d, rule %d", round, i)
			clk.Advance(time.Duration(i%11) * time.Millisecond)
		}
	}
	require.Greater(t, most, int64(128), "the checks never filled the cache: the bound is untested")
	require.Greater(t, mostPx, int64(1), "the checks kept no expiries' texts")
}

// TestFunctionKeepsTimeSeconds: the library's fast path keeps the seconds
// of the server's TIME it has read in argCache, as it keeps the arguments
// (see farg), so that a check in the same second as one before it looks
// them up rather than reading them again; the checks decide as in process
// all the same.
func TestFunctionKeepsTimeSeconds(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 5}
	s, err := New(rdb, rule, WithPrefix(testPrefix()))
	require.NoError(t, err)
	src, fn := stepLibrarySource("")
	probed := src + "redis.register_function('" + fn + `_probe', function(KEYS, argv)
  return argCache and argCache[argv[1]] or 0
end)
`
	require.NoError(t, rdb.FunctionLoadReplace(ctx, probed).Err())
	s.script = &functionCaller{lib: probed, fn: fn, fallback: stepScript}
	before, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	for range 3 {
		d, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	after, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	kept := false
	for sec := before.Unix(); sec <= after.Unix(); sec++ {
		got, err := rdb.FCall(ctx, fn+"_probe", nil, strconv.FormatInt(sec, 10)).Int64()
		require.NoError(t, err)
		if got != 0 {
			require.Equal(t, sec, got, "argCache keeps a second's text as another number")
			kept = true
		}
	}
	require.True(t, kept, "no second of TIME from %d to %d is kept", before.Unix(), after.Unix())
}
