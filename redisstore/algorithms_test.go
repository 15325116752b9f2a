package redisstore

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// coreAlgorithms returns the names of the core's algorithms, as the core
// lists them in its error for a rule document naming none of them (the
// one place it lists them outside its package).
func coreAlgorithms(t *testing.T) []string {
	var spec ratelimit.RuleSpec
	err := json.Unmarshal([]byte(`{"algorithm": "?"}`), &spec)
	require.Error(t, err)
	_, list, ok := strings.Cut(err.Error(), "is not one of ")
	require.True(t, ok, "the core's error no longer lists its algorithms: %v", err)
	return strings.Split(list, ", ")
}

// TestAlgorithmTable checks the table of algorithms against the core and
// against itself: one entry for each of the core's algorithms and no
// other, benchRules (one rule per algorithm) covering them all, each
// step's arguments in order from argRule with no gap and its bound after
// them (appendBound's order for an algorithm that delays), one code and one
// Lua name per step, one index per argument name, a lease that either
// decays (a bucket) or has a span and a count of them, each step named in
// settle.lua (its refunds and settlements), and settle.lua's arguments in
// order with no gap.
func TestAlgorithmTable(t *testing.T) {
	core := coreAlgorithms(t)
	require.NotEmpty(t, core)
	assert.Len(t, algorithms, len(core), "entries for %v", core)
	for _, name := range core {
		_, ok := algorithmFor(name)
		assert.True(t, ok, "the core's %s has no entry", name)
	}
	names := map[string]bool{}
	for _, rule := range benchRules() {
		m, err := ratelimit.NewMachine(rule)
		require.NoError(t, err)
		name := m.Params().Algorithm
		_, ok := algorithmFor(name)
		assert.True(t, ok, "%s has no entry", name)
		names[name] = true
	}
	codes, luas := map[string]*scriptStep{}, map[string]*scriptStep{}
	slots := map[string]*slot{}
	for i, sl := range stepHead {
		slots[sl.name] = sl
		assert.Equal(t, i, sl.at, sl.name)
	}
	assert.Len(t, stepHead, argRule)
	for _, a := range algorithms {
		assert.True(t, names[a.name], "%s is in the table but not in benchRules", a.name)
		delete(names, a.name) // a second entry for it fails above
		st := a.step
		require.NotNil(t, st, a.name)
		if o, ok := codes[st.code]; ok {
			assert.Same(t, o, st, "%s: code %q names two steps", a.name, st.code)
		}
		if o, ok := luas[st.lua]; ok {
			assert.Same(t, o, st, "%s: ALG_%s names two steps", a.name, st.lua)
		}
		codes[st.code], luas[st.lua] = st, st
		assert.Regexp(t, `^[a-z]$`, st.code, a.name)
		assert.Regexp(t, `^[A-Z][A-Z_]*$`, st.lua, a.name)
		for i, sl := range st.slots {
			assert.Equal(t, argRule+i, sl.at, "%s: argument %s", a.name, sl.name)
			if o, ok := slots[sl.name]; ok {
				assert.Same(t, o, sl, "%s: ARG_%s names two arguments", a.name, sl.name)
			}
			slots[sl.name] = sl
		}
		for i, sl := range st.bound {
			assert.Equal(t, argRule+len(st.slots)+i, sl.at, "%s: bound argument %s", a.name, sl.name)
			if o, ok := slots[sl.name]; ok {
				assert.Same(t, o, sl, "%s: ARG_%s names two arguments", a.name, sl.name)
			}
			slots[sl.name] = sl
		}
		if a.delays {
			assert.Equal(t, []*slot{argMaxDelay, argMaxDelayFrac}, st.bound, "%s: its step's bound, in appendBound's order", a.name)
		}
		assert.Equal(t, st.takes(argCostSpan), st.takes(argCostFrac), a.name)
		assert.Contains(t, settleLua, "ALG_"+st.lua, "%s: settle.lua has no refund or settlement for it", a.name)
		if l := a.lease; l != nil {
			assert.Equal(t, l.span == nil, l.spans == nil, a.name)
			assert.NotEqual(t, l.meter, l.span != nil, "%s: a lease decays or has a span", a.name)
		}
	}
	assert.Empty(t, names, "algorithms of benchRules without an entry")
	for i, sl := range settleArgs {
		assert.Equal(t, i, sl.at, "settle.lua's %s", sl.name)
	}
	assert.Equal(t, settlePace.at, settleWindow.at)
	assert.Equal(t, settlePeriod.at, settleRefused.at)
}

// TestStepArgs pins the arguments a check sends, slot by slot, for each
// algorithm: the order step.lua reads them in.
func TestStepArgs(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	clk := ratelimit.NewManualClock(5)
	for _, rule := range append(benchRules(),
		ratelimit.SlidingCounter{Limit: 10, Window: time.Second, CountRefused: true},
		ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 5, CountRefused: true}) {
		s, err := New(rdb, rule, WithClock(clk), WithExpiryMargin(1500*time.Millisecond))
		require.NoError(t, err)
		p := s.Params()
		t.Run(p.Algorithm, func(t *testing.T) {
			head := []any{"", "5", "3000", "1500"}
			refused := "0"
			if p.CountRefused {
				refused = "1"
			}
			var rest []any
			switch p.Algorithm {
			case "token_bucket", "gcra", "leaky_bucket":
				head[0] = "m"
				ns, frac := s.m.Span(3000)
				rest = []any{u(p.RateUnits), u(p.TauNanos), u(p.TauFrac), u(ns), u(frac)}
			case "fixed_window":
				head[0] = "f"
				rest = []any{"1000000000", u(uint64(p.Capacity))}
			case "sliding_log":
				head[0] = "l"
				rest = []any{"1000000000", u(uint64(p.Capacity))}
			case "sliding_counter":
				head[0] = "c"
				rest = []any{"1000000000", u(uint64(p.Capacity)), refused}
			case "sub_window":
				head[0] = "s"
				rest = []any{"1000000000", u(uint64(p.Capacity)), refused, u(uint64(p.Buckets))}
			default:
				t.Fatalf("no expected arguments for %s", p.Algorithm)
			}
			want := append(head, rest...)
			assert.Equal(t, want, s.args(3000, 0, false))
			// The library's check sends them packed: one text of all but
			// now, then now; with the server's TIME, the text alone.
			text := want[0].(string)
			for _, a := range want[2:] {
				text += " " + a.(string)
			}
			packed := s.checkArgs(3000, 0, false)
			assert.Equal(t, []any{text, "5"}, packed)
			assert.Equal(t, want, unpackArgs(packed), "unpacked for the script")
			st, err := New(rdb, rule, WithExpiryMargin(1500*time.Millisecond))
			require.NoError(t, err)
			assert.Equal(t, []any{text}, st.checkArgs(3000, 0, false), "the server's TIME")
			onServer := slices.Clone(want)
			onServer[argNow.at] = ""
			assert.Equal(t, onServer, unpackArgs(st.checkArgs(3000, 0, false)), "the server's TIME, unpacked")
			if p.CountRefused {
				want[argRefused.at] = refusedLook
			}
			assert.Equal(t, want, s.args(3000, 0, true), "a look")
			assert.Equal(t, want, s.lookArgs.appendCheck(nil, s.alg.step, s.m, "5", 3000), "a composite's layer")
			assert.Equal(t, "7", s.args(3000, 7, false)[argNow.at], "the floor")
			if s.alg.delays {
				bound := func(budget time.Duration) []any { return s.withinArgs(3000, 0, budget)[len(want):] }
				assert.Equal(t, []any{"0", "0"}, bound(-1), "a negative budget: every queue is too long")
				assert.Equal(t, []any{u(p.TauNanos), u(p.TauFrac)}, bound(time.Duration(p.TauNanos)+1), "at most the capacity's span")
				bn, bf := p.DelayNanos+1000, p.DelayFrac+1
				if bf == p.RateUnits {
					bn, bf = bn+1, 0
				}
				assert.Equal(t, []any{u(bn), u(bf)}, bound(1000), "the budget, the Delay span and 1/n")
			}
		})
	}
}

// TestCheckLayersDelays: CheckLayers with a cap on the Delay lists every
// enforced layer for every algorithm, the leaky bucket's (checked by the
// bounded script) as the others'.
func TestCheckLayersDelays(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for _, rule := range benchRules() {
		c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: rule}}}, WithPrefix(testPrefix()))
		require.NoError(t, err)
		name := c.layers[0].p.Algorithm
		d, layers, err := c.CheckLayers(ctx, "k", ratelimit.Unit, time.Second, nil)
		require.NoError(t, err, name)
		assert.True(t, d.Allowed, name)
		assert.Len(t, layers, 1, name)
	}
}

// TestAppendBound pins the bound a check on its Delay sends (see
// appendBound) where the capacity's span has a fraction of a ns: a budget
// of the span's whole ns is still below the span.
func TestAppendBound(t *testing.T) {
	tests := []struct {
		name   string
		rule   ratelimit.LeakyBucket
		budget time.Duration
		want   []any
	}{
		// 7 per ns: n = 7000, a unit is 1000/7000 ns, the capacity's span 2000/7000 ns.
		{"no budget, a span below a ns", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 1}, Capacity: 2}, 0, []any{"0", "1"}},
		{"a budget beyond the span", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 1}, Capacity: 2}, 1, []any{"0", "2000"}},
		{"a Delay span and no budget", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 1}, Capacity: 2, Delay: 1}, 0, []any{"0", "1001"}},
		{"a negative budget", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 1}, Capacity: 2, Delay: 2}, -1, []any{"0", "0"}},
		// 1 per 3 s: n = 1 (a milli-unit every 3 ms), the capacity's span 6 s.
		{"whole ns", ratelimit.LeakyBucket{Rate: ratelimit.Every(3 * time.Second), Capacity: 2, Delay: 1}, time.Second, []any{"4000000001", "0"}},
		{"the span's whole ns", ratelimit.LeakyBucket{Rate: ratelimit.Every(3 * time.Second), Capacity: 2}, 6 * time.Second, []any{"6000000000", "0"}},
		{"the longest budget", ratelimit.LeakyBucket{Rate: ratelimit.Every(3 * time.Second), Capacity: 2, Delay: 2}, maxBudget, []any{"6000000000", "0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ratelimit.NewMachine(tc.rule)
			require.NoError(t, err)
			assert.Equal(t, tc.want, appendBound(nil, m.Params(), tc.budget))
		})
	}
}
