package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The script with its path forced: exactScript never takes the fast path;
// fastScript refuses with declined wherever the fast path does not decide.
const declined = "fast path declined"

var (
	exactScript = redis.NewScript(scriptSource("fast = function() return nil end"))
	fastScript  = redis.NewScript(scriptSource(`
local decide = fast
fast = function(...)
  local o, r, n, a = decide(...)
  if not o then error('RATELIMIT ` + declined + `') end
  return o, r, n, a
end`))
	// exactFunction is the step's library with its fast path declining:
	// the exact path with its helpers built once, when the library loads.
	exactFunction = func() *functionCaller {
		lib, fn := stepLibrarySource("fast = function() return nil end")
		return &functionCaller{lib: lib, fn: fn, fallback: exactScript}
	}()
)

// pathStores checks each request on the fast path where it decides and on
// the exact path where it does not, and counts which did.
type pathStores struct {
	fast, exact *Store
	onFast      *atomic.Int64
	onExact     *atomic.Int64
}

func newPathStores(t require.TestingT, rdb *redis.Client, rule ratelimit.Rule, opts ...Option) pathStores {
	f, err := New(rdb, rule, opts...)
	require.NoError(t, err)
	l, err := New(rdb, rule, opts...)
	require.NoError(t, err)
	f.script, l.script = fastScript, exactScript
	return pathStores{fast: f, exact: l, onFast: new(atomic.Int64), onExact: new(atomic.Int64)}
}

// check returns the Decision and whether the fast path gave it.
func (p pathStores) check(key string, cost ratelimit.Units) (ratelimit.Decision, bool, error) {
	d, err := p.fast.Check(key, cost)
	if err == nil || !strings.Contains(err.Error(), declined) {
		p.onFast.Add(1)
		return d, true, err
	}
	p.onExact.Add(1)
	d, err = p.exact.Check(key, cost)
	return d, false, err
}

// within is check for a leaky bucket's CheckWithin.
func (p pathStores) within(key string, cost ratelimit.Units, maxDelay time.Duration) (ratelimit.Decision, bool, error) {
	d, err := p.fast.CheckWithin(key, cost, maxDelay)
	if err == nil || !strings.Contains(err.Error(), declined) {
		p.onFast.Add(1)
		return d, true, err
	}
	p.onExact.Add(1)
	d, err = p.exact.CheckWithin(key, cost, maxDelay)
	return d, false, err
}

// TestBothPathsSameDecisions is TestSameDecisionsAsInProcess with each
// check (a leaky bucket's CheckWithin too) decided by an explicit path (the
// fast one wherever its range check passes, else the exact one) and, on a
// store of its own, by the exact path alone, as a script or as the library runs it: both must give the
// in-process Decision, also on the states that refunds, settlements (debts
// included) and resets write. The draws reach both sides of every range
// check; the test requires that both paths decided some checks.
func TestBothPathsSameDecisions(t *testing.T) {
	rdb := needRedis(t)
	var onFast, onExact atomic.Int64
	rapid.Check(t, func(t *rapid.T) {
		var rule ratelimit.Rule
		if rapid.Bool().Draw(t, "everyday") {
			rule = drawEverydayRule(t)
		} else {
			rule = drawRule(t)
		}
		start := rapid.SampledFrom([]time.Duration{0, 5, time.Second, unixNow, ratelimit.MaxTime - year, ratelimit.MaxTime}).Draw(t, "start")
		clk := ratelimit.NewManualClock(start)
		prefix := testPrefix()
		// Two stores share the paths' keys, each with a cache of its own
		// (as two replicas would); the caches are off here, as this test
		// is about the script's arithmetic (the deny cache has its own).
		opts := []Option{WithClock(clk), WithPrefix(prefix), WithExpiryMargin(time.Hour), WithTimeout(5 * time.Second), WithDenyCache(0)}
		paths := newPathStores(t, rdb, rule, opts...)
		exact, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix+"exact:"), WithExpiryMargin(time.Hour), WithTimeout(5*time.Second), WithDenyCache(0))
		require.NoError(t, err)
		// The exact path alone, as a script or as the library runs it.
		exact.script = exactScript
		if rapid.Bool().Draw(t, "library") {
			exact.script = exactFunction
		}
		p := paths.fast.Params()
		local := map[string]ratelimit.Limiter{}
		checks := 0
		var ats []time.Duration
		span := max(p.Window, time.Duration(p.TauNanos), 2)
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				d := rapid.OneOf(
					rapid.SampledFrom([]time.Duration{0, 1, time.Millisecond, time.Second, span, span / 2, span - 1, 49 * 24 * time.Hour}),
					rapid.Map(rapid.Int64Range(0, int64(span)), func(v int64) time.Duration { return time.Duration(v) }),
					rapid.Map(rapid.Int64Range(0, int64(year)), func(v int64) time.Duration { return time.Duration(v) }),
				).Draw(t, "advance")
				clk.Advance(d)
			},
			"back": func(t *rapid.T) {
				now := clk.Now()
				clk.Set(now - time.Duration(rapid.Int64Range(0, int64(min(now, span))).Draw(t, "back")))
			},
			"check": func(t *rapid.T) {
				key := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key")
				cost := drawCost(t, p.Capacity)
				l, ok := local[key]
				if !ok {
					l, err = ratelimit.New(rule, ratelimit.WithClock(clk))
					require.NoError(t, err)
					local[key] = l
				}
				want, werr := l.Check(cost)
				require.NoError(t, werr)
				got, fast, gerr := paths.check(key, cost)
				require.NoError(t, gerr)
				alone, aerr := exact.Check(key, cost)
				require.NoError(t, aerr)
				checks++
				if want != got || want != alone {
					t.Fatalf("check %d at %d, key %q, cost %d (fast path %v):\n in-process %+v\n redis      %+v\n exact      %+v", checks, clk.Now(), key, cost, fast, want, got, alone)
				}
				if want.Allowed {
					ats = append(ats, want.At)
				}
			},
			// A leaky bucket's CheckWithin refuses, in the script of either
			// path, an admission whose Delay is over the cap.
			"within": func(t *rapid.T) {
				if p.Algorithm != "leaky_bucket" {
					return
				}
				key := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key")
				cost := drawCost(t, p.Capacity)
				maxDelay := drawMaxDelay(t, span)
				l, ok := local[key]
				if !ok {
					l, err = ratelimit.New(rule, ratelimit.WithClock(clk))
					require.NoError(t, err)
					local[key] = l
				}
				want, werr := withinModel(l, cost, p.Capacity, maxDelay)
				require.NoError(t, werr)
				got, fast, gerr := paths.within(key, cost, maxDelay)
				require.NoError(t, gerr)
				alone, aerr := exact.CheckWithin(key, cost, maxDelay)
				require.NoError(t, aerr)
				checks++
				if want != got || want != alone {
					t.Fatalf("check %d within %d at %d, key %q, cost %d (fast path %v):\n in-process %+v\n redis      %+v\n exact      %+v", checks, maxDelay, clk.Now(), key, cost, fast, want, got, alone)
				}
				if want.Allowed {
					ats = append(ats, want.At)
				}
			},
			// States written by refunds and resets must read back on
			// either path (a key no check has touched is left out: it is
			// not in Redis, and gives back nothing).
			"refund": func(t *rapid.T) {
				key := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key")
				l, ok := local[key]
				if !ok || len(ats) == 0 {
					return
				}
				at := rapid.SampledFrom(ats).Draw(t, "at")
				cost := drawCost(t, p.Capacity)
				want, err := ratelimit.Refund(l, cost, at)
				require.NoError(t, err)
				got, err := paths.fast.Refund(key, cost, at)
				require.NoError(t, err)
				alone, err := exact.Refund(key, cost, at)
				require.NoError(t, err)
				require.Equal(t, want, got, "refund at %d of %d admitted at %d", clk.Now(), cost, at)
				require.Equal(t, want, alone, "refund at %d of %d admitted at %d", clk.Now(), cost, at)
			},
			"reset": func(t *rapid.T) {
				key := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key")
				if l, ok := local[key]; ok {
					require.NoError(t, ratelimit.Reset(l))
					require.NoError(t, paths.fast.Reset(key))
					require.NoError(t, exact.Reset(key))
				}
			},
			// Settlements leave keys in debt (or refund): the checks after
			// them decide on debt states, on either path.
			"settle": func(t *rapid.T) {
				key := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key")
				l, ok := local[key]
				if !ok {
					return
				}
				at := clk.Now()
				if len(ats) > 0 && rapid.Bool().Draw(t, "admitted") {
					at = rapid.SampledFrom(ats).Draw(t, "at")
				}
				charged := drawCost(t, p.Capacity)
				actual := drawActual(t, charged, p.Capacity)
				want, wx, err := ratelimit.Settle(l, charged, actual, at)
				require.NoError(t, err)
				got, gx, err := paths.fast.Settle(key, charged, actual, at)
				require.NoError(t, err)
				alone, ax, err := exact.Settle(key, charged, actual, at)
				require.NoError(t, err)
				require.Equal(t, want, got, "settle at %d of %d as %d admitted at %d", clk.Now(), charged, actual, at)
				require.Equal(t, want, alone, "settle at %d of %d as %d admitted at %d", clk.Now(), charged, actual, at)
				require.Equal(t, wx, gx)
				require.Equal(t, wx, ax)
			},
		})
		onFast.Add(paths.onFast.Load())
		onExact.Add(paths.onExact.Load())
		for _, s := range []*Store{paths.fast, paths.exact, exact} {
			st := s.Stats()
			require.Zero(t, st.Mismatches+st.Failures)
		}
	})
	t.Logf("checks on the fast path %d, on the exact path %d", onFast.Load(), onExact.Load())
	assert.Positive(t, onFast.Load(), "no check took the fast path")
	assert.Positive(t, onExact.Load(), "no check took the exact path")
}

// drawEverydayRule draws rules of the sizes services use, most of them
// inside the fast path's range, some just outside it.
func drawEverydayRule(t *rapid.T) ratelimit.Rule {
	count := rapid.SampledFrom([]int64{1, 3, 10, 100, 1000, 1_000_003, 2_251_799_813_685, 2_251_799_813_686}).Draw(t, "count")
	per := rapid.SampledFrom([]time.Duration{
		time.Microsecond, 250 * time.Microsecond, time.Millisecond, 100 * time.Millisecond, time.Second,
		1500 * time.Millisecond, 1500 * time.Nanosecond, 7 * time.Second, time.Minute, time.Hour, 24 * time.Hour, 26 * 24 * time.Hour, 27 * 24 * time.Hour,
	}).Draw(t, "per")
	for {
		var r ratelimit.Rule
		switch rapid.IntRange(0, 6).Draw(t, "algorithm") {
		case 0:
			r = ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: count, Per: per}, Burst: count}
		case 1:
			r = ratelimit.GCRA{Rate: ratelimit.Rate{Count: count, Per: per}, Burst: max(1, count/2)}
		case 2:
			r = ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: count, Per: per}, Capacity: count, Delay: rapid.Int64Range(0, count).Draw(t, "delay")}
		case 3:
			r = ratelimit.FixedWindow{Limit: count, Window: per}
		case 4:
			r = ratelimit.SlidingLog{Limit: min(count, 20), Window: per}
		case 5:
			r = ratelimit.SlidingCounter{Limit: count, Window: per, CountRefused: rapid.Bool().Draw(t, "countRefused")}
		default:
			k := rapid.SampledFrom([]int{1, 2, 4, 5, 6, 10, 60}).Draw(t, "buckets")
			r = ratelimit.SubWindow{Limit: count, Window: per, Buckets: k, CountRefused: rapid.Bool().Draw(t, "countRefused")}
		}
		if _, err := ratelimit.NewMachine(r); err == nil {
			return r
		}
		count = 10
	}
}

// TestRangeCheckEdges pins which path decides on either side of each range
// check, and that both decide as the in-process limiter does.
func TestRangeCheckEdges(t *testing.T) {
	rdb := needRedis(t)
	const fl = 1 << 51 // constants below it are read on the fast path
	type step struct {
		advance time.Duration
		cost    ratelimit.Units
		fast    bool
	}
	tests := []struct {
		name  string
		rule  ratelimit.Rule
		start time.Duration
		steps []step
	}{
		{"a span just below 2^51 ns", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 1, Per: fl - 1}, Burst: 1}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {fl - 2, ratelimit.Unit, true}, {1, ratelimit.Unit, true}}},
		{"a span of 2^51 ns", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 1, Per: fl}, Burst: 1}, unixNow,
			[]step{{0, ratelimit.Unit, false}, {fl - 1, ratelimit.Unit, false}, {1, ratelimit.Unit, false}}},
		{"a capacity just below 2^51 milli-units", ratelimit.FixedWindow{Limit: (fl - 1) / 1000, Window: time.Second}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {time.Second, (fl - 1) / 1000 * ratelimit.Unit, true}}},
		{"a capacity above 2^51 milli-units", ratelimit.FixedWindow{Limit: fl/1000 + 1, Window: time.Second}, unixNow,
			[]step{{0, ratelimit.Unit, false}, {time.Second, ratelimit.Unit, false}}},
		{"a window of whole seconds", ratelimit.SlidingCounter{Limit: 3, Window: 7 * time.Second}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {0, 2 * ratelimit.Unit, true}, {5 * time.Second, ratelimit.Unit, true}, {3 * time.Second, ratelimit.Unit, true}, {1, ratelimit.Unit, true}}},
		{"a window of whole microseconds", ratelimit.SlidingCounter{Limit: 3, Window: 1500 * time.Millisecond}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {time.Second, 2 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {1499999, ratelimit.Unit, true}}},
		{"a fixed window of whole microseconds", ratelimit.FixedWindow{Limit: 2, Window: 7 * time.Microsecond}, unixNow + 3,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {3 * time.Microsecond, ratelimit.Unit, true}, {4 * time.Microsecond, ratelimit.Unit, true}}},
		{"a window neither whole microseconds nor dividing a second", ratelimit.SlidingCounter{Limit: 3, Window: 1500 * time.Nanosecond}, unixNow,
			[]step{{0, ratelimit.Unit, false}, {time.Microsecond, ratelimit.Unit, false}}},
		{"a window of whole microseconds at MaxTime, index beyond 2^51", ratelimit.FixedWindow{Limit: 1, Window: time.Microsecond}, ratelimit.MaxTime,
			[]step{{0, ratelimit.Unit, false}, {0, ratelimit.Unit, false}}},
		{"a window dividing a second, index below 2^51", ratelimit.FixedWindow{Limit: 1, Window: time.Microsecond}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {time.Microsecond, ratelimit.Unit, true}}},
		{"a window dividing a second, index beyond 2^51", ratelimit.FixedWindow{Limit: 1, Window: 100}, unixNow,
			[]step{{0, ratelimit.Unit, false}, {100, ratelimit.Unit, false}}},
		{"a log whose old entries are beyond 2^22 s", ratelimit.SlidingLog{Limit: 3, Window: time.Second}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {1, ratelimit.Unit, true}, {50 * 24 * time.Hour, ratelimit.Unit, false}, {1, ratelimit.Unit, true}}},
		{"a log merging costs at one instant", ratelimit.SlidingLog{Limit: 5, Window: time.Second}, unixNow,
			[]step{{0, ratelimit.Unit, true}, {0, 2 * ratelimit.Unit, true}, {0, 3 * ratelimit.Unit, true}, {time.Second - 1, ratelimit.Unit, true}, {1, ratelimit.Unit, true}}},
		{"times below one second", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 3}, 5,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {0, 2 * ratelimit.Unit, true}, {50 * time.Millisecond, ratelimit.Unit, true}}},
		{"a counter counting refusals", ratelimit.SlidingCounter{Limit: 3, Window: time.Second, CountRefused: true}, unixNow,
			[]step{{0, 2 * ratelimit.Unit, true}, {0, 2 * ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {time.Second / 2, 2 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}}},
		{"a counter counting refusals, exactly", ratelimit.SlidingCounter{Limit: 3, Window: 1500 * time.Nanosecond, CountRefused: true}, unixNow,
			[]step{{0, 2 * ratelimit.Unit, false}, {0, 2 * ratelimit.Unit, false}, {0, ratelimit.Unit, false}, {1500, ratelimit.Unit, false}, {700, 2 * ratelimit.Unit, false}, {1500, ratelimit.Unit, false}}},
		{"sub-windows of whole microseconds", ratelimit.SubWindow{Limit: 3, Window: 3 * time.Second, Buckets: 3}, unixNow,
			[]step{{0, 2 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {time.Second, 2 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {10 * time.Second, 3 * ratelimit.Unit, true}}},
		{"sub-windows counting refusals", ratelimit.SubWindow{Limit: 3, Window: 3 * time.Second, Buckets: 3, CountRefused: true}, unixNow,
			[]step{{0, 2 * ratelimit.Unit, true}, {time.Second, 2 * ratelimit.Unit, true}, {0, 3 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}}},
		{"sub-windows neither whole microseconds nor dividing a second", ratelimit.SubWindow{Limit: 3, Window: 4500, Buckets: 3, CountRefused: true}, unixNow,
			[]step{{0, 2 * ratelimit.Unit, false}, {1500, 2 * ratelimit.Unit, false}, {0, 3 * ratelimit.Unit, false}, {1500, ratelimit.Unit, false}, {1500, ratelimit.Unit, false}, {1500, ratelimit.Unit, false}}},
		{"sub-windows near the origin", ratelimit.SubWindow{Limit: 3, Window: 60 * time.Second, Buckets: 60}, 5,
			[]step{{0, 2 * ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {59 * time.Second, ratelimit.Unit, true}, {time.Second, ratelimit.Unit, true}}},
		{"MaxTime", ratelimit.SlidingCounter{Limit: 2, Window: time.Second}, ratelimit.MaxTime,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}}},
		{"a window dividing a second at MaxTime, index below 2^51", ratelimit.SlidingCounter{Limit: 2, Window: time.Millisecond}, ratelimit.MaxTime,
			[]step{{0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}, {0, ratelimit.Unit, true}}},
		{"a window dividing a second at MaxTime, index beyond 2^51", ratelimit.SlidingCounter{Limit: 2, Window: time.Microsecond}, ratelimit.MaxTime,
			[]step{{0, ratelimit.Unit, false}, {0, ratelimit.Unit, false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(tc.start)
			// No deny cache: every step is the script's.
			paths := newPathStores(t, rdb, tc.rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
			local, err := ratelimit.New(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			for i, st := range tc.steps {
				clk.Advance(st.advance)
				want, err := local.Check(st.cost)
				require.NoError(t, err)
				got, fast, err := paths.check("k", st.cost)
				require.NoError(t, err)
				assert.Equal(t, want, got, "step %d", i)
				assert.Equal(t, st.fast, fast, "step %d: decided on the fast path", i)
			}
		})
	}
}

// TestServerTimeOnBothPaths: on the server's clock, both paths read TIME
// and decide a fresh key alike.
func TestServerTimeOnBothPaths(t *testing.T) {
	rdb := needRedis(t)
	// Two units that come back one per ten days: a span of 20 days, below
	// 2^51 ns.
	rule := ratelimit.TokenBucket{Rate: ratelimit.Every(10 * 24 * time.Hour), Burst: 2}
	paths := newPathStores(t, rdb, rule, WithPrefix(testPrefix()))
	exact, err := New(rdb, rule, WithPrefix(testPrefix()))
	require.NoError(t, err)
	exact.script = exactScript
	for i := range 3 {
		d, fast, err := paths.check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, fast)
		l, err := exact.Check("k", ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, i < 2, d.Allowed)
		assert.Equal(t, d.Allowed, l.Allowed)
		assert.Equal(t, d.Remaining, l.Remaining)
	}
}

// TestServerTimeBehindState: on the server's clock, a state whose latest
// instant is ahead of TIME, in a later second, is decided at that instant,
// by the fast path (forced, and as the library runs it) and the exact one
// alike: the instant the fast path writes is in the state's second, not
// TIME's.
func TestServerTimeBehindState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for _, rule := range []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000},
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
	} {
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		for _, script := range []scriptRunner{fastScript, exactScript, nil} {
			s, err := New(rdb, rule, WithPrefix(testPrefix()), WithDenyCache(0))
			require.NoError(t, err)
			if script != nil {
				s.script = script
			}
			tm, err := rdb.Time(ctx).Result()
			require.NoError(t, err)
			latest := tm.UnixNano() + 5*int64(time.Second) + 300*int64(time.Millisecond)
			state := strconv.FormatInt(latest, 10) + " " + strconv.FormatInt(latest, 10) + " 0"
			require.NoError(t, rdb.Set(ctx, s.Key("k"), state, time.Hour).Err())
			want, next, err := m.Step([]byte(state), time.Duration(tm.UnixNano()), ratelimit.Unit, true)
			require.NoError(t, err)
			got, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err, "%T on %q", rule, state)
			assert.Equal(t, want.Allowed, got.Allowed, "%T on %q", rule, state)
			w, err := rdb.Get(ctx, s.Key("k")).Result()
			require.NoError(t, err)
			assert.Equal(t, string(next), w, "%T on %q", rule, state)
		}
	}
}

// TestEmptyValueIsFresh: an empty Redis value is a fresh key, for the
// script on either path as for the Machine.
func TestEmptyValueIsFresh(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for _, rule := range benchRules() {
		for _, script := range []*redis.Script{fastScript, exactScript} {
			clk := ratelimit.NewManualClock(unixNow)
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
			require.NoError(t, err)
			s.script = script
			require.NoError(t, rdb.Set(ctx, s.Key("k"), "", time.Hour).Err())
			local, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			want, err := local.Check(ratelimit.Unit)
			require.NoError(t, err)
			got, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err, s.Params().Algorithm)
			assert.Equal(t, want, got, s.Params().Algorithm)
		}
	}
}

// TestDebtOnEachPath settles keys into their deepest debt and requires
// each path, forced, to decide on the debt states as the Machine does, as
// the debt is waited off: the fast path must decide them itself (its range
// checks take in debt) for rules of everyday sizes.
func TestDebtOnEachPath(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rules := []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
		ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 5},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10},
		ratelimit.FixedWindow{Limit: 10, Window: time.Second},
		ratelimit.SlidingLog{Limit: 10, Window: time.Second},
		ratelimit.SlidingCounter{Limit: 10, Window: time.Second},
		ratelimit.SlidingCounter{Limit: 10, Window: time.Second, CountRefused: true},
		ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 4},
		ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 4, CountRefused: true},
	}
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(unixNow)
		s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
		require.NoError(t, err)
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		p := s.Params()
		d, err := s.Check("k", 3*ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		_, settled, err := s.Settle("k", 3*ratelimit.Unit, 100*p.Capacity, d.At)
		require.NoError(t, err)
		require.Equal(t, 2*p.Capacity, settled, "%T: a debt to twice the capacity", rule)
		span := max(p.Window, time.Duration(p.TauNanos))
		for i := range 12 {
			state, err := rdb.Get(ctx, s.Key("k")).Result()
			require.NoError(t, err)
			now := clk.Now()
			want, next, err := m.Step([]byte(state), now, ratelimit.Unit, true)
			require.NoError(t, err)
			for _, script := range []*redis.Script{fastScript, exactScript} {
				f, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
				require.NoError(t, err)
				f.script = script
				require.NoError(t, rdb.Set(ctx, f.Key("k"), state, time.Hour).Err())
				got, err := f.Check("k", ratelimit.Unit)
				require.NoError(t, err, "%T on %q", rule, state)
				assert.Equal(t, want, got, "%T on %q", rule, state)
				w, err := rdb.Get(ctx, f.Key("k")).Result()
				require.NoError(t, err)
				assert.Equal(t, string(next), w, "%T on %q", rule, state)
			}
			if i%3 == 0 {
				// And the store's own check moves the key on.
				got, err := s.Check("k", ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, want, got)
			}
			clk.Advance(span / 5)
		}
	}
}

// TestServerTimeDebtOnLibrary: on the server's clock, the library's fast
// path (forced) decides a bucket in debt as the Machine does at TIME's
// instant, whether the debt's time is in TIME's second, in the next, in the
// one after or later, at either end of a second or within it: the library
// keeps the texts of the seconds after TIME's (secCache in fast.lua), to
// read such a time from its last nine digits and to write an instant in
// the next second, and both must agree with the time's own digits.
func TestServerTimeDebtOnLibrary(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	// A span of 5 s: a debt reaches up to 10 s past the latest instant.
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 5}
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	src, fn := stepLibrarySource(`
local decide = fast
fast = function(...)
  local o, r, n, a = decide(...)
  if not o then error('RATELIMIT ` + declined + `') end
  return o, r, n, a
end`)
	s, err := New(rdb, rule, WithPrefix(testPrefix()), WithDenyCache(0))
	require.NoError(t, err)
	s.script = &functionCaller{lib: src, fn: fn, fallback: fastScript}
	sec := int64(time.Second)
	ends := []int64{0, 1, 2, sec / 2, sec - 2, sec - 1}
	for k := int64(0); k <= 3; k++ {
		for _, ns := range ends {
			for _, cost := range []ratelimit.Units{ratelimit.Unit, ratelimit.Unit / 3, 2 * ratelimit.Unit} {
				tm, err := rdb.Time(ctx).Result()
				require.NoError(t, err)
				latest := tm.UnixNano() - sec
				debt := (tm.Unix()+k)*sec + ns
				state := strconv.FormatInt(latest, 10) + " " + strconv.FormatInt(debt, 10) + " 0"
				require.NoError(t, rdb.Set(ctx, s.Key("k"), state, time.Hour).Err())
				got, err := s.Check("k", cost)
				require.NoError(t, err, "on %q", state)
				want, next, err := m.Step([]byte(state), got.At, cost, true)
				require.NoError(t, err)
				assert.Equal(t, want, got, "on %q at %d", state, got.At)
				w, err := rdb.Get(ctx, s.Key("k")).Result()
				require.NoError(t, err)
				assert.Equal(t, string(next), w, "on %q at %d", state, got.At)
			}
		}
	}
}
