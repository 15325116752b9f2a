package ratelimit_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// allKinds is one limiter of every kind over one rule, for the tests of
// what can be done after the fact: a single-key limiter, a store, a
// composite of the rule per key under the same rule for all keys, and a
// rule set whose key "k2" is on a plan of those two layers.
type allKinds struct {
	lim   ratelimit.Limiter
	store *ratelimit.Store
	comp  *ratelimit.Composite
	plans *ratelimit.Plans
}

func buildKinds(t require.TestingT, rule ratelimit.Rule, clk ratelimit.Clock) allKinds {
	var k allKinds
	var err error
	k.lim, err = ratelimit.New(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	k.store, err = ratelimit.NewStore(rule, ratelimit.WithClock(clk), fewKeys)
	require.NoError(t, err)
	layers := []ratelimit.Layer{{Rule: rule}, {Rule: rule, Key: func(string) string { return "all" }}}
	k.comp, err = ratelimit.Compose(layers, ratelimit.WithClock(clk), fewKeys)
	require.NoError(t, err)
	set := ratelimit.PlanSet{
		Plans:   map[string]ratelimit.Plan{"one": {Rule: rule}, "two": {Layers: layers}},
		Default: "one",
	}
	k.plans, err = ratelimit.NewPlans(set, func(key string) string {
		if key == "k2" {
			return "two"
		}
		return "one"
	}, ratelimit.WithClock(clk), fewKeys)
	require.NoError(t, err)
	return k
}

// fewKeys bounds the stores of property tests whose traces hold a handful
// of keys. The default bound of a million would take 256 shards a store,
// which tests that build thousands of stores under the race detector pay
// for in tens of seconds.
var fewKeys = ratelimit.WithMaxKeys(1000)

// kindOps names each kind's Check and Peek for a key (the single-key
// limiter ignores it).
type kindOp struct {
	name  string
	check func(k allKinds, key string, cost ratelimit.Units) (ratelimit.Decision, error)
	peek  func(k allKinds, key string, cost ratelimit.Units) (ratelimit.Decision, error)
	keys  func(k allKinds) int
}

var kindOps = []kindOp{
	{
		name:  "Limiter",
		check: func(k allKinds, _ string, c ratelimit.Units) (ratelimit.Decision, error) { return k.lim.Check(c) },
		peek: func(k allKinds, _ string, c ratelimit.Units) (ratelimit.Decision, error) {
			return ratelimit.Peek(k.lim, c)
		},
		keys: func(allKinds) int { return 0 },
	},
	{
		name: "Store",
		check: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.store.Check(key, c)
		},
		peek: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.store.Peek(key, c)
		},
		keys: func(k allKinds) int { return k.store.Len() },
	},
	{
		name: "Composite",
		check: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.comp.Check(key, c)
		},
		peek: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.comp.Peek(key, c)
		},
		keys: func(k allKinds) int {
			n := 0
			for _, st := range k.comp.Stats() {
				n += st.Keys
			}
			return n
		},
	},
	{
		name: "Plans",
		check: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.plans.Check(key, c)
		},
		peek: func(k allKinds, key string, c ratelimit.Units) (ratelimit.Decision, error) {
			return k.plans.Peek(key, c)
		},
		keys: func(k allKinds) int {
			n := 0
			for _, sts := range k.plans.Stats() {
				for _, st := range sts {
					n += st.Keys
				}
			}
			return n
		},
	},
}

var afterKeys = []string{"k0", "k1", "k2"}

// TestPeekIsCheckWithoutSpending checks, for every algorithm and every
// kind of limiter, that Peek returns exactly the Decision (and error) that
// Check then returns at the same instant, and that it changes nothing: a
// twin that is never peeked decides every later check the same, and a key
// only peeked at is never added.
func TestPeekIsCheckWithoutSpending(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				rule := a.rule(s)
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
				peeked, twin := buildKinds(t, rule, clk), buildKinds(t, rule, clk)
				capMilli := s.capacity * int64(ratelimit.Unit)
				actions := traceActions(clk, a.scale(s))
				// A clock that goes back is clamped per store shard, and
				// which keys share a shard differs from store to store: the
				// twins could then differ without any Peek.
				delete(actions, "back")
				actions["check"] = func(t *rapid.T) {
					key := rapid.SampledFrom(afterKeys).Draw(t, "key")
					cost := drawCost(t, capMilli)
					for _, op := range kindOps {
						d1, err1 := op.check(peeked, key, cost)
						d2, err2 := op.check(twin, key, cost)
						require.Equal(t, err2, err1, op.name)
						require.Equal(t, d2, d1, "%s: a peeked limiter decides as one never peeked", op.name)
					}
				}
				actions["peekThenCheck"] = func(t *rapid.T) {
					key := rapid.SampledFrom(afterKeys).Draw(t, "key")
					cost := drawCost(t, capMilli)
					for _, op := range kindOps {
						p, perr := op.peek(peeked, key, cost)
						d1, err1 := op.check(peeked, key, cost)
						d2, err2 := op.check(twin, key, cost)
						require.Equal(t, err1, perr, op.name)
						require.Equal(t, d1, p, "%s: Peek is Check's Decision", op.name)
						require.Equal(t, err2, err1, op.name)
						require.Equal(t, d2, d1, op.name)
					}
				}
				actions["peek"] = func(t *rapid.T) {
					key := rapid.SampledFrom(append(afterKeys, "never")).Draw(t, "key")
					cost := drawCost(t, capMilli)
					for _, op := range kindOps {
						n := op.keys(peeked)
						_, _ = op.peek(peeked, key, cost)
						require.Equal(t, n, op.keys(peeked), "%s: Peek adds no key", op.name)
					}
				}
				t.Repeat(actions)
			})
		})
	}
}

// TestPeekFreshKey checks that Peek judges a key a store does not hold as
// fresh, and leaves it out.
func TestPeekFreshKey(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	k := buildKinds(t, ratelimit.FixedWindow{Limit: 5, Window: time.Second}, clk)
	for _, op := range kindOps[1:] {
		d, err := op.peek(k, "new", 2*ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed, op.name)
		require.Equal(t, int64(3), d.Remaining, op.name)
		require.Equal(t, 0, op.keys(k), op.name)
	}
	_, err := k.store.Peek("new", 6*ratelimit.Unit)
	require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	_, err = ratelimit.Peek(ratelimit.Shadow(k.lim, nil), ratelimit.Unit)
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// TestPeekCountRefused checks that Peek reports a refusal under a rule
// that counts refusals exactly as Check does, and counts nothing.
func TestPeekCountRefused(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.SlidingCounter{Limit: 5, Window: time.Second, CountRefused: true},
		ratelimit.SubWindow{Limit: 5, Window: time.Second, Buckets: 4, CountRefused: true},
	}
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(0)
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		_, err = store.Check("k", 4*ratelimit.Unit)
		require.NoError(t, err)
		clk.Advance(300 * time.Millisecond)
		p1, err := store.Peek("k", 2*ratelimit.Unit)
		require.NoError(t, err)
		p2, err := store.Peek("k", 2*ratelimit.Unit)
		require.NoError(t, err)
		assert.Equal(t, p1, p2, "%T: a peek counts nothing", rule)
		d, err := store.Check("k", 2*ratelimit.Unit)
		require.NoError(t, err)
		assert.False(t, d.Allowed)
		assert.Equal(t, d, p1, "%T", rule)
	}
}

// TestPeekPlansMovedKey checks Peek on a key whose plan changed: it judges
// the key by what it spent on its old plan, as the next check does.
func TestPeekPlansMovedKey(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	var plan atomic.Value
	plan.Store("small")
	set := ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"small": {Rule: ratelimit.FixedWindow{Limit: 10, Window: time.Second}},
			"big":   {Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Second}},
		},
		Default: "small",
	}
	p, err := ratelimit.NewPlans(set, func(string) string { return plan.Load().(string) }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	_, err = p.Check("c", 5*ratelimit.Unit)
	require.NoError(t, err)
	plan.Store("big") // half spent moves as half spent: 50 of 100
	d, err := p.Peek("c", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, int64(49), d.Remaining)
	d2, err := p.Check("c", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, d2, d)
}
