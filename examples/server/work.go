package main

import (
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// GET /work is a route whose cost grows with concurrency, behind a load
// shedder: each request needs one of -work-workers workers for
// -work-cost, and waits for a free one, so that past the workers' capacity
// requests queue and everyone's latency grows. A WorkerShedder refuses the
// least important requests first as the work in progress nears its limit
// (-shed fixed: -shed-limit; -shed adaptive: a Gradient limit starting
// there; -shed off: none), answering them 503 with Retry-After.
//
// Requests are in class "default" unless -priority-header names a header
// that a gateway in front of the server sets (to critical, default or
// sheddable) and strips from what clients send: the server believes it.
// -work-control adds POST /work/slow?factor=N, which makes every request
// take N times -work-cost from then on (N=1 restores it), for the load
// tool's slowdown runs.

// workConfig is the flags of GET /work.
type workConfig struct {
	workers int
	cost    time.Duration
	shed    string
	limit   int64
	window  time.Duration
	header  string
	control bool
	shares  string
}

// workFlags declares the flags of GET /work on fs.
func workFlags(fs *flag.FlagSet) *workConfig {
	c := &workConfig{}
	fs.IntVar(&c.workers, "work-workers", 4, "`workers` of GET /work: requests served at once")
	fs.DurationVar(&c.cost, "work-cost", 20*time.Millisecond, "how long a GET /work request holds a worker")
	fs.StringVar(&c.shed, "shed", "fixed", "load shedder of GET /work: fixed, adaptive or off")
	fs.Int64Var(&c.limit, "shed-limit", 0, "`requests` in progress at which GET /work sheds critical ones (0: 1.25 x -work-workers, at least one more); where an adaptive limit starts")
	fs.DurationVar(&c.window, "shed-window", time.Second, "how long an adaptive limit gathers latencies before it moves")
	fs.StringVar(&c.header, "priority-header", "", "`header` a trusted gateway sets to a request's class (critical, default, sheddable); none: every request is default")
	fs.StringVar(&c.shares, "shed-shares", "90,70", "`default,sheddable`: the percentages of the limit up to which the work in progress may rise for each class to be admitted (critical: 100)")
	fs.BoolVar(&c.control, "work-control", false, "add POST /work/slow?factor=N, which slows GET /work N times")
	return c
}

// work is GET /work's workers.
type work struct {
	workers chan struct{}
	cost    time.Duration
	factor  atomic.Int64
}

// mountWork adds GET /work (and POST /work/slow) to a's mux, and lists them
// with the routes of set.
func (a *api) mountWork(c *workConfig, set ratelimit.PlanSet) error {
	if c.workers < 1 {
		return fmt.Errorf("-work-workers must be at least 1, got %d", c.workers)
	}
	if c.cost <= 0 {
		return fmt.Errorf("-work-cost must be positive, got %v", c.cost)
	}
	limit := c.limit
	if limit == 0 {
		limit = int64(c.workers) + max(1, int64(c.workers)/4)
	}
	wk := &work{workers: make(chan struct{}, c.workers), cost: c.cost}
	wk.factor.Store(1)
	var h http.Handler = http.HandlerFunc(wk.serve)
	desc := fmt.Sprintf("%d workers, %v each; ", c.workers, c.cost)
	var def, low int
	if _, err := fmt.Sscanf(c.shares, "%d,%d", &def, &low); err != nil {
		return fmt.Errorf("-shed-shares must be two percentages, such as 90,70: %w", err)
	}
	classes := []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: def}, {Name: "sheddable", Share: low}}
	rule := ratelimit.WorkerLimit{Limit: limit, Classes: classes, Name: "work"}
	switch c.shed {
	case "off":
		desc += "no shedder"
	case "fixed", "adaptive":
		if c.shed == "adaptive" {
			rule.Adaptive = &ratelimit.Gradient{MaxLimit: 10 * limit, Window: c.window}
		}
		shed, err := ratelimit.NewWorkerShedder(rule)
		if err != nil {
			return fmt.Errorf("-shed-limit, -shed-shares: %w", err)
		}
		classOf := httplimit.FixedClass(1) // default
		if c.header != "" {
			classOf = httplimit.TrustedClassHeader(c.header, shed, 1)
		}
		h = httplimit.Shed(shed, classOf)(h)
		desc += fmt.Sprintf("shed (%s limit %d in progress): sheddable from %d%%, default from %d%%, critical at 100%%; 503 when shed", c.shed, limit, low, def)
	default:
		return fmt.Errorf("-shed must be fixed, adaptive or off, got %q", c.shed)
	}
	a.mux.Handle("GET /work", h)
	a.more = append(a.more, route{Route: "GET /work", Limit: desc})
	if c.control {
		a.mux.HandleFunc("POST /work/slow", func(w http.ResponseWriter, r *http.Request) {
			f, err := strconv.ParseInt(r.URL.Query().Get("factor"), 10, 64)
			if err != nil || f < 1 || f > 1000 {
				http.Error(w, "factor must be an integer from 1 to 1000", http.StatusBadRequest)
				return
			}
			wk.factor.Store(f)
			reply(w, map[string]any{"factor": f})
		})
		a.more = append(a.more, route{Route: "POST /work/slow", Limit: "none: slows GET /work by ?factor"})
	}
	a.table.Store(a.routes(set))
	return nil
}

// serve waits for a worker, holds it for the cost, and answers; a request
// whose client goes away gives up its place in the queue or its worker.
func (wk *work) serve(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	select {
	case wk.workers <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-wk.workers }()
	t := time.NewTimer(wk.cost * time.Duration(wk.factor.Load()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return
	}
	reply(w, map[string]any{"done": true})
}
