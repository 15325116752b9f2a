package ratelimit_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// TestRefundModel checks every algorithm's refund and settlement against
// its reference model: random traces of checks, peeks, refunds of earlier
// admissions (and of instants nothing was admitted at), checks refunded at
// once, settlements of earlier admissions both ways (charged past the limit
// into debt, or refunded), and resets, with the amounts given back or
// charged and every Decision equal to the model's. A second model never
// sees the checks refunded at once: the limiter must decide as it does, so
// such a pair leaves the key exactly as before.
func TestRefundModel(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				rule := a.rule(s)
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
				lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				model, ghost := a.model(s), a.model(s)
				window := a.decisionWindow(s)
				capMilli := model.Capacity()
				type admission struct {
					at   time.Duration
					cost ratelimit.Units
				}
				var admitted []admission
				want := func(m refmodel.Model, now, cost int64) ratelimit.Decision {
					d := m.Step(now, cost)
					d.Window = window
					return d
				}
				actions := traceActions(clk, a.scale(s))
				actions["check"] = func(t *rapid.T) {
					cost := drawCost(t, capMilli)
					if int64(cost) > capMilli {
						return
					}
					got, err := lim.Check(cost)
					require.NoError(t, err)
					now := clk.modelNow()
					require.Equal(t, want(model, now, int64(cost)), got)
					require.Equal(t, want(ghost, now, int64(cost)), got, "the model that never saw a check refunded at once")
					if got.Allowed {
						admitted = append(admitted, admission{got.At, cost})
					}
				}
				actions["refund"] = func(t *rapid.T) {
					var ad admission
					if len(admitted) > 0 && rapid.Bool().Draw(t, "earlier") {
						ad = rapid.SampledFrom(admitted).Draw(t, "admission")
						ad.cost = ratelimit.Units(rapid.Int64Range(1, int64(ad.cost)+1000).Draw(t, "refund"))
					} else {
						ad.at = time.Duration(rapid.Int64Range(0, clk.seen).Draw(t, "at"))
						ad.cost = drawCost(t, capMilli)
					}
					g, err := ratelimit.Refund(lim, ad.cost, ad.at)
					require.NoError(t, err)
					now := clk.modelNow()
					c := min(int64(ad.cost), capMilli)
					require.Equal(t, model.(refmodel.Refunder).Refund(now, int64(ad.at), c), int64(g), "given back")
					require.Equal(t, ghost.(refmodel.Refunder).Refund(now, int64(ad.at), c), int64(g), "given back")
				}
				actions["peek"] = func(t *rapid.T) {
					cost := drawCost(t, capMilli)
					if int64(cost) > capMilli {
						return
					}
					got, err := ratelimit.Peek(lim, cost)
					require.NoError(t, err)
					// A look records no instant: judged at the latest one
					// used, or later.
					now := max(min(max(int64(clk.Now()), 0), int64(ratelimit.MaxTime)), clk.seen)
					want := model.(refmodel.Settler).Look(now, int64(cost))
					want.Window = window
					require.Equal(t, want, got)
				}
				actions["settle"] = func(t *rapid.T) {
					var ad admission
					if len(admitted) > 0 && rapid.Bool().Draw(t, "earlier") {
						ad = rapid.SampledFrom(admitted).Draw(t, "admission")
					} else {
						ad.at = time.Duration(rapid.Int64Range(0, clk.seen).Draw(t, "at"))
						ad.cost = ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, "charged"))
					}
					actual := drawActual(t, capMilli)
					got, settled, err := ratelimit.Settle(lim, ad.cost, actual, ad.at)
					require.NoError(t, err)
					now := clk.modelNow()
					for _, m := range []refmodel.Model{model, ghost} {
						want, wantSettled := settleModel(m, now, int64(ad.cost), int64(actual), int64(ad.at))
						want.Window = window
						require.Equal(t, wantSettled, int64(settled), "settled")
						require.Equal(t, want, got)
					}
				}
				actions["reset"] = func(t *rapid.T) {
					require.NoError(t, ratelimit.Reset(lim))
					model, ghost, admitted = a.model(s), a.model(s), nil
				}
				actions["checkThenRefund"] = func(t *rapid.T) {
					cost := drawCost(t, capMilli)
					if int64(cost) > capMilli {
						return
					}
					got, err := lim.Check(cost)
					require.NoError(t, err)
					now := clk.modelNow()
					require.Equal(t, want(model, now, int64(cost)), got)
					if !got.Allowed {
						// Refunding it would take from earlier admissions.
						require.Equal(t, want(ghost, now, int64(cost)), got)
						return
					}
					g, err := ratelimit.Refund(lim, cost, got.At)
					require.NoError(t, err)
					require.Equal(t, cost, g, "an admission refunded at once gives all of it back")
					require.Equal(t, model.(refmodel.Refunder).Refund(now, now, int64(cost)), int64(g))
				}
				t.Repeat(actions)
			})
		})
	}
}

// TestRefundKeyedMatchesLimiter checks that a Store, a Composite of one
// layer and a Plans of one plan check, refund and settle each key exactly
// as a single-key limiter of the same rule does, that a refund of a key
// none of them holds gives nothing and adds nothing, and that a settlement
// of one charges it as a fresh key.
func TestRefundKeyedMatchesLimiter(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				rule := a.rule(s)
				clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
				lims := map[string]ratelimit.Limiter{}
				for _, k := range afterKeys {
					l, err := ratelimit.New(rule, ratelimit.WithClock(clk))
					require.NoError(t, err)
					lims[k] = l
				}
				store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), fewKeys)
				require.NoError(t, err)
				comp, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule}}, ratelimit.WithClock(clk), fewKeys)
				require.NoError(t, err)
				plans, err := ratelimit.NewPlans(ratelimit.PlanSet{
					Plans: map[string]ratelimit.Plan{"one": {Rule: rule}}, Default: "one",
				}, nil, ratelimit.WithClock(clk), fewKeys)
				require.NoError(t, err)
				type keyed interface {
					Check(key string, cost ratelimit.Units) (ratelimit.Decision, error)
					Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error)
					Settle(key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error)
				}
				kinds := map[string]keyed{"Store": store, "Composite": comp, "Plans": plans}
				capMilli := s.capacity * int64(ratelimit.Unit)
				var ats []time.Duration
				actions := traceActions(clk, a.scale(s))
				delete(actions, "back") // see TestPeekIsCheckWithoutSpending
				actions["check"] = func(t *rapid.T) {
					key := rapid.SampledFrom(afterKeys).Draw(t, "key")
					cost := drawCost(t, capMilli)
					want, werr := lims[key].Check(cost)
					for name, k := range kinds {
						got, err := k.Check(key, cost)
						require.Equal(t, werr, err, name)
						if name == "Plans" && got.Policy == "one" {
							got.Policy = "" // an unnamed rule reports its plan's name
						}
						require.Equal(t, want, got, name)
					}
					if want.Allowed {
						ats = append(ats, want.At)
					}
				}
				actions["refund"] = func(t *rapid.T) {
					key := rapid.SampledFrom(append(afterKeys, "never")).Draw(t, "key")
					at := time.Duration(clk.seen)
					if len(ats) > 0 {
						at = rapid.SampledFrom(ats).Draw(t, "at")
					}
					cost := drawCost(t, capMilli)
					var want ratelimit.Units
					if l, ok := lims[key]; ok {
						var err error
						want, err = ratelimit.Refund(l, cost, at)
						require.NoError(t, err)
					}
					for name, k := range kinds {
						got, err := k.Refund(key, cost, at)
						require.NoError(t, err, name)
						require.Equal(t, want, got, name)
					}
					require.LessOrEqual(t, store.Len(), len(afterKeys), "a refund adds no key")
				}
				actions["settle"] = func(t *rapid.T) {
					key := rapid.SampledFrom(afterKeys).Draw(t, "key")
					at := time.Duration(clk.seen)
					if len(ats) > 0 {
						at = rapid.SampledFrom(ats).Draw(t, "at")
					}
					charged := drawCost(t, capMilli)
					actual := drawActual(t, capMilli)
					want, wantSettled, werr := ratelimit.Settle(lims[key], charged, actual, at)
					for name, k := range kinds {
						got, settled, err := k.Settle(key, charged, actual, at)
						require.Equal(t, werr, err, name)
						if name == "Plans" && got.Policy == "one" {
							got.Policy = ""
						}
						require.Equal(t, want, got, name)
						require.Equal(t, wantSettled, settled, name)
					}
				}
				t.Repeat(actions)
			})
		})
	}
}

func TestRefundErrors(t *testing.T) {
	store, err := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 5, Window: time.Second})
	require.NoError(t, err)
	_, err = store.Refund("k", 0, 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	d, err := store.Check("k", 2*ratelimit.Unit)
	require.NoError(t, err)
	g, err := store.Refund("k", 9*ratelimit.Unit, d.At)
	require.NoError(t, err)
	require.Equal(t, 2*ratelimit.Unit, g, "capped at what the key holds")
	_, err = ratelimit.Refund(ratelimit.Shadow(nil, nil), ratelimit.Unit, 0)
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// TestRefundConcurrent checks refunds racing with checks: with the clock
// still, every admission refunded at once leaves the limiter full again,
// whichever order the goroutines run in.
func TestRefundConcurrent(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}, // lock-free
		ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 20},
		ratelimit.SlidingLog{Limit: 20, Window: time.Second},
	}
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(time.Hour)
		lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					if d, _ := lim.Check(3 * ratelimit.Unit); d.Allowed {
						g, _ := ratelimit.Refund(lim, 3*ratelimit.Unit, d.At)
						assert.Equal(t, 3*ratelimit.Unit, g)
					}
					if d, _ := store.Check("k", 3*ratelimit.Unit); d.Allowed {
						g, _ := store.Refund("k", 3*ratelimit.Unit, d.At)
						assert.Equal(t, 3*ratelimit.Unit, g)
					}
				}
			}()
		}
		waitGroup(t, &wg, "the checks and refunds")
		d, err := ratelimit.Peek(lim, 20*ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "%T: full again", rule)
		d, err = store.Peek("k", 20*ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "%T: full again", rule)
	}
}

// TestRefundNeverGivesMore checks the bound on every refund: after a
// check admitted at one instant and refunded at a later one, the key is
// never better off than a twin that never saw that check, at the instant
// of the refund or any later one: whatever it admits the twin admits, with
// at least as much left, as soon, and as fresh.
func TestRefundNeverGivesMore(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				s := a.draw(t)
				rule := a.rule(s)
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				twin, err := ratelimit.New(rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				capMilli := s.capacity * int64(ratelimit.Unit)
				scale := int64(a.scale(s))
				cost := func(label string) ratelimit.Units {
					return ratelimit.Units(rapid.Int64Range(1, capMilli).Draw(t, label))
				}
				for range rapid.IntRange(0, 8).Draw(t, "before") {
					clk.Advance(time.Duration(rapid.Int64Range(0, scale).Draw(t, "gap")))
					c := cost("cost")
					_, err := lim.Check(c)
					require.NoError(t, err)
					_, err = twin.Check(c)
					require.NoError(t, err)
				}
				c := cost("refunded")
				d, err := lim.Check(c)
				require.NoError(t, err)
				if !d.Allowed {
					return
				}
				clk.Advance(time.Duration(rapid.Int64Range(0, 2*scale).Draw(t, "until refund")))
				_, err = ratelimit.Refund(lim, ratelimit.Units(rapid.Int64Range(1, int64(c)).Draw(t, "refund")), d.At)
				require.NoError(t, err)
				for range 3 {
					x := cost("probe")
					got, err := ratelimit.Peek(lim, x)
					require.NoError(t, err)
					want, err := ratelimit.Peek(twin, x)
					require.NoError(t, err)
					if got.Allowed {
						require.True(t, want.Allowed, "the refunded key admits what the twin does not")
					}
					if got.Allowed == want.Allowed { // else the twin describes itself after admitting
						require.LessOrEqual(t, got.Remaining, want.Remaining)
						require.GreaterOrEqual(t, got.RetryAfter, want.RetryAfter)
						require.GreaterOrEqual(t, got.ResetAfter, want.ResetAfter)
					}
					clk.Advance(time.Duration(rapid.Int64Range(0, scale).Draw(t, "later")))
				}
			})
		})
	}
}
