package ratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestPlansUpdateStreamStarvesNoOperation: an Update lands between every
// attempt's look at the rule set and its locks (the plan function runs
// there and makes one, whenever no operation holds Updates off), which
// would start an operation over for as long as the Updates came. Every
// operation on a key still ends, having let at most two Updates in (three
// for Wait, which looks at the key's plan once before its attempts).
func TestPlansUpdateStreamStarvesNoOperation(t *testing.T) {
	sets := [2]ratelimit.PlanSet{}
	for i := range sets {
		sets[i] = ratelimit.PlanSet{Default: "p", Plans: map[string]ratelimit.Plan{
			"p": {Layers: []ratelimit.Layer{
				{Rule: ratelimit.FixedWindow{Limit: int64(10 + i), Window: time.Hour}},
				{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: int64(100 + i)}, Key: func(string) string { return "all" }},
			}},
		}}
	}
	var p *ratelimit.Plans
	var updating atomic.Bool
	var updates atomic.Int64
	planOf := func(string) string {
		if updating.Load() {
			n := updates.Load()
			ran, err := ratelimit.TryUpdate(p, sets[(n+1)%2], ratelimit.MigrateProportional)
			if err != nil {
				panic(err)
			}
			if ran {
				updates.Add(1)
			}
		}
		return "p"
	}
	clk := ratelimit.NewManualClock(time.Hour)
	var err error
	p, err = ratelimit.NewPlans(sets[0], planOf, ratelimit.WithClock(clk))
	require.NoError(t, err)
	ops := []struct {
		name string
		lets int64 // Updates it may let in: two, and one more for Wait's look at the key's plan first
		op   func(key string) error
	}{
		{"check", 2, func(key string) error { _, err := p.Check(key, ratelimit.Unit); return err }},
		{"check within", 2, func(key string) error { _, err := p.CheckWithin(key, ratelimit.Unit, time.Second); return err }},
		{"wait", 3, func(key string) error { _, err := p.Wait(context.Background(), key, ratelimit.Unit); return err }},
		{"peek", 2, func(key string) error { _, err := p.Peek(key, ratelimit.Unit); return err }},
		{"refund", 2, func(key string) error { _, err := p.Refund(key, ratelimit.Unit, clk.Now()); return err }},
		{"settle", 2, func(key string) error {
			_, _, err := p.Settle(key, ratelimit.Unit, 2*ratelimit.Unit, clk.Now())
			return err
		}},
		{"reset", 2, func(key string) error { p.Reset(key); return nil }},
	}
	for _, tc := range ops {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			_, err := p.Check(key, ratelimit.Unit) // held, then moved by the Updates
			require.NoError(t, err)
			before := updates.Load()
			updating.Store(true)
			done := make(chan error, 1)
			go func() { done <- tc.op(key) }()
			select {
			case err := <-done:
				updating.Store(false)
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				updating.Store(false) // lets the operation end
				<-done
				t.Fatalf("%s still starting over after 5 s (%d Updates)", tc.name, updates.Load()-before)
			}
			require.LessOrEqual(t, updates.Load()-before, tc.lets, "Updates let in")
			d, err := p.Peek(key, ratelimit.Unit)
			require.NoError(t, err)
			require.Contains(t, []int64{10, 11, 100, 101}, d.Limit)
		})
	}
}
