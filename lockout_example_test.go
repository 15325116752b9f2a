package ratelimit_test

import (
	"fmt"
	"log"
	"time"

	"github.com/ratekit/ratelimit"
)

// A login that locks an address out after 5 wrong passwords within a
// minute: for 15 minutes, then twice as long for each repeat within a day.
func ExampleLockout() {
	clk := ratelimit.NewManualClock(0) // virtual time; leave WithClock out for the system clock
	lockout, err := ratelimit.NewLockout(ratelimit.LockoutRule{
		Failures: 5, Within: time.Minute, Block: 15 * time.Minute,
		Growth: 2, MaxBlock: 4 * time.Hour, Forget: 24 * time.Hour, Name: "login",
	}, ratelimit.WithClock(clk))
	if err != nil {
		log.Fatal(err)
	}
	login := func(addr, password string) string {
		if d := lockout.Check(addr); !d.Allowed {
			return fmt.Sprint("locked out for ", d.RetryAfter)
		}
		if password == "letmein" {
			return "welcome" // successes never count
		}
		d, started := lockout.Fail(addr)
		if started {
			return fmt.Sprint("wrong password; locked out for ", d.RetryAfter)
		}
		return fmt.Sprint("wrong password; ", d.Remaining, " more and you are locked out")
	}

	for range 5 {
		fmt.Println(login("203.0.113.7", "guess"))
		clk.Advance(time.Second)
	}
	fmt.Println(login("203.0.113.7", "letmein"))
	fmt.Println(login("198.51.100.1", "letmein"), "(another address)")
	clk.Advance(15 * time.Minute)
	fmt.Println(login("203.0.113.7", "letmein"))
	for range 5 {
		login("203.0.113.7", "guess")
	}
	fmt.Println(login("203.0.113.7", "guess"), "(a repeat)")
	// Output:
	// wrong password; 4 more and you are locked out
	// wrong password; 3 more and you are locked out
	// wrong password; 2 more and you are locked out
	// wrong password; 1 more and you are locked out
	// wrong password; locked out for 15m0s
	// locked out for 14m59s
	// welcome (another address)
	// welcome
	// locked out for 30m0s (a repeat)
}
