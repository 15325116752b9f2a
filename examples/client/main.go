// Command client paces outbound calls: a partner's API allows 100 requests
// a minute, and 20 workers share one limiter, each calling Wait before every
// request, so that together they never send more than the partner allows.
//
// The limiter is a leaky bucket at the partner's rate, with room in its
// queue for every worker and the call going out. Wait puts the request in
// the queue at once and sleeps until its turn, so each worker wakes exactly
// once per call (a full queue would make it sleep and try again), the
// workers take turns in the order they asked, and calls leave exactly 600 ms
// apart: at most 100 in any minute, with no burst at the start. (A token
// bucket or GCRA would let a burst through first, and would wake every
// waiting worker each time a request's worth of allowance came back.)
//
// By default it runs on virtual time: ten minutes of calls take well
// under a second, and the partner is simulated by the same library (a sliding
// log of 100 per minute on the same clock) counting what it would refuse.
// With -real it runs on the system clock for -duration; give it a smaller
// period to see it work in seconds:
//
//	go run ./examples/client
//	go run ./examples/client -real -limit 20 -per 1s -duration 5s -margin 0.05
//
// On a real clock and a real network, calls leave and arrive with some
// jitter: a call that goes out late, followed by one on time, can put one
// call too many in a window the partner counts. Pace a little below the
// partner's limit (-margin 0.05) so that the jitter would have to exceed a
// twentieth of the period to matter.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/ratekit/ratelimit"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	workers  int
	limit    int64         // the partner's limit ...
	per      time.Duration // ... per this period
	duration time.Duration
	real     bool
	margin   float64 // fraction of the limit to keep in reserve
}

// result is what a run did.
type result struct {
	calls     []time.Duration // when each call left, on the run's clock
	refused   int             // calls the partner would have refused
	perWorker []int
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg config
	fs.IntVar(&cfg.workers, "workers", 20, "workers sharing the limiter")
	fs.Int64Var(&cfg.limit, "limit", 100, "requests the partner allows ...")
	fs.DurationVar(&cfg.per, "per", time.Minute, "... per this period")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Minute, "how long to run (virtual time unless -real)")
	fs.BoolVar(&cfg.real, "real", false, "run on the system clock instead of virtual time")
	fs.Float64Var(&cfg.margin, "margin", 0, "fraction of the limit to leave unused, such as 0.02")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.workers < 1 || cfg.limit < 1 || cfg.per <= 0 || cfg.duration <= 0 || cfg.margin < 0 || cfg.margin >= 1 {
		return errors.New("workers, limit, per and duration must be positive, and margin in [0, 1)")
	}
	res, err := simulate(ctx, cfg)
	if err != nil {
		return err
	}
	report(out, cfg, res)
	return nil
}

// pacer is the limiter the workers share: a leaky bucket at the partner's
// rate (less the margin), with a queue slot for every worker and one for
// the call going out (as NGINX's burst=b is a capacity of b+1), so that no
// worker ever finds the queue full.
func pacer(cfg config, clk ratelimit.Clock) (ratelimit.Limiter, error) {
	// limit x (1 - margin) per period, kept exact in thousandths of a
	// request: Rate is a fraction, never a float.
	count := cfg.limit * 1000
	if cfg.margin > 0 {
		count = int64(float64(count) * (1 - cfg.margin))
	}
	return ratelimit.New(ratelimit.LeakyBucket{
		Rate:     ratelimit.Rate{Count: count, Per: cfg.per * 1000},
		Capacity: int64(cfg.workers) + 1,
		Name:     "partner-pacing",
	}, ratelimit.WithClock(clk))
}

// partner stands for the partner's API: it counts calls with its own limit
// of cfg.limit per cfg.per (a sliding log: the strictest reading of "100 a
// minute") on the same clock, and records when each call arrived.
type partner struct {
	mu      sync.Mutex
	lim     ratelimit.Limiter
	clk     ratelimit.Clock
	calls   []time.Duration
	refused int
}

func (p *partner) call() {
	d, err := p.lim.Check(ratelimit.Unit)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, p.clk.Now())
	if err != nil || !d.Allowed {
		p.refused++
	}
}

// simulate runs the workers for cfg.duration, on virtual time unless
// cfg.real.
func simulate(ctx context.Context, cfg config) (result, error) {
	var clk ratelimit.Clock = ratelimit.SystemClock()
	var manual *ratelimit.ManualClock
	if !cfg.real {
		manual = ratelimit.NewManualClock(0)
		clk = manual
	}
	start := clk.Now()
	lim, err := pacer(cfg, clk)
	if err != nil {
		return result{}, err
	}
	plim, err := ratelimit.New(ratelimit.SlidingLog{Limit: cfg.limit, Window: cfg.per, Name: "partner"}, ratelimit.WithClock(clk))
	if err != nil {
		return result{}, err
	}
	p := &partner{lim: plim, clk: clk}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if cfg.real {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	perWorker := make([]int, cfg.workers)
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := lim.Wait(ctx, ratelimit.Unit); err != nil {
					return // the run is over
				}
				p.call()
				perWorker[w]++
			}
		}()
		if manual != nil {
			// On virtual time, let each worker join the queue before the
			// next starts, so that every run goes the same way.
			if err := manual.BlockUntilSleepers(ctx, w+1); err != nil {
				return result{}, err
			}
		}
	}
	if manual == nil {
		<-ctx.Done()
	} else {
		// Virtual time: whenever every worker is asleep in Wait, move the
		// clock to the next wake-up, until the run's time is up.
		end := start + cfg.duration
		for {
			if err := manual.BlockUntilSleepers(ctx, cfg.workers); err != nil {
				return result{}, err
			}
			next, _ := manual.NextWake()
			if next >= end {
				break
			}
			manual.Set(next)
		}
	}
	stop()
	wg.Wait()

	res := result{refused: p.refused, perWorker: perWorker}
	for _, at := range p.calls {
		res.calls = append(res.calls, at-start)
	}
	sort.Slice(res.calls, func(i, j int) bool { return res.calls[i] < res.calls[j] })
	return res, nil
}

// busiest returns the most calls in any window (t-per, t].
func busiest(calls []time.Duration, per time.Duration) int {
	most, first := 0, 0
	for i, at := range calls {
		for calls[first] <= at-per {
			first++
		}
		most = max(most, i-first+1)
	}
	return most
}

func report(out io.Writer, cfg config, res result) {
	clock := "virtual time"
	if cfg.real {
		clock = "the system clock"
	}
	fmt.Fprintf(out, "%d workers, partner limit %d per %v, %v on %s\n", cfg.workers, cfg.limit, cfg.per, cfg.duration, clock)
	fmt.Fprintf(out, "calls made: %d, refused by the partner: %d\n", len(res.calls), res.refused)
	fmt.Fprintf(out, "busiest %v window: %d calls (the partner allows %d)\n", cfg.per, busiest(res.calls, cfg.per), cfg.limit)
	lo, hi := res.perWorker[0], res.perWorker[0]
	for _, n := range res.perWorker {
		lo, hi = min(lo, n), max(hi, n)
	}
	fmt.Fprintf(out, "calls per worker: %d to %d\n", lo, hi)
	fmt.Fprint(out, "calls per period:")
	counts := make([]int, (cfg.duration+cfg.per-1)/cfg.per)
	for _, at := range res.calls {
		if i := int(at / cfg.per); i < len(counts) {
			counts[i]++
		}
	}
	for _, n := range counts {
		fmt.Fprintf(out, " %d", n)
	}
	fmt.Fprintln(out)
}
