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

// An API call is admitted on an estimate of what it will use, and settled
// at its real cost when it ends. One that used more leaves the key in debt,
// which the key waits off before its next call passes; one that used less
// is refunded.
func ExampleStore_Settle() {
	clk := ratelimit.NewManualClock(0)
	// 1,000 tokens at once, 100 a second after that.
	store, _ := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 1000},
		ratelimit.WithClock(clk))

	estimate := 1000 * ratelimit.Unit
	d, _ := store.Check("client", estimate)
	fmt.Println("admitted:", d.Allowed)

	clk.Advance(5 * time.Second) // the call runs; the bucket earns 500 meanwhile
	d, settled, _ := store.Settle("client", estimate, 2400*ratelimit.Unit, d.At)
	// The bucket holds 500 - 1400 = -900: another call of 1,000 waits
	// until it has earned 1,900.
	fmt.Println("settled:", settled, "remaining:", d.Remaining, "next call in:", d.RetryAfter)

	clk.Advance(d.RetryAfter)
	d, _ = store.Check("client", estimate)
	fmt.Println("admitted:", d.Allowed)
	d, settled, _ = store.Settle("client", estimate, 300*ratelimit.Unit, d.At) // it used 300
	fmt.Println("settled:", settled, "remaining:", d.Remaining)
	// Output:
	// admitted: true
	// settled: 2400 remaining: 0 next call in: 19s
	// admitted: true
	// settled: 300 remaining: 700
}
