package ratelimit_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// slowdownTrace is an open-loop load against an adaptive WorkerShedder on
// a ManualClock: every tick, critical and default requests arrive at fixed
// rates, and sheddable ones as long as they are admitted (so that the
// least important class is refused every tick); an admitted request
// completes after the latency in force when it was admitted (no queueing:
// a pure delay). The latency is base, then factor times base for slowFor
// windows, then base again.
type slowdownTrace struct {
	shares            [2]int // default's and sheddable's (critical: 100)
	start, min, max   int64
	queue             int64
	smoothing         int
	tolerance         int
	critical, def     int // requests arriving each tick
	base              time.Duration
	factor            int
	before, slowFor   int // windows
	tick, window      time.Duration
	maxAfter          int // windows run after the slowdown, at most
	attemptsEachTick  int // bound on the sheddable requests tried a tick
	stopWhenRecovered bool
}

// slowdownResult is what a run of a slowdownTrace saw.
type slowdownResult struct {
	limits []int64 // the limit at the end of each window
	before int64   // the limit when the slowdown started
	low    int64   // the limit once the slow requests had all completed
	// recovered is how many windows after the slow requests had all
	// completed the limit was back to before (-1: not within maxAfter).
	recovered int
	drained   int // the window at which the slow requests had all completed
}

func (tr slowdownTrace) run(t require.TestingT) slowdownResult {
	clk := ratelimit.NewManualClock(0)
	classes := []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: tr.shares[0]}, {Name: "sheddable", Share: tr.shares[1]}}
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: tr.start, Classes: classes,
		Adaptive: &ratelimit.Gradient{MinLimit: tr.min, MaxLimit: tr.max, Window: tr.window, Queue: tr.queue,
			Smoothing: tr.smoothing, Tolerance: tr.tolerance}}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	type held struct {
		due time.Duration
		rel ratelimit.Release
	}
	var inFlight []held
	ctx := context.Background()
	admit := func(p ratelimit.Priority, latency time.Duration) bool {
		rel, d, err := s.Admit(ctx, p)
		require.NoError(t, err)
		if d.Allowed {
			inFlight = append(inFlight, held{clk.Now() + latency, rel})
		}
		return d.Allowed
	}
	res := slowdownResult{recovered: -1, drained: -1}
	ticks := int(tr.window / tr.tick)
	slowFrom, slowTo := tr.before, tr.before+tr.slowFor
	var lastSlowDue time.Duration
	for w := 0; w < slowTo+tr.maxAfter; w++ {
		if w == slowFrom {
			res.before = s.Limit()
		}
		latency := tr.base
		if w >= slowFrom && w < slowTo {
			latency *= time.Duration(tr.factor)
		}
		for range ticks {
			now := clk.Advance(tr.tick)
			// Complete what is due, then take this tick's arrivals.
			inFlight = slices.DeleteFunc(inFlight, func(h held) bool {
				if h.due <= now {
					h.rel()
					return true
				}
				return false
			})
			for range tr.critical {
				admit(0, latency)
			}
			for range tr.def {
				admit(1, latency)
			}
			for range tr.attemptsEachTick {
				if !admit(2, latency) {
					break
				}
			}
			if latency != tr.base {
				lastSlowDue = now + latency
			}
		}
		lim := s.Limit()
		require.GreaterOrEqual(t, lim, tr.min, "window %d: below MinLimit", w)
		require.LessOrEqual(t, lim, tr.max, "window %d: above MaxLimit", w)
		res.limits = append(res.limits, lim)
		if w >= slowTo && res.drained < 0 && clk.Now() >= lastSlowDue+tr.window {
			// The window that ended now saw no slow request complete.
			res.drained, res.low = w, lim
		}
		if res.drained >= 0 && res.recovered < 0 && lim >= res.before {
			res.recovered = w - res.drained
			if tr.stopWhenRecovered {
				break
			}
		}
	}
	return res
}

// recoveryBound is how many windows the limit may take to climb from low
// back to before once latency is at its baseline: growing by Queue ×
// Smoothing a window, plus one for rounding.
func (tr slowdownTrace) recoveryBound(before, low int64) int {
	if low >= before {
		return 0
	}
	step := tr.queue * int64(tr.smoothing) // thousandths of a request
	return int(((before-low)*1000+step-1)/step) + 1
}

// The trace the load tool's slowdown runs resemble: a too-high start of
// 32, shares 50/30, critical and default traffic that alone keeps the work
// in progress well under half of the limit, five times slower for 40
// windows. The limit, brought down by the slowdown, must climb back to
// where it was: while the shedder refuses work it is the limit that holds
// traffic back, whatever the work in progress.
func TestGradientRecoversAfterSlowdown(t *testing.T) {
	tests := []struct {
		name string
		tr   slowdownTrace
	}{
		{"shares 50/30 from 32", slowdownTrace{shares: [2]int{50, 30}, start: 32, min: 4, max: 320, queue: 4, smoothing: 20, tolerance: 150,
			critical: 1, def: 0, base: 50 * time.Millisecond, factor: 5, before: 20, slowFor: 40}},
		{"shares 90/70 from 20", slowdownTrace{shares: [2]int{90, 70}, start: 20, min: 2, max: 200, queue: 4, smoothing: 20, tolerance: 150,
			critical: 0, def: 1, base: 30 * time.Millisecond, factor: 5, before: 30, slowFor: 20}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := tc.tr
			tr.tick, tr.window, tr.maxAfter, tr.attemptsEachTick = 10*time.Millisecond, 250*time.Millisecond, 600, 1000
			res := tr.run(t)
			t.Log(runs(res.limits))
			require.Less(t, res.low, res.before, "the slowdown brings the limit down")
			bound := tr.recoveryBound(res.before, res.low)
			require.GreaterOrEqual(t, res.recovered, 0, "the limit never came back to %d (low %d)", res.before, res.low)
			assert.LessOrEqual(t, res.recovered, bound, "back to %d from %d", res.before, res.low)
		})
	}
}

// Properties of the adaptive limit over drawn slowdown traces: it never
// leaves [MinLimit, MaxLimit]; the same trace moves it the same way; and
// once the slow requests have completed, with the least important class
// still refused, it is back to its level before the slowdown within the
// windows that growing by Queue × Smoothing a window takes.
func TestGradientSlowdownProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		def := rapid.IntRange(40, 100).Draw(t, "defaultShare")
		shed := rapid.IntRange(20, def).Draw(t, "sheddableShare")
		minLimit := rapid.Int64Range((100+int64(shed)-1)/int64(shed), 10).Draw(t, "minLimit")
		maxLimit := rapid.Int64Range(max(minLimit, 10), 60).Draw(t, "maxLimit")
		tr := slowdownTrace{
			shares:            [2]int{def, shed},
			min:               minLimit,
			max:               maxLimit,
			start:             rapid.Int64Range(minLimit, maxLimit).Draw(t, "start"),
			queue:             rapid.Int64Range(1, 8).Draw(t, "queue"),
			smoothing:         rapid.IntRange(5, 100).Draw(t, "smoothing"),
			tolerance:         rapid.IntRange(110, 300).Draw(t, "tolerance"),
			critical:          rapid.IntRange(0, 2).Draw(t, "criticalEachTick"),
			def:               rapid.IntRange(0, 2).Draw(t, "defaultEachTick"),
			base:              time.Duration(rapid.IntRange(2, 8).Draw(t, "baseTicks")) * 10 * time.Millisecond,
			factor:            rapid.IntRange(2, 8).Draw(t, "factor"),
			before:            rapid.IntRange(1, 40).Draw(t, "windowsBefore"),
			slowFor:           rapid.IntRange(1, 40).Draw(t, "slowWindows"),
			tick:              10 * time.Millisecond,
			window:            100 * time.Millisecond,
			attemptsEachTick:  10_000,
			stopWhenRecovered: true,
		}
		// Enough windows to drain and to climb from MinLimit to MaxLimit.
		tr.maxAfter = 20 + tr.recoveryBound(maxLimit, minLimit)
		res := tr.run(t)
		again := tr.run(t)
		if !slices.Equal(res.limits, again.limits) {
			t.Fatalf("the same trace moved the limit differently:\n%s\n%s", runs(res.limits), runs(again.limits))
		}
		if res.drained < 0 {
			t.Fatalf("the slow requests never completed: %s", runs(res.limits))
		}
		bound := tr.recoveryBound(res.before, res.low)
		if res.recovered < 0 || res.recovered > bound {
			t.Fatalf("limit %d before the slowdown, %d after it, back after %d windows (bound %d): %v",
				res.before, res.low, res.recovered, bound, runs(res.limits))
		}
	})
}

// runs writes limits with each run of equal values as value×count.
func runs(limits []int64) string {
	var b strings.Builder
	for i := 0; i < len(limits); {
		j := i
		for j < len(limits) && limits[j] == limits[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatInt(limits[i], 10))
		if j-i > 1 {
			b.WriteString("×" + strconv.Itoa(j-i))
		}
		i = j
	}
	return b.String()
}

// workerQueue is a model of examples/server's GET /work behind an adaptive
// WorkerShedder on a ManualClock: requests admitted wait in a FIFO queue
// for one of workers, each holding it for service × the slowdown factor in
// force when it starts, and a request that waited timeout gives up (and is
// lost). One request arrives each tick, its class from a fixed mix of 10%
// critical, 60% default and 30% sheddable.
type workerQueue struct {
	workers          int
	service, timeout time.Duration
	tick             time.Duration
	slowAt, slowTo   time.Duration
	factor           int
	end              time.Duration
}

// queueRun is what a workerQueue run saw, by second: the share of each
// second's arrivals answered (admitted and served in time), and the limit
// at the end of each second.
type queueRun struct {
	ok     []float64
	limits []int64
}

func (q workerQueue) run(t *testing.T, rule ratelimit.WorkerLimit) queueRun {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(rule, ratelimit.WithClock(clk))
	require.NoError(t, err)
	type req struct {
		arrived, due time.Duration
		rel          ratelimit.Release
	}
	mix := []ratelimit.Priority{1, 2, 1, 0, 1, 2, 1, 1, 2, 1}
	var queue, serving []req
	var run queueRun
	var offered, answered int
	ctx := context.Background()
	for i := 0; ; i++ {
		now := clk.Advance(q.tick)
		if now > q.end {
			break
		}
		serving = slices.DeleteFunc(serving, func(r req) bool {
			if r.due <= now {
				r.rel()
				answered++
				return true
			}
			return false
		})
		queue = slices.DeleteFunc(queue, func(r req) bool {
			if now-r.arrived >= q.timeout {
				r.rel()
				return true
			}
			return false
		})
		for len(serving) < q.workers && len(queue) > 0 {
			r := queue[0]
			queue = queue[1:]
			cost := q.service
			if now >= q.slowAt && now < q.slowTo {
				cost *= time.Duration(q.factor)
			}
			r.due = now + cost
			serving = append(serving, r)
		}
		offered++
		rel, d, err := s.Admit(ctx, mix[i%len(mix)])
		require.NoError(t, err)
		if d.Allowed {
			queue = append(queue, req{arrived: now, rel: rel})
		}
		if now%time.Second == 0 {
			run.ok = append(run.ok, float64(answered)/float64(offered))
			run.limits = append(run.limits, s.Limit())
			offered, answered = 0, 0
		}
	}
	return run
}

// The load tool's slowdown run, as a model: 8 workers of 50 ms offered
// their capacity, shares 50/30, the adaptive limit from 32 in windows of
// 250 ms, five times slower from 5 s to 15 s. Within 5 s of the end of the
// slowdown, the share of requests answered is back to what it was before.
func TestGradientWorkerQueueSlowdown(t *testing.T) {
	q := workerQueue{workers: 8, service: 50 * time.Millisecond, timeout: 2 * time.Second, tick: 6250 * time.Microsecond,
		slowAt: 5 * time.Second, slowTo: 15 * time.Second, factor: 5, end: 25 * time.Second}
	classes := []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: 50}, {Name: "sheddable", Share: 30}}
	run := q.run(t, ratelimit.WorkerLimit{Limit: 32, Classes: classes,
		Adaptive: &ratelimit.Gradient{MaxLimit: 320, Window: 250 * time.Millisecond}})
	t.Logf("answered by second %.2f", run.ok)
	t.Logf("limit by second %v", run.limits)
	mean := func(xs []float64) float64 {
		sum := 0.0
		for _, x := range xs {
			sum += x
		}
		return sum / float64(len(xs))
	}
	baseline := mean(run.ok[1:5]) // the first second fills the queue
	require.Less(t, mean(run.ok[6:15]), baseline/2, "the slowdown costs most requests")
	for sec := 20; sec < len(run.ok); sec++ {
		assert.GreaterOrEqual(t, run.ok[sec], baseline-0.05, "second %d: 5 s after the slowdown, the share answered is back to the baseline's", sec)
	}
}
