package ratelimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// A limiter of 10 requests a second with bursts of up to 20, on virtual
// time. In a program, leave out WithClock: the default is the process's
// monotonic clock.
func ExampleNew() {
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
		ratelimit.WithClock(clk))
	if err != nil {
		panic(err) // only a malformed rule fails
	}

	d, _ := lim.Check(ratelimit.Unit) // one request
	fmt.Println(d.Allowed, d.Remaining)

	d, _ = lim.Check(10 * ratelimit.Unit) // a bulk call that counts as ten
	fmt.Println(d.Allowed, d.Remaining)

	d, _ = lim.Check(10 * ratelimit.Unit) // only 9 are left
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)

	clk.Advance(d.RetryAfter) // wait exactly as long as told
	d, _ = lim.Check(10 * ratelimit.Unit)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 19
	// true 9
	// false 9 100ms
	// true 0
}

// Errors are for requests that can never pass and for malformed rules, not
// for refusals: a refused request is a Decision with Allowed false.
func ExampleNew_errors() {
	_, err := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10)})
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidRule))
	fmt.Println(err)

	lim, _ := ratelimit.New(ratelimit.FixedWindow{Limit: 5, Window: time.Second})
	_, err = lim.Check(0)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidCost))
	_, err = lim.Check(6 * ratelimit.Unit) // more than the limit: it could never pass
	fmt.Println(errors.Is(err, ratelimit.ErrCostExceedsCapacity))
	// Output:
	// true
	// ratelimit: invalid TokenBucket: Burst must be positive
	// true
	// true
}

// The token bucket holds up to Burst tokens and refills at Rate: after a
// burst empties it, requests pass at the rate.
func ExampleTokenBucket() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20},
		ratelimit.WithClock(clk))

	burst := func(n int) {
		allowed := 0
		var last ratelimit.Decision
		for range n {
			last, _ = lim.Check(ratelimit.Unit)
			if last.Allowed {
				allowed++
			}
		}
		fmt.Printf("at %v: %d of %d allowed; remaining %d, retry after %v, full again after %v\n",
			clk.Now(), allowed, n, last.Remaining, last.RetryAfter, last.ResetAfter)
	}
	burst(25)
	clk.Set(500 * time.Millisecond) // 5 tokens earned
	burst(8)
	clk.Set(2500 * time.Millisecond)
	burst(1)
	// Output:
	// at 0s: 20 of 25 allowed; remaining 0, retry after 100ms, full again after 2s
	// at 500ms: 5 of 8 allowed; remaining 0, retry after 100ms, full again after 2s
	// at 2.5s: 1 of 1 allowed; remaining 19, retry after 0s, full again after 100ms
}

// GCRA makes the token bucket's decisions from one timestamp. RetryAfter is
// exact: the same request is refused one nanosecond earlier and admitted at
// that instant.
func ExampleGCRA() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20},
		ratelimit.WithClock(clk))

	for range 20 {
		lim.Check(ratelimit.Unit)
	}
	d, _ := lim.Check(ratelimit.Unit)
	fmt.Println("21st:", d.Allowed, d.RetryAfter)

	clk.Advance(d.RetryAfter - 1)
	d, _ = lim.Check(ratelimit.Unit)
	fmt.Println("1ns early:", d.Allowed, d.RetryAfter)

	clk.Advance(1)
	d, _ = lim.Check(ratelimit.Unit)
	fmt.Println("on time:", d.Allowed)
	// Output:
	// 21st: false 100ms
	// 1ns early: false 1ns
	// on time: true
}

// The leaky bucket is a queue: it admits up to Capacity at once and tells
// each admitted request, through Delay, when it may go on, so that they
// leave at Rate. NGINX's "rate=5r/s burst=9" is Capacity 10.
func ExampleLeakyBucket() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10},
		ratelimit.WithClock(clk))

	for i := 1; i <= 14; i++ {
		d, _ := lim.Check(ratelimit.Unit)
		if d.Allowed {
			fmt.Printf("#%d goes on after %v\n", i, d.Delay) // a server would sleep d.Delay
		} else {
			fmt.Printf("#%d refused, retry after %v\n", i, d.RetryAfter)
		}
	}
	clk.Set(time.Second) // five have gone out: room for five more
	d, _ := lim.Check(ratelimit.Unit)
	fmt.Printf("at 1s: allowed %v, goes on after %v (at 2s)\n", d.Allowed, d.Delay)
	// Output:
	// #1 goes on after 0s
	// #2 goes on after 200ms
	// #3 goes on after 400ms
	// #4 goes on after 600ms
	// #5 goes on after 800ms
	// #6 goes on after 1s
	// #7 goes on after 1.2s
	// #8 goes on after 1.4s
	// #9 goes on after 1.6s
	// #10 goes on after 1.8s
	// #11 refused, retry after 200ms
	// #12 refused, retry after 200ms
	// #13 refused, retry after 200ms
	// #14 refused, retry after 200ms
	// at 1s: allowed true, goes on after 1s (at 2s)
}

// A fixed window counts from zero again at every boundary, so a client
// that times its requests can get twice the limit through in a short span.
func ExampleFixedWindow() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.FixedWindow{Limit: 10, Window: time.Second},
		ratelimit.WithClock(clk))

	allowed := 0
	for ms := 900; ms < 1100; ms += 10 { // 20 requests from 0.9 s to 1.09 s
		clk.Set(time.Duration(ms) * time.Millisecond)
		if d, _ := lim.Check(ratelimit.Unit); d.Allowed {
			allowed++
		}
	}
	fmt.Println("allowed in 200ms:", allowed)

	d, _ := lim.Check(ratelimit.Unit)
	fmt.Println("next:", d.Allowed, "retry after", d.RetryAfter) // until the window [1s, 2s) ends
	// Output:
	// allowed in 200ms: 20
	// next: false retry after 910ms
}

// The sliding log admits at most Limit in any window of length Window. A
// request admitted at t counts until exactly t+Window, and RetryAfter is
// when enough of the oldest requests have left the window.
func ExampleSlidingLog() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second},
		ratelimit.WithClock(clk))

	for _, at := range []time.Duration{0, 1000, 2000, 2500, 3000, 3100, 9000, 10500, 10600} {
		clk.Set(at * time.Millisecond)
		d, _ := lim.Check(ratelimit.Unit)
		fmt.Printf("%5v: allowed %-5v retry after %v\n", clk.Now(), d.Allowed, d.RetryAfter)
	}
	// Output:
	//    0s: allowed true  retry after 0s
	//    1s: allowed true  retry after 0s
	//    2s: allowed true  retry after 0s
	//  2.5s: allowed true  retry after 0s
	//    3s: allowed true  retry after 0s
	//  3.1s: allowed false retry after 6.9s
	//    9s: allowed false retry after 1s
	// 10.5s: allowed true  retry after 0s
	// 10.6s: allowed false retry after 400ms
}

// The sliding counter estimates the sliding window from two counts: the
// previous window's, weighted by how much of it the sliding window still
// covers, and the current one's.
func ExampleSlidingCounter() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.SlidingCounter{Limit: 100, Window: time.Minute},
		ratelimit.WithClock(clk))

	lim.Check(80 * ratelimit.Unit) // the window [0, 60s) admits 80
	clk.Set(79 * time.Second)
	lim.Check(30 * ratelimit.Unit) // and [60s, 120s) 30, 19 s into it

	// At 80 s the estimate is 80 x 40/60 + 30 = 83.3, and 1 more fits.
	clk.Set(80 * time.Second)
	d, _ := lim.Check(ratelimit.Unit)
	fmt.Println(d.Allowed, "remaining", d.Remaining)

	// 16 do not fit (83.3 + 1 + 16 > 100) until the estimate falls far enough.
	d, _ = lim.Check(16 * ratelimit.Unit)
	fmt.Println(d.Allowed, "retry after", d.RetryAfter)
	// Output:
	// true remaining 15
	// false retry after 250ms
}

// Code under test takes a Limiter (or an Option); the test builds it on a
// ManualClock and moves time by hand, so that it never sleeps and every run
// is the same.
func ExampleManualClock() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 2},
		ratelimit.WithClock(clk))

	send := func() string {
		d, _ := lim.Check(ratelimit.Unit)
		if !d.Allowed {
			return fmt.Sprintf("429, retry after %v", d.RetryAfter)
		}
		return "200"
	}
	fmt.Println(send(), "|", send(), "|", send())

	clk.Advance(600 * time.Millisecond) // one request's worth at 100/min
	fmt.Println(send(), "|", send())

	clk.Set(0) // a clock that goes back is clamped, never trusted
	fmt.Println(send())
	// Output:
	// 200 | 200 | 429, retry after 600ms
	// 200 | 429, retry after 600ms
	// 429, retry after 600ms
}

// Wait blocks until the request is admitted, sleeping on the limiter's own
// clock for exactly the wait a denial names. On a ManualClock a test moves
// time itself; here a goroutine moves the clock to each sleeper's wake-up.
func ExampleLimiter_Wait() {
	clk := ratelimit.NewManualClock(0)
	lim, _ := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 2},
		ratelimit.WithClock(clk))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for clk.BlockUntilSleepers(ctx, 1) == nil {
			if t, ok := clk.NextWake(); ok {
				clk.Set(t)
			}
		}
	}()

	for i := 1; i <= 4; i++ {
		if _, err := lim.Wait(context.Background(), ratelimit.Unit); err != nil {
			panic(err)
		}
		fmt.Printf("call %d at %v\n", i, clk.Now())
	}

	// A caller whose deadline would pass before its turn is told so at once,
	// and spends nothing.
	hourly, _ := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		ratelimit.WithClock(clk))
	hourly.Wait(context.Background(), ratelimit.Unit)
	hurry, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := hourly.Wait(hurry, ratelimit.Unit)
	fmt.Println(errors.Is(err, ratelimit.ErrWouldExceedDeadline), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// call 1 at 0s
	// call 2 at 0s
	// call 3 at 500ms
	// call 4 at 1s
	// true true
}

// Shadow tries a rule on live traffic without refusing anyone: every
// request is admitted, and the report says what the rule would have done.
func ExampleShadow() {
	clk := ratelimit.NewManualClock(0)
	strict, _ := ratelimit.New(ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "strict"},
		ratelimit.WithClock(clk))
	refusals := 0
	lim := ratelimit.Shadow(strict, func(r ratelimit.ShadowReport) {
		if !r.Decision.Allowed {
			refusals++
		}
	})

	for range 3 {
		d, _ := lim.Check(ratelimit.Unit)
		fmt.Println("allowed", d.Allowed, "would have been refused", d.Shadowed)
	}
	fmt.Println(refusals, "refusal reported")
	// Output:
	// allowed true would have been refused false
	// allowed true would have been refused false
	// allowed true would have been refused true
	// 1 refusal reported
}

// Rules can live in configuration as JSON. Reading is strict: a field the
// rule does not use, or a value its constructor would reject, is an error
// naming the rule and the field.
func ExampleRuleSpec() {
	var spec ratelimit.RuleSpec
	err := json.Unmarshal([]byte(`{"name":"api","algorithm":"gcra","rate":"100/min","burst":20}`), &spec)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", spec.Rule)
	lim, _ := ratelimit.New(spec.Rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	d, _ := lim.Check(ratelimit.Unit)
	fmt.Println(d.Policy, d.Limit, d.Window)

	err = json.Unmarshal([]byte(`{"algorithm":"sliding_log","limit":5,"rate":"1/s","window":"10s"}`), &spec)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidRule), err)
	// Output:
	// {Rate:100/min Burst:20 Name:api}
	// api 20 12s
	// true ratelimit: invalid sliding_log rule: rate is not a field of sliding_log
}

// Several limits per request: a global cap and a limit per customer. A
// request must pass every layer, and one that any layer refuses spends
// nothing in any of them.
func ExampleCompose() {
	clk := ratelimit.NewManualClock(0)
	limits, err := ratelimit.Compose([]ratelimit.Layer{
		{
			Rule: ratelimit.FixedWindow{Limit: 3, Window: time.Second, Name: "global"},
			Key:  func(string) string { return "" }, // one key for everyone
		},
		{
			Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2, Name: "per-customer"},
		},
	}, ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}

	for _, customer := range []string{"alice", "alice", "alice", "bob", "carol"} {
		d, _ := limits.Check(customer, ratelimit.Unit)
		if d.Allowed {
			fmt.Printf("%-5s allowed, remaining %d (%s)\n", customer, d.Remaining, d.Policy)
		} else {
			fmt.Printf("%-5s refused by %s, retry after %v\n", customer, d.Policy, d.RetryAfter)
		}
	}
	// Alice's third request took nothing from the global cap, so Bob gets
	// its last place.

	// Output:
	// alice allowed, remaining 1 (per-customer)
	// alice allowed, remaining 0 (per-customer)
	// alice refused by per-customer, retry after 1s
	// bob   allowed, remaining 0 (global)
	// carol refused by global, retry after 1s
}

// Costs are in milli-units: a cheap call can cost a quarter of a request.
func ExampleUnits() {
	lim, _ := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerHour(3600), Burst: 1},
		ratelimit.WithClock(ratelimit.NewManualClock(0)))
	cost := ratelimit.Unit / 4
	for i := 1; i <= 5; i++ {
		d, _ := lim.Check(cost)
		fmt.Println(i, "x", cost, d.Allowed)
	}
	// Output:
	// 1 x 0.25 true
	// 2 x 0.25 true
	// 3 x 0.25 true
	// 4 x 0.25 true
	// 5 x 0.25 false
}

// One allowance per key, every key under the same rule: the usual way to
// limit each client of an API. Keys are independent.
func ExampleNewStore() {
	clk := ratelimit.NewManualClock(0)
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100},
		ratelimit.WithMaxKeys(2_000_000), ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}

	for range 100 {
		store.Check("alice", ratelimit.Unit)
	}
	d, _ := store.Check("alice", ratelimit.Unit)
	fmt.Println("alice:", d.Allowed, "retry after", d.RetryAfter)

	d, _ = store.Check("bob", ratelimit.Unit)
	fmt.Println("bob:", d.Allowed, "remaining", d.Remaining)
	fmt.Println("keys:", store.Len())
	// Output:
	// alice: false retry after 600ms
	// bob: true remaining 99
	// keys: 2
}

// A store bounded to fewer keys than its traffic has to drop keys. Keys that
// are as good as fresh go first and lose nothing; dropping a partly spent
// key hands it a fresh allowance, and Stats counts that as a lossy
// eviction: a growing count means the store is too small.
func ExampleStore_Stats() {
	clk := ratelimit.NewManualClock(0)
	store, _ := ratelimit.NewStore(ratelimit.FixedWindow{Limit: 10, Window: time.Minute},
		ratelimit.WithMaxKeys(2), ratelimit.WithClock(clk))

	store.Check("a", ratelimit.Unit)
	store.Check("b", ratelimit.Unit)
	store.Check("c", ratelimit.Unit) // no room: a or b is dropped, partly spent
	st := store.Stats()
	fmt.Println("keys", st.Keys, "evictions", st.Evictions, "lossy", st.LossyEvictions)

	// A new window: both keys held are as good as fresh, so making room for
	// another drops them both and loses nothing.
	clk.Set(time.Minute)
	store.Check("d", ratelimit.Unit)
	st = store.Stats()
	fmt.Println("keys", st.Keys, "evictions", st.Evictions, "lossy", st.LossyEvictions)
	// Output:
	// keys 2 evictions 1 lossy 1
	// keys 1 evictions 3 lossy 1
}

// An HTTP handler limited per client address, in one line, with the
// middleware of package httplimit over a Store. Every response tells the
// client its allowance; a refused request gets 429 and Retry-After.
func ExampleNewStore_middleware() {
	clk := ratelimit.NewManualClock(0)
	store, _ := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2, Name: "api"},
		ratelimit.WithClock(clk))
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })

	h := httplimit.Middleware(store, httplimit.WithLogger(slog.New(slog.DiscardHandler)))(hello)

	send := func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil)) // from 192.0.2.1
		fmt.Print(rec.Code, " RateLimit: ", rec.Header().Get("RateLimit"))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Print(", Retry-After: ", ra)
		}
		fmt.Println()
	}
	send()
	send()
	send()
	clk.Advance(time.Second)
	send()
	// Output:
	// 200 RateLimit: "api";r=1;t=1
	// 200 RateLimit: "api";r=0;t=2
	// 429 RateLimit: "api";r=0;t=2, Retry-After: 1
	// 200 RateLimit: "api";r=0;t=2
}

// CheckWithin admits a request only if it would go on within a given
// delay. One that would wait longer spends nothing: the queue is as it
// was, and RetryAfter says when the same request would get through in time.
func ExampleStore_CheckWithin() {
	clk := ratelimit.NewManualClock(0)
	store, _ := ratelimit.NewStore(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10},
		ratelimit.WithClock(clk))

	for i := 1; i <= 5; i++ {
		d, _ := store.CheckWithin("partner", ratelimit.Unit, 500*time.Millisecond)
		if d.Allowed {
			fmt.Printf("#%d goes on after %v\n", i, d.Delay)
		} else {
			fmt.Printf("#%d would wait too long: retry after %v\n", i, d.RetryAfter)
		}
	}
	d, _ := store.Check("partner", ratelimit.Unit) // no limit on the wait
	fmt.Println("Check: goes on after", d.Delay)
	// Output:
	// #1 goes on after 0s
	// #2 goes on after 200ms
	// #3 goes on after 400ms
	// #4 would wait too long: retry after 100ms
	// #5 would wait too long: retry after 100ms
	// Check: goes on after 600ms
}

// A cost that can never pass is an error, not a refusal, and it says the
// numbers. A plain request costs Unit: 21 here is 21 thousandths of one.
func ExampleCostError() {
	lim, _ := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 20, Name: "api"})

	_, err := lim.Check(21 * ratelimit.Unit)
	fmt.Println(err)
	var ce *ratelimit.CostError
	if errors.As(err, &ce) {
		fmt.Println(ce.Cost, ce.Capacity, errors.Is(err, ratelimit.ErrCostExceedsCapacity))
	}

	d, err := lim.Check(21) // a bare number is thousandths: almost certainly a bug
	fmt.Println(d.Allowed, err, d.Remaining)
	// Output:
	// ratelimit: cost 21 exceeds the capacity 20 of rule "api": it can never be admitted (a plain request costs Unit, 1000)
	// 21 20 true
	// true <nil> 19
}

// Plans gives each customer's key the rule of its plan, and Update changes
// a plan's rule while the service runs: the key keeps the fraction of its
// allowance it had used, not a fresh burst.
func ExamplePlans() {
	clk := ratelimit.NewManualClock(0)
	customers := map[string]string{"acme": "pro"}
	plans, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(10), Burst: 20}},
			"pro":  {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(100), Burst: 200}},
		},
		Default: "free",
	}, func(key string) string { return customers[key] }, ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}
	d, _ := plans.Check("acme", 150*ratelimit.Unit)
	fmt.Println(d.Policy, d.Remaining)
	d, _ = plans.Check("someone", 15*ratelimit.Unit)
	fmt.Println(d.Policy, d.Remaining)

	// Pro doubles its burst and its rate: acme had used 3/4 of it, and
	// still has, full again when it would have been before.
	set := plans.Set()
	set.Plans["pro"] = ratelimit.Plan{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(200), Burst: 400}}
	if err := plans.Update(set, ratelimit.MigrateProportional); err != nil {
		panic(err)
	}
	d, _ = plans.Check("acme", ratelimit.Unit)
	fmt.Println(d.Policy, d.Remaining)
	// Output:
	// pro 50
	// free 5
	// pro 99
}
