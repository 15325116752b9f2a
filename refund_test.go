package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// TestRefundModel checks every algorithm's refund against its reference
// model: random traces of checks, refunds of earlier admissions (and of
// instants nothing was admitted at), and checks refunded at once, with the
// amount given back and every later Decision equal to the model's. A
// second model never sees the checks refunded at once: the limiter must
// decide as it does, so such a pair leaves the key exactly as before.
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
