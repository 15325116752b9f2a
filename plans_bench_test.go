package ratelimit_test

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// alternate runs passes of n operations of each of fs in turn until b.N
// operations of each have run, and reports each one's ns/op, named by
// names, and each one's ratio to the first: measured side by side, so that
// the machine's noise falls on all alike.
func alternate(b *testing.B, n int, names []string, fs ...func(i int)) {
	b.Helper()
	spent := make([]time.Duration, len(fs))
	done := 0
	b.ResetTimer()
	for done < b.N {
		m := min(n, b.N-done)
		for j, f := range fs {
			start := time.Now()
			for i := done; i < done+m; i++ {
				f(i)
			}
			spent[j] += time.Since(start)
		}
		done += m
	}
	b.StopTimer()
	for j, name := range names {
		b.ReportMetric(float64(spent[j].Nanoseconds())/float64(b.N), name+"-ns/op")
		if j > 0 {
			b.ReportMetric(float64(spent[j])/float64(spent[0]), name+"/"+names[0])
		}
	}
	b.ReportMetric(0, "ns/op") // the figures above are the measure
}

// BenchmarkPlansHeldKey compares the check of a key its plan of one rule
// holds with the same check on a Store of that rule, in alternating passes
// of one run (the ratio is Plans/Store), in a rule set of 2 plans and in
// one of 1,000 (past 8, a plan is found by its name in a map).
func BenchmarkPlansHeldKey(b *testing.B) {
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000_000), Burst: 1_000_000}
	for _, n := range []int{2, 1_000} {
		b.Run("plans="+strconv.Itoa(n), func(b *testing.B) {
			s, err := ratelimit.NewStore(rule)
			require.NoError(b, err)
			set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"free": {Rule: rule}}, Default: "free"}
			for i := 1; i < n; i++ {
				set.Plans["pro-"+strconv.Itoa(i)] = ratelimit.Plan{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000_000), Burst: int64(1_000_000 + i)}}
			}
			p, err := ratelimit.NewPlans(set, func(string) string { return "free" })
			require.NoError(b, err)
			_, _ = s.Check("k", ratelimit.Unit)
			_, _ = p.Check("k", ratelimit.Unit)
			b.ReportAllocs()
			alternate(b, 10_000, []string{"Store", "Plans"},
				func(int) { _, _ = s.Check("k", ratelimit.Unit) },
				func(int) { _, _ = p.Check("k", ratelimit.Unit) })
		})
	}
}

// TestPlansHeldKeyAllocatesNothing: the check of a key its plan holds
// allocates nothing, as a Store's does.
func TestPlansHeldKeyAllocatesNothing(t *testing.T) {
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
		"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}},
		"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100}},
	}, Default: "free"}, func(k string) string { return k[:4] })
	require.NoError(t, err)
	for _, key := range []string{"free-k", "pro--k"} {
		_, err := p.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = p.Check(key, ratelimit.Unit) }), key)
	}
}

// BenchmarkPlansFirstCheck compares the first check of a new key on rule
// sets of 1 to 10,000 plans, and on one after 1,000 Updates that changed
// its rule (one a second, day-long windows), with the first check of a new
// key on a Store of one rule, in alternating passes of one run (the ratio
// is Plans/Store).
func BenchmarkPlansFirstCheck(b *testing.B) {
	const keys = 1 << 18 // each store's bound
	rule := func(i int) ratelimit.Rule {
		return ratelimit.FixedWindow{Limit: int64(1_000 + i), Window: 24 * time.Hour}
	}
	run := func(b *testing.B, p *ratelimit.Plans) {
		s, err := ratelimit.NewStore(rule(0), ratelimit.WithMaxKeys(keys), ratelimit.WithClock(p.Clock()))
		require.NoError(b, err)
		names := make([]string, b.N) // new keys, each checked once on each side
		for i := range names {
			names[i] = "key-" + strconv.Itoa(i)
		}
		alternate(b, 1_000, []string{"Store", "Plans"},
			func(i int) { _, _ = s.Check(names[i], ratelimit.Unit) },
			func(i int) { _, _ = p.Check(names[i], ratelimit.Unit) })
	}
	for _, n := range []int{1, 100, 1_000, 10_000} {
		b.Run("plans="+strconv.Itoa(n), func(b *testing.B) {
			set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{}, Default: "0"}
			for i := range n {
				set.Plans[strconv.Itoa(i)] = ratelimit.Plan{Rule: rule(i)}
			}
			// Every new key on one plan, as on the Store, with n-1 other
			// plans (whose stores a key could have been held in).
			p, err := ratelimit.NewPlans(set, func(string) string { return "0" },
				ratelimit.WithMaxKeys(keys), ratelimit.WithClock(ratelimit.NewManualClock(0)))
			require.NoError(b, err)
			run(b, p)
		})
	}
	b.Run("updates=1000", func(b *testing.B) {
		clk := ratelimit.NewManualClock(0)
		set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"a": {Rule: rule(0)}, "b": {Rule: rule(1)}}, Default: "a"}
		p, err := ratelimit.NewPlans(set, func(string) string { return "a" },
			ratelimit.WithMaxKeys(keys), ratelimit.WithClock(clk))
		require.NoError(b, err)
		for i := range 1_000 {
			clk.Advance(time.Second)
			set.Plans["a"] = ratelimit.Plan{Rule: rule(2 + i)}
			require.NoError(b, p.Update(set, ratelimit.MigrateProportional))
		}
		run(b, p)
	})
}

// BenchmarkPlansMemory reports the heap per key held (B/key) of a Plans
// whose keys are all on one plan of one GCRA rule, beside a Store of that
// rule, after 1,000,000 distinct keys (both bounded at 2^21 keys a store:
// room for all). What a Plans adds to its plan's store is the key's record
// (see BenchmarkStoreMemory for how key bytes are counted: in both).
func BenchmarkPlansMemory(b *testing.B) {
	allKeys, _ := storeBenchKeys()
	keys := allKeys[:1_000_000]
	rule := ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}
	measure := func(b *testing.B, check func(string) error, held func() int) {
		var perKey float64
		for i := 0; i < b.N; i++ {
			before := liveHeap()
			for _, k := range keys {
				if err := check(k); err != nil {
					b.Fatal(err)
				}
			}
			perKey = float64(liveHeap()-before) / float64(held())
		}
		b.ReportMetric(perKey, "B/key")
	}
	b.Run("Store", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s, err := ratelimit.NewStore(rule, ratelimit.WithMaxKeys(benchMaxKeys))
			require.NoError(b, err)
			measure(b, func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err }, s.Len)
			runtime.KeepAlive(s)
		}
	})
	b.Run("Plans", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{
				"free": {Rule: rule},
				"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(1000), Burst: 1000}},
			}, Default: "free"}, func(string) string { return "free" }, ratelimit.WithMaxKeys(benchMaxKeys))
			require.NoError(b, err)
			measure(b, func(k string) error { _, err := p.Check(k, ratelimit.Unit); return err },
				func() int { return p.Stats()["free"][0].Keys })
			runtime.KeepAlive(p)
		}
	})
}
