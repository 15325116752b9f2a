// Command playground runs the rate-limiting algorithms side by side on
// virtual time and prints what each admits.
package main

import (
	"fmt"
	"os"

	"github.com/ratekit/ratelimit"
)

func main() {
	clk := ratelimit.NewManualClock(0)
	rules := []struct {
		name string
		rule ratelimit.Rule
	}{
		{"token bucket", ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20}},
		{"GCRA", ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20}},
		{"leaky bucket", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 20}},
	}
	for _, r := range rules {
		lim, err := ratelimit.New(r.rule, ratelimit.WithClock(clk))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		admitted := 0
		for i := 0; i < 25; i++ {
			d, err := lim.Check(ratelimit.Unit)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if d.Allowed {
				admitted++
			}
		}
		fmt.Printf("%-13s 25 requests at once: %d admitted\n", r.name, admitted)
	}
}
