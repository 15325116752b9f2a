package main

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ratekit/ratelimit"
)

// contender is one limiter in a comparison.
type contender struct {
	name string // short name, a column heading
	long string // full name, a row label
	desc string // the rule as Go source
	rule ratelimit.Rule
}

// perSecond10 is "10 per second" in each of the seven algorithms, with the
// same capacity everywhere: a bucket of 10, a queue of 10, a window of 10.
// The sub-window counter runs twice, with 5 and 50 buckets (a second is not
// a whole number of sixths of a nanosecond).
func perSecond10() []contender {
	r := ratelimit.PerSecond(10)
	return []contender{
		{"token", "token bucket", "TokenBucket{Rate: PerSecond(10), Burst: 10}", ratelimit.TokenBucket{Rate: r, Burst: 10}},
		{"GCRA", "GCRA", "GCRA{Rate: PerSecond(10), Burst: 10}", ratelimit.GCRA{Rate: r, Burst: 10}},
		{"leaky", "leaky bucket", "LeakyBucket{Rate: PerSecond(10), Capacity: 10}", ratelimit.LeakyBucket{Rate: r, Capacity: 10}},
		{"fixed", "fixed window", "FixedWindow{Limit: 10, Window: time.Second}", ratelimit.FixedWindow{Limit: 10, Window: time.Second}},
		{"log", "sliding log", "SlidingLog{Limit: 10, Window: time.Second}", ratelimit.SlidingLog{Limit: 10, Window: time.Second}},
		{"counter", "sliding counter", "SlidingCounter{Limit: 10, Window: time.Second}", ratelimit.SlidingCounter{Limit: 10, Window: time.Second}},
		{"sub/5", "sub-window k=5", "SubWindow{Limit: 10, Window: time.Second, Buckets: 5}", ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 5}},
		{"sub/50", "sub-window k=50", "SubWindow{Limit: 10, Window: time.Second, Buckets: 50}", ratelimit.SubWindow{Limit: 10, Window: time.Second, Buckets: 50}},
	}
}

// perMinute100 is "100 per minute" in each of the seven algorithms, the
// sub-window counter with 6 and 60 buckets.
func perMinute100() []contender {
	r := ratelimit.PerMinute(100)
	return []contender{
		{"token", "token bucket", "TokenBucket{Rate: PerMinute(100), Burst: 100}", ratelimit.TokenBucket{Rate: r, Burst: 100}},
		{"GCRA", "GCRA", "GCRA{Rate: PerMinute(100), Burst: 100}", ratelimit.GCRA{Rate: r, Burst: 100}},
		{"leaky", "leaky bucket", "LeakyBucket{Rate: PerMinute(100), Capacity: 100}", ratelimit.LeakyBucket{Rate: r, Capacity: 100}},
		{"fixed", "fixed window", "FixedWindow{Limit: 100, Window: time.Minute}", ratelimit.FixedWindow{Limit: 100, Window: time.Minute}},
		{"log", "sliding log", "SlidingLog{Limit: 100, Window: time.Minute}", ratelimit.SlidingLog{Limit: 100, Window: time.Minute}},
		{"counter", "sliding counter", "SlidingCounter{Limit: 100, Window: time.Minute}", ratelimit.SlidingCounter{Limit: 100, Window: time.Minute}},
		{"sub/6", "sub-window k=6", "SubWindow{Limit: 100, Window: time.Minute, Buckets: 6}", ratelimit.SubWindow{Limit: 100, Window: time.Minute, Buckets: 6}},
		{"sub/60", "sub-window k=60", "SubWindow{Limit: 100, Window: time.Minute, Buckets: 60}", ratelimit.SubWindow{Limit: 100, Window: time.Minute, Buckets: 60}},
	}
}

// outcome is what one limiter did with a stream of requests.
type outcome struct {
	admitted []time.Duration // when each admitted request was checked
	goesOn   []time.Duration // when each admitted request may go on: checked + Delay
	refused  int
	maxDelay time.Duration // the longest Delay (leaky bucket only)
	maxRetry time.Duration // the longest RetryAfter told to a refused request
	// allowed[i] and after[i] are the decision on the i-th request: whether
	// it was admitted, and its ResetAfter (for a bucket, how much allowance
	// it misses right after that decision).
	allowed []bool
	after   []time.Duration
}

// simulate sends every request in arrivals (sorted, one unit each) to a
// fresh limiter for each contender, all reading one ManualClock that jumps
// from arrival to arrival.
func simulate(cs []contender, arrivals []time.Duration) ([]outcome, error) {
	clk := ratelimit.NewManualClock(0)
	lims := make([]ratelimit.Limiter, len(cs))
	for i, c := range cs {
		lim, err := ratelimit.New(c.rule, ratelimit.WithClock(clk))
		if err != nil {
			return nil, err
		}
		lims[i] = lim
	}
	out := make([]outcome, len(cs))
	for _, t := range arrivals {
		clk.Set(t)
		for i, lim := range lims {
			d, err := lim.Check(ratelimit.Unit)
			if err != nil {
				return nil, err
			}
			o := &out[i]
			o.allowed = append(o.allowed, d.Allowed)
			o.after = append(o.after, d.ResetAfter)
			if d.Allowed {
				o.admitted = append(o.admitted, t)
				o.goesOn = append(o.goesOn, t+d.Delay)
				o.maxDelay = max(o.maxDelay, d.Delay)
			} else {
				o.refused++
				o.maxRetry = max(o.maxRetry, d.RetryAfter)
			}
		}
	}
	return out, nil
}

// busiest returns the most instants of ts (sorted) inside any window
// (x-w, x] of length w. The most crowded window ends at one of the
// instants, so only those are tried.
func busiest(ts []time.Duration, w time.Duration) int {
	most, lo := 0, 0
	for hi, t := range ts {
		for ts[lo] <= t-w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// perBin counts the instants of ts in each bin [k*bin, (k+1)*bin) for
// k < n; later instants are left out.
func perBin(ts []time.Duration, bin time.Duration, n int) []int {
	counts := make([]int, n)
	for _, t := range ts {
		if k := int(t / bin); k < n {
			counts[k]++
		}
	}
	return counts
}

// upTo draws a duration in [0, d).
func upTo(rng *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(d)))
}

// event is a stretch of the traffic worth pointing at.
type event struct {
	name, short string
	from, to    time.Duration
}

// Length of the first scenario.
const burstySpan = 20 * time.Second

// burstyTraffic returns 20 s of arrivals: light background traffic all the
// way through, a burst, two clusters either side of a window edge, and a
// sustained overload. Only integer draws are used, so the traffic is the
// same on every platform.
func burstyTraffic(seed uint64) ([]time.Duration, []event) {
	rng := rand.New(rand.NewPCG(seed, 0x706c6179)) // "play"
	ms := time.Millisecond
	var ts []time.Duration
	// Background: gaps of 50 to 550 ms, about 3.3 requests a second.
	for t := upTo(rng, 500*ms); t < burstySpan; t += 50*ms + upTo(rng, 500*ms) {
		ts = append(ts, t)
	}
	events := []event{
		{"a burst: 40 requests in 0.2 s", "burst", 3 * time.Second, 3200 * ms},
		{"10 requests either side of a window edge", "window edge", 7800 * ms, 8200 * ms},
		{"an overload: about 25 a second for 5 s", "overload", 12 * time.Second, 17 * time.Second},
	}
	for i := range 40 {
		ts = append(ts, 3*time.Second+time.Duration(i)*5*ms)
	}
	for i := range 20 { // 7.80, 7.82, ..., 7.98 s, then 8.00, ..., 8.18 s
		ts = append(ts, 7800*ms+time.Duration(i)*20*ms)
	}
	// Overload: gaps of 20 to 60 ms.
	for t := 12 * time.Second; t < 17*time.Second; t += 20*ms + upTo(rng, 40*ms) {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts, events
}

// Length of the second scenario.
const hour = time.Hour

// shape is one kind of traffic for the hour-long comparison.
type shape struct {
	name, about string
	arrivals    []time.Duration
}

// hourShapes returns an hour of each kind of traffic, to be sent against
// 100 per minute.
func hourShapes(seed uint64) []shape {
	rng := rand.New(rand.NewPCG(seed, 0x686f7572)) // "hour"
	ms := time.Millisecond
	var steady, bursty, edges, lateBurst []time.Duration

	// Steady: gaps of 0 to 800 ms, about 150 a minute, half again the limit.
	for t := upTo(rng, 800*ms); t < hour; t += upTo(rng, 800*ms) {
		steady = append(steady, t)
	}

	// Bursty: a trickle (gaps of 1 to 5 s) and, every 20 to 120 s, a burst
	// of 30 to 150 requests within 2 s.
	for t := upTo(rng, 5*time.Second); t < hour; t += time.Second + upTo(rng, 4*time.Second) {
		bursty = append(bursty, t)
	}
	for t := upTo(rng, 60*time.Second); t < hour; t += 20*time.Second + upTo(rng, 100*time.Second) {
		n := 30 + rng.IntN(121)
		for range n {
			if u := t + upTo(rng, 2*time.Second); u < hour {
				bursty = append(bursty, u)
			}
		}
	}
	slices.Sort(bursty)

	// Edge pairs: every other minute boundary, 100 requests in the second
	// before it and 100 in the second after it, the fixed window's worst case.
	for b := time.Minute; b < hour; b += 2 * time.Minute {
		for i := range 100 {
			edges = append(edges, b-time.Second+time.Duration(i)*10*ms)
		}
		for i := range 100 {
			edges = append(edges, b+time.Duration(i)*10*ms)
		}
	}

	// Late burst, then a trickle: every other minute, 100 requests in its
	// last second, then one every 500 ms through the next minute, the
	// sliding counter's worst case (it assumes last minute's 100 were spread
	// evenly, so it lets the trickle through while they still count).
	for m := time.Duration(0); m < hour; m += 2 * time.Minute {
		end := m + time.Minute
		for i := range 100 {
			lateBurst = append(lateBurst, end-time.Second+time.Duration(i)*10*ms)
		}
		for t := end; t < end+time.Minute; t += 500 * ms {
			lateBurst = append(lateBurst, t)
		}
	}

	return []shape{
		{"steady", "about 150/min, evenly spread", steady},
		{"bursty", "a trickle plus bursts of 30-150", bursty},
		{"edge pairs", "every 2 min: 100 in the 1 s before a minute boundary, 100 in the 1 s after", edges},
		{"late burst", "every 2 min: 100 in a minute's last second, then 2/s for a minute", lateBurst},
	}
}

// designVector is the example from the design: 200 requests, 10 a second
// from 50 s to 70 s, against 100 per minute.
func designVector() []time.Duration {
	ts := make([]time.Duration, 200)
	for i := range ts {
		ts[i] = 50*time.Second + time.Duration(i)*100*time.Millisecond
	}
	return ts
}
