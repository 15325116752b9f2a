package ratelimit_test

import (
	"context"
	"fmt"

	"github.com/ratekit/ratelimit"
)

// At most two requests of a key in progress at once, taken together with a
// rate limit: a request refused a slot spends none of its allowance.
func ExampleInFlight() {
	clk := ratelimit.NewManualClock(0)
	slots, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: 2, Name: "in-flight"}, ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}
	rate, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5, Name: "api"}, ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	release1, d, _ := slots.AcquireWith(ctx, "alice", rate, ratelimit.Unit)
	fmt.Println(d.Allowed, d.Policy, d.Remaining)
	release2, d, _ := slots.AcquireWith(ctx, "alice", rate, ratelimit.Unit)
	fmt.Println(d.Allowed, d.Policy, d.Remaining)
	_, d, _ = slots.AcquireWith(ctx, "alice", rate, ratelimit.Unit) // no slot: nothing spent
	fmt.Println(d.Allowed, d.Policy, d.Remaining)

	release1()
	release1() // changes nothing
	defer release2()
	release3, d, _ := slots.AcquireWith(ctx, "alice", rate, ratelimit.Unit)
	defer release3()
	fmt.Println(d.Allowed, d.Policy, d.Remaining, slots.InUse("alice"))
	// Output:
	// true api 4
	// true api 3
	// false in-flight 0
	// true api 2 2
}
