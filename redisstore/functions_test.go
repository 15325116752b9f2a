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
	// The server's TIME: the check's text alone, unpacked for the script.
	o, err = New(old, rule, WithPrefix(prefix))
	require.NoError(t, err)
	d, err = o.Check("time", ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(4), d.Remaining)
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
// afresh, the texts of the expiries it has written (pxCache), as many,
// each the number's own digits, and the packed texts it has read
// (packCache in packed.lua), as many. Rules whose arguments together have many
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
  local k = 0
  for _ in pairs(packCache) do k = k + 1 end
  return {n, argCached, m, pxCached, bad, k, packCached}
end)
`
	require.NoError(t, rdb.FunctionLoadReplace(ctx, probed).Err())
	lib := &functionCaller{lib: probed, fn: fn, fallback: stepScript}
	for _, p := range pairs {
		p.s.script = lib
	}
	most, mostPx, mostPacked := int64(0), int64(0), int64(0)
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
				require.Equal(t, got[5], got[6], "the packed texts' count is not their cache's size")
				require.LessOrEqual(t, got[5], int64(256), "the packed texts' cache outgrew its bound")
				mostPacked = max(mostPacked, got[5])
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
	require.Greater(t, mostPacked, int64(128), "the checks never filled the packed texts' cache: the bound is untested")
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

// TestFunctionPackedArguments: the library takes a check's arguments
// packed (one text, then now, or the text alone for the server's TIME) and
// decides exactly as with one argument per slot, for every step; a text
// kept from an earlier check decides as a fresh one. A packed text that is
// not one the store sends (a hostile or corrupted argument) is an error
// that writes nothing, and is not kept: the well-formed text after it
// decides as before.
func TestFunctionPackedArguments(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	require.NoError(t, rdb.FunctionLoadReplace(ctx, stepLibrary).Err())
	fcall := func(key string, args []any) ([]any, error) {
		return replyList(rdb.FCall(ctx, stepFunction, []string{key}, args...))
	}
	const now = int64(unixNow)
	rules := append(benchRules(),
		ratelimit.SlidingCounter{Limit: 3, Window: time.Second, CountRefused: true},
		ratelimit.SubWindow{Limit: 3, Window: time.Second, Buckets: 5, CountRefused: true},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 2},
		ratelimit.FixedWindow{Limit: 3, Window: time.Second},
		ratelimit.SlidingLog{Limit: 3, Window: time.Second},
		ratelimit.GCRA{Rate: ratelimit.Every(30 * 24 * time.Hour), Burst: 2}, // beyond the fast path's range
	)
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(time.Duration(now))
		prefix := testPrefix()
		s, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix))
		require.NoError(t, err)
		p := s.Params()
		for i := range 12 {
			cost := ratelimit.Units(i%3+1) * ratelimit.Unit
			if cost > p.Capacity {
				cost = p.Capacity
			}
			for _, look := range []bool{false, true} {
				args := s.args(cost, 0, look)
				want, werr := fcall(prefix+"slots", args)
				got, gerr := fcall(prefix+"packed", s.checkArgs(cost, 0, look))
				require.Equal(t, werr, gerr, "%s check %d", p.Algorithm, i)
				require.Equal(t, want, got, "%s check %d", p.Algorithm, i)
			}
			clk.Advance(time.Duration(i) * 37 * time.Millisecond)
		}
	}

	// The server's TIME: the text alone.
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 2}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	for _, want := range []int64{1, 1, 0} {
		r, err := fcall(s.Key("time"), s.checkArgs(ratelimit.Unit, 0, false))
		require.NoError(t, err)
		_, _, _, admitted, err := s.parseStep(r)
		require.NoError(t, err)
		require.Equal(t, want, admitted, "the server's TIME")
	}

	// Hostile texts, on a key with a state: each is refused, nothing is
	// written.
	good := "m 1000 1000 10 100000000 0 100000000 0" // GCRA, 10/s, burst 1
	hostile := []string{
		"", " ", "m", "m ", "x 1000 1000 10 100000000 0 100000000 0", "M 1000 1000 10 100000000 0 100000000 0",
		"mm 1000 1000 10 100000000 0 100000000 0", " m 1000 1000 10 100000000 0 100000000 0",
		good + " ", good + " 0", good + "  0", good + " 0 0", // trailing space; more arguments, a bound's too
		"m 1000 1000 10 100000000 0 100000000", "m 1000  1000 10 100000000 0 100000000 0",
		"m 01000 1000 10 100000000 0 100000000 0", "m 0x3e8 1000 10 100000000 0 100000000 0",
		"m 1e3 1000 10 100000000 0 100000000 0", "m -1000 1000 10 100000000 0 100000000 0",
		"m +1000 1000 10 100000000 0 100000000 0", "m 1000.0 1000 10 100000000 0 100000000 0",
		"m 1000 1000 10 100000000 0 100000000 0x", "m\t1000 1000 10 100000000 0 100000000 0",
		"m 1000 1000 10 9223372036854775808 0 100000000 0", "m 1000 1000 10 99999999999999999999 0 100000000 0",
		"f 1000 1000 10 100000000 0 100000000 0", // a window's step with a bucket's arguments
		"f 1000 1000 1000000000", "s 1000 1000 1000000000 1000 0",
	}
	key := testPrefix() + "hostile"
	const state = "1780000000000000000 1780000000100000000 0"
	require.NoError(t, rdb.Set(ctx, key, state, time.Hour).Err())
	nowArg := strconv.FormatInt(now, 10)
	for _, text := range hostile {
		for _, args := range [][]any{{text, nowArg}, {text}} {
			_, err := fcall(key, args)
			require.ErrorContains(t, err, "RATELIMIT invalid argument", "%q admitted", text)
			got, err := rdb.Get(ctx, key).Result()
			require.NoError(t, err)
			require.Equal(t, state, got, "%q wrote", text)
		}
	}
	// A good text with a bad now is the step's invalid argument, as it is
	// with one argument per slot.
	_, err = fcall(key, []any{good, "17800000000000000x0"})
	require.ErrorContains(t, err, "RATELIMIT invalid argument")
	// The good text decides: the state's TAT is a whole interval ahead, so
	// the burst of 1 is spent at now and refused, then admitted an
	// interval on.
	for _, c := range []struct {
		now  int64
		want int64
	}{{now, 0}, {now + 100_000_000, 1}} {
		r, err := fcall(key, []any{good, strconv.FormatInt(c.now, 10)})
		require.NoError(t, err)
		_, _, _, admitted, err := s.parseStep(r)
		require.NoError(t, err)
		require.Equal(t, c.want, admitted)
	}
}

// TestParseStepReplies: the step's reply is its four fields joined by
// commas (step.lua), or from a composite's layerstep the list of four;
// any other shape is a mismatch, counted, whatever it holds.
func TestParseStepReplies(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 2})
	require.NoError(t, err)
	const now = "1780000000000000000"
	for _, reply := range [][]any{
		{"1 2 3," + now + ",4 5 6,1"},
		{"1 2 3", now, "4 5 6", int64(1)},
	} {
		old, at, written, admitted, err := s.parseStep(reply)
		require.NoError(t, err)
		require.Equal(t, "1 2 3", old)
		require.Equal(t, int64(1780000000000000000), at)
		require.Equal(t, "4 5 6", written)
		require.Equal(t, int64(1), admitted)
	}
	old, _, written, admitted, err := s.parseStep([]any{"," + now + ",,0"})
	require.NoError(t, err, "a fresh key refused: no old state, nothing written")
	require.Equal(t, []any{"", "", int64(0)}, []any{old, written, admitted})
	bad := [][]any{
		nil, {}, {""}, {int64(1)}, {now}, {"1 2 3," + now}, {"1 2 3," + now + ",4 5 6"},
		{"1 2 3," + now + ",4 5 6,"}, {"1 2 3," + now + ",4 5 6,x"}, {"1 2 3," + now + ",4 5 6,1,1"},
		{"1 2 3,x,4 5 6,1"}, {"1 2 3,,4 5 6,1"}, {"1 2 3," + now + "0000,4 5 6,1"},
		{"1 2 3", now, "4 5 6"}, {"1 2 3", int64(5), "4 5 6", int64(1)}, {int64(1), now, "4 5 6", int64(1)},
		{"1 2 3", now, "4 5 6", int64(1), int64(1)},
	}
	for i, reply := range bad {
		_, _, _, _, err := s.parseStep(reply)
		require.ErrorIs(t, err, ErrMismatch, "%q", reply)
		require.Equal(t, uint64(i+1), s.mismatches.Load(), "%q counted", reply)
	}
}
