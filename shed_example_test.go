package ratelimit_test

import (
	"context"
	"fmt"

	"github.com/ratekit/ratelimit"
)

// A worker shedder over 10 requests in progress: as they fill, sheddable
// requests are refused first (at 70%), then default ones (at 90%), and
// critical ones only at the limit. A refused class is admitted again once
// the work in progress falls 10 points below its share.
func ExampleWorkerShedder() {
	shed, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{
		Limit: 10,
		Classes: []ratelimit.ShedClass{
			{Name: "critical", Share: 100},
			{Name: "default", Share: 90},
			{Name: "sheddable", Share: 70},
		},
		Name: "workers",
	}, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	if err != nil {
		panic(err)
	}
	sheddable, _ := shed.Class("sheddable")
	def, _ := shed.Class("default")
	critical, _ := shed.Class("critical")
	ctx := context.Background()

	var held []ratelimit.Release
	admit := func(p ratelimit.Priority, n int) {
		admitted := 0
		for range n {
			release, d, err := shed.Admit(ctx, p)
			if err == nil && d.Allowed {
				held = append(held, release)
				admitted++
			}
		}
		fmt.Printf("%-9s %d of %d admitted, %d in progress\n", shed.Classes()[p].Name, admitted, n, shed.InUse())
	}
	admit(sheddable, 8)
	admit(def, 3)
	admit(critical, 2)

	for _, release := range held[:5] {
		release() // with defer, in a handler
	}
	admit(sheddable, 1)
	// Output:
	// sheddable 7 of 8 admitted, 7 in progress
	// default   2 of 3 admitted, 9 in progress
	// critical  1 of 2 admitted, 10 in progress
	// sheddable 1 of 1 admitted, 6 in progress
}
