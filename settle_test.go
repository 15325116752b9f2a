package ratelimit_test

import (
	"math"

	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// drawActual draws a settled request's real cost: up to three capacities,
// now and then a whole number of units, or a huge one.
func drawActual(t *rapid.T, capMilli int64) ratelimit.Units {
	return ratelimit.Units(rapid.OneOf(
		rapid.Int64Range(1, 3*capMilli),
		rapid.Map(rapid.Int64Range(1, 3*capMilli/1000), func(n int64) int64 { return n * 1000 }),
		rapid.Just(int64(math.MaxInt64)),
	).Draw(t, "actual"))
}

// settleModel settles on a model by the definition: the difference charged
// (within the debt bound) or refunded, then the Decision a request of cost
// charged would get. It returns that Decision (Window left 0) and the cost
// as settled.
func settleModel(m refmodel.Model, now, charged, actual, at int64) (ratelimit.Decision, int64) {
	settled := charged
	if actual >= charged {
		settled += m.(refmodel.Settler).Charge(now, actual-charged)
	} else {
		settled -= m.(refmodel.Refunder).Refund(now, min(at, now), charged-actual)
	}
	return m.(refmodel.Settler).Look(now, charged), settled
}
