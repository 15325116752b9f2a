package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// Testing a handler of one's own behind the middleware, on virtual time: the
// store reads a ManualClock, so the test decides when time passes, sleeps
// nowhere, and sees the same responses on every run.
func Example_testingOnVirtualTime() {
	clk := ratelimit.NewManualClock(0)
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerMinute(6), Burst: 2, Name: "api"},
		ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}
	mine := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	h := httplimit.Middleware(store)(mine)

	send := func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil)) // from 192.0.2.1
		fmt.Printf("at %v: %d %s", clk.Now(), w.Code, w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Printf(" Retry-After: %s", ra)
		}
		fmt.Println()
	}
	send()
	send()
	send() // over the burst
	clk.Advance(9 * time.Second)
	send() // a second early
	clk.Advance(time.Second)
	send() // 6 a minute: one every 10 s
	// Output:
	// at 0s: 200 "api";r=1;t=10
	// at 0s: 200 "api";r=0;t=20
	// at 0s: 429 "api";r=0;t=20 Retry-After: 10
	// at 9s: 429 "api";r=0;t=11 Retry-After: 1
	// at 10s: 200 "api";r=0;t=20
}
