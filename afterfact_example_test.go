package ratelimit_test

import (
	"fmt"
	"time"

	"github.com/ratekit/ratelimit"
)

// A request is charged an estimate up front, and what it did not use is
// given back when it ends. A refund takes the admitting Decision's At, so
// that nothing is given back that the bucket has earned since.
func ExampleStore_Refund() {
	clk := ratelimit.NewManualClock(0)
	store, _ := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
		ratelimit.WithClock(clk))

	d, _ := store.Check("client", 5*ratelimit.Unit) // the estimate
	fmt.Println("admitted:", d.Allowed, "remaining:", d.Remaining)

	clk.Advance(100 * time.Millisecond) // the bucket earns 1 meanwhile
	given, _ := store.Refund("client", 3*ratelimit.Unit, d.At)
	fmt.Println("given back:", given)

	// 18 are left: 15, 1 earned, 2 given back. Peek spends nothing; its
	// Remaining is what would be left after that request.
	p, _ := store.Peek("client", ratelimit.Unit)
	fmt.Println("admitted:", p.Allowed, "remaining after it:", p.Remaining)
	// Output:
	// admitted: true remaining: 15
	// given back: 2
	// admitted: true remaining after it: 17
}
