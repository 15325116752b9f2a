// Command shedload measures the load shedder of examples/server under real
// HTTP traffic, and writes docs/shedding-load.md (figures, goals, conditions)
// and docs/shedding-load.txt (every run's raw lines).
//
// It builds examples/server, and for each run starts one process of it on
// a free loopback port with GET /work (-work-workers workers, each request
// holding one for -work-cost, queueing for a free one), then offers it an
// open-loop stream of GET /work requests from this process at a constant
// rate: 1x, 2x and 4x the workers' capacity (workers / cost), each request
// in class critical, default or sheddable (10%, 60%, 30%, in a fixed
// shuffled order) through the X-Priority header, which the server is told
// to trust (-priority-header). Every run is bounded: -level seconds of
// sending, each request with a -timeout, and a fresh server.
//
// Runs, repeated -passes times with the shedder on and off alternating:
//
//   - levels: -shed fixed against -shed off at each load;
//   - slowdown: at 1x, the handler slows -slow-factor times for -slow-for
//     (POST /work/slow), -slow-at into the run, under a fixed limit, a
//     fixed limit set too high, and the adaptive (Gradient) limit starting
//     from that same too-high limit.
//
// Latency is measured from when a request was due to be sent, so a
// generator that falls behind shows it rather than hiding it.
//
// Usage (from bench/):
//
//	go run ./cmd/shedload [-out ../docs] [-passes 2] [-level 6s]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

var classes = []string{"critical", "default", "sheddable"}

type config struct {
	root, bin                       string
	workers                         int
	cost, level, timeout            time.Duration
	slowAt, slowFor, slowTail, binW time.Duration
	slowFactor, passes              int
	out                             string
}

func main() {
	var c config
	flag.IntVar(&c.workers, "workers", 8, "workers of GET /work")
	flag.DurationVar(&c.cost, "cost", 50*time.Millisecond, "how long a request holds a worker")
	flag.DurationVar(&c.level, "level", 6*time.Second, "how long each load level sends")
	flag.DurationVar(&c.timeout, "timeout", 2*time.Second, "each request's timeout")
	flag.DurationVar(&c.slowAt, "slow-at", 5*time.Second, "when the slowdown starts, into its run")
	flag.DurationVar(&c.slowFor, "slow-for", 10*time.Second, "how long the slowdown lasts")
	flag.DurationVar(&c.slowTail, "slow-tail", 10*time.Second, "how long the run goes on after it")
	flag.DurationVar(&c.binW, "bin", 250*time.Millisecond, "the bins recovery is judged in")
	flag.IntVar(&c.slowFactor, "slow-factor", 5, "how many times slower the handler gets")
	flag.IntVar(&c.passes, "passes", 2, "passes over the load levels")
	flag.StringVar(&c.out, "out", "../docs", "directory of shedding-load.md and shedding-load.txt")
	flag.Parse()
	if err := run(&c); err != nil {
		fmt.Fprintln(os.Stderr, "shedload:", err)
		os.Exit(1)
	}
}

// result is one request's outcome.
type result struct {
	class  int
	due    time.Duration // since the run started
	took   time.Duration // from due to the answer
	status int           // 0: no answer (timeout or error)
}

func run(c *config) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	c.root = root
	tmp, err := os.MkdirTemp("", "shedload")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	c.bin = filepath.Join(tmp, "server")
	build := exec.Command("go", "build", "-o", c.bin, "./examples/server")
	build.Dir = root
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building examples/server: %w", err)
	}

	var raw bytes.Buffer
	logf := func(format string, args ...any) {
		fmt.Fprintf(&raw, format+"\n", args...)
		fmt.Printf(format+"\n", args...)
	}
	capacity := float64(c.workers) / c.cost.Seconds()
	limit := c.workers + max(1, c.workers/4)
	logf("# shedload %s", time.Now().UTC().Format(time.RFC3339))
	logf("# %s/%s, %d CPUs, %s; load average %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadavg())
	logf("# GET /work: %d workers x %v = capacity %.0f/s; shed limit %d in progress; timeout %v; %v a level", c.workers, c.cost, capacity, limit, c.timeout, c.level)

	type levelRun struct {
		pass int
		mult int
		shed string
		rs   []result
	}
	var levels []levelRun
	for pass := 1; pass <= c.passes; pass++ {
		order := []string{"50/30", "90/70", "off"}
		if pass%2 == 0 {
			slices.Reverse(order)
		}
		for _, mult := range []int{1, 2, 4} {
			for _, shed := range order {
				args := []string{"-shed=off"}
				if shed != "off" {
					args = []string{"-shed=fixed", "-shed-shares=" + strings.ReplaceAll(shed, "/", ",")}
				}
				rs, err := c.attack(args[0], args[1:], capacity*float64(mult), c.level, nil)
				if err != nil {
					return err
				}
				levels = append(levels, levelRun{pass, mult, shed, rs})
				for _, line := range summarize(rs) {
					logf("level pass=%d load=%dx shed=%s %s", pass, mult, shed, line)
				}
			}
		}
		logf("# load average after pass %d: %s", pass, loadavg())
	}

	type slowRun struct {
		name string
		rs   []result
	}
	high := 4 * c.workers
	slowCfgs := []struct {
		name string
		args []string
	}{
		{fmt.Sprintf("fixed limit %d", limit), []string{"-shed=fixed", "-shed-shares=50,30"}},
		{fmt.Sprintf("fixed limit %d (too high)", high), []string{"-shed=fixed", "-shed-shares=50,30", fmt.Sprintf("-shed-limit=%d", high)}},
		{fmt.Sprintf("adaptive from %d", high), []string{"-shed=adaptive", "-shed-shares=50,30", fmt.Sprintf("-shed-limit=%d", high), "-shed-window=250ms"}},
	}
	var slows []slowRun
	for _, sc := range slowCfgs {
		total := c.slowAt + c.slowFor + c.slowTail
		rs, err := c.attack(sc.args[0], sc.args[1:], capacity, total, func(ctx context.Context, base string, start time.Time) {
			slow(ctx, base, start.Add(c.slowAt), c.slowFactor)
			slow(ctx, base, start.Add(c.slowAt+c.slowFor), 1)
		})
		if err != nil {
			return err
		}
		slows = append(slows, slowRun{sc.name, rs})
		for _, line := range summarize(rs) {
			logf("slowdown %q %s", sc.name, line)
		}
		for _, line := range timeline(rs, c.binW) {
			logf("slowdown %q %s", sc.name, line)
		}
	}
	logf("# load average at the end: %s", loadavg())

	// The document.
	var md bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&md, format+"\n", args...) }
	w("# Load shedding under HTTP load")
	w("")
	w("Generated by `go run ./cmd/shedload` (in `bench/`); raw output in [shedding-load.txt](shedding-load.txt). Measurements of one")
	w("shared machine on one run, not a benchmark of the library alone.")
	w("")
	w("**Setup.** One process of `examples/server` per run, on a loopback port. `GET /work` needs one of %d workers", c.workers)
	w("for %v (a sleep: the cost is waiting, not CPU), so it serves %.0f requests a second and queues the rest;", c.cost, capacity)
	w("the shedder (`ratelimit.WorkerShedder`, fixed limit of %d requests in progress, hysteresis 10 points) has classes", limit)
	w("critical 100%%, and default and sheddable at 90%% and 70%% (the shares of the example in the docs) or at 50%% and 30%%")
	w("(room for critical's own peak: at 4x, critical traffic alone is 40%% of capacity). An open-loop generator in this process sends `GET /work` at a constant")
	w("rate, each request's class in `X-Priority` (10%% critical, 60%% default, 30%% sheddable, in a fixed shuffled order),")
	w("which the server trusts because it was started with `-priority-header X-Priority`. Each request has a %v timeout;", c.timeout)
	w("latency runs from when the request was due, so a generator that falls behind counts against the figures.")
	w("Each level sends for %v against a fresh server; the %d passes run the three configurations in opposite orders.", c.level, c.passes)
	w("At 1x the workers are fully busy, so a shedder that refuses sheddable work from 70%% (or 30%%) of its limit")
	w("already sheds some there: it is a utilisation shedder, and 1x is full utilisation.")
	w("")
	w("**Machine.** %s/%s, %d CPUs, %s, shared with other work: load average %s at the start, %s at the end", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), firstLoad(raw.String()), loadavg())
	w("(every pass's is in the raw output). The passes show the noise: compare them row by row.")
	w("")
	w("## Load levels")
	w("")
	w("Success is the share of a class's requests answered 200; shed is the share answered 503. Latency is of the")
	w("admitted requests (200), all classes.")
	w("")
	w("| pass | load | shedder (default/sheddable shares) | critical ok | default ok | sheddable ok | critical shed | default shed | sheddable shed | p50 | p99 | p99.9 | max |")
	w("|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	p99at := map[[3]any]time.Duration{}
	var goals []string
	for _, l := range levels {
		s := stats(l.rs)
		w("| %d | %dx | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", l.pass, l.mult, l.shed,
			pct(s.ok[0], s.n[0]), pct(s.ok[1], s.n[1]), pct(s.ok[2], s.n[2]),
			pct(s.shed[0], s.n[0]), pct(s.shed[1], s.n[1]), pct(s.shed[2], s.n[2]),
			ms(s.q(0.5)), ms(s.q(0.99)), ms(s.q(0.999)), ms(s.q(1)))
		p99at[[3]any{l.pass, l.mult, l.shed}] = s.q(0.99)
		if l.shed != "off" {
			crit := float64(s.ok[0]) / float64(max(1, s.n[0]))
			goals = append(goals, fmt.Sprintf("shares %s, pass %d, %dx: critical success %s (goal >= 99%%: %s); shed order sheddable %s >= default %s >= critical %s (%s)",
				l.shed, l.pass, l.mult, pct(s.ok[0], s.n[0]), met(crit >= 0.99),
				pct(s.shed[2], s.n[2]), pct(s.shed[1], s.n[1]), pct(s.shed[0], s.n[0]),
				met(s.shed[0] == 0 && frac(s.shed[2], s.n[2]) >= frac(s.shed[1], s.n[1]))))
		}
	}
	w("")
	w("Goals (with the shedder):")
	w("")
	for _, g := range goals {
		w("- %s", g)
	}
	for _, shed := range []string{"90/70", "50/30"} {
		for pass := 1; pass <= c.passes; pass++ {
			a, b := p99at[[3]any{pass, 1, shed}], p99at[[3]any{pass, 4, shed}]
			na, nb := p99at[[3]any{pass, 1, "off"}], p99at[[3]any{pass, 4, "off"}]
			w("- shares %s, pass %d: admitted p99 at 4x %s = %.2f x its p99 at 1x %s (goal <= 2x: %s); without the shedder %s at 4x = %.1f x %s at 1x",
				shed, pass, ms(b), ratio(b, a), ms(a), met(ratio(b, a) <= 2), ms(nb), ratio(nb, na), ms(na))
		}
	}
	w("")
	w("## Slowdown: fixed against adaptive")
	w("")
	w("At 1x (%.0f/s), the handler becomes %d times slower from %v to %v into a %v run (`POST /work/slow`), so",
		capacity, c.slowFactor, c.slowAt, c.slowAt+c.slowFor, c.slowAt+c.slowFor+c.slowTail)
	w("capacity falls to a fifth and most requests must be refused. Three shedders, all with shares 50/30: the fixed limit above, a fixed limit")
	w("of %d (set too high for these workers: requests queue), and the adaptive limit (`Gradient`, 250 ms windows,", high)
	w("MaxLimit %d, other fields at their defaults) starting from %d. Lost is every request not answered 200", 10*high, high)
	w("(shed, timed out or failed); beyond baseline is what exceeds the share the same shedder lost before the")
	w("slowdown (at 1x a utilisation shedder already sheds some lower-class work, the tight fixed limit about half")
	w("of it, so it has less left to lose beyond that: compare the totals as well). Recovery is the time from the end of")
	w("the slowdown to the first %v bin that starts a second of bins all back to the baseline: for latency, admitted", c.binW)
	w("p99 within 1.5x of the baseline's (the median bin p99 before the slowdown, the first second left out); for")
	w("success, the share answered 200 within 5 points of the baseline's.")
	w("")
	w("| shedder | baseline p99 | baseline lost | lost during (crit/def/shed) | beyond baseline | lost after (crit/def/shed) | beyond baseline | p99 during | p99 after | latency recovered | success recovered |")
	w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, s := range slows {
		r := recovery(s.rs, c.slowAt, c.slowAt+c.slowFor, c.binW)
		w("| %s | %s | %.1f%% | %d (%d/%d/%d) | %d | %d (%d/%d/%d) | %d | %s | %s | %s | %s |", s.name, ms(r.baseP99), 100*r.baseLost,
			sum(r.lostDuring), r.lostDuring[0], r.lostDuring[1], r.lostDuring[2], r.extraDuring,
			sum(r.lostAfter), r.lostAfter[0], r.lostAfter[1], r.lostAfter[2], r.extraAfter,
			ms(r.p99During), ms(r.p99After), r.latency, r.success)
	}
	w("")
	w("The per-bin timelines (offered, ok, shed, admitted p99 for each %v) are in the raw output.", c.binW)
	w("")
	w("## Reading the figures")
	w("")
	w("- Shares are of all the work in progress. At 90/70, once default traffic fills the limit to 90%%, critical")
	w("  requests have only the last tenth of it; at 2x and 4x critical traffic alone is a fifth and two fifths of")
	w("  capacity, so some critical requests are refused, though far fewer than the other classes. At 50/30 half the")
	w("  limit is kept for critical work. `WorkerShedder`'s documentation gives the rule: keep room for the more")
	w("  important classes' own peak.")
	w("- A class of Share 100 is refused only while the whole limit is in progress. Lower-class requests admitted")
	w("  earlier are not taken back, so when latency spikes (these cores are shared) critical traffic's own peak can")
	w("  meet a full limit: that is where critical refusals at 50/30 come from, if a pass has any.")
	w("- Without a shedder every request waits for a worker: past 1x the queue grows for the whole level, latency")
	w("  runs into the client's timeout, and every class loses alike.")
	w("- A shed request still costs the server an HTTP exchange; at 4x on two shared cores that CPU shows in the")
	w("  admitted requests' tail, and more in some passes than others.")
	w("- The adaptive limit (`Gradient`) starts at the too-high fixed limit, comes down during the slowdown (toward")
	w("  2 x Queue at the least: the gradient is held at 1/2 or more), and afterwards climbs back by Queue x Smoothing")
	w("  a window for as long as it refuses requests and latency holds. A window in which it refused some class")
	w("  counts as one the limit held back, even with the work in progress under half the limit (which shares of")
	w("  50/30 keep it under), so its success comes back to its own baseline; how soon is the success recovery above.")
	w("- Queueing alone cannot make an admitted request wait more than about limit / workers services. A bin whose")
	w("  p99 is far above that outside the slowdown (look for them in the raw timelines) is a stall of the shared")
	w("  machine, and such stalls also decide some of the recovery times above: read them with the timelines.")
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "shedding-load.txt"), raw.Bytes(), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.out, "shedding-load.md"), md.Bytes(), 0o644)
}

// attack starts a server with -shed=... (shedArg) and extra, sends GET
// /work at rate a second for dur, running during (if not nil) alongside,
// and returns every request's result.
func (c *config) attack(shedArg string, extra []string, rate float64, dur time.Duration, during func(context.Context, string, time.Time)) ([]result, error) {
	args := append([]string{"-addr", "127.0.0.1:0", "-work-workers", fmt.Sprint(c.workers), "-work-cost", c.cost.String(),
		"-priority-header", "X-Priority", "-work-control", shedArg}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	addr, err := listening(stderr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	base := "http://" + addr

	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	order := classOrder()
	interval := time.Duration(float64(time.Second) / rate)
	n := int(dur / interval)
	results := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now()
	if during != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			during(ctx, base, start)
		}()
	}
	for i := 0; i < n; {
		now := time.Since(start)
		for ; i < n && time.Duration(i)*interval <= now; i++ {
			due := time.Duration(i) * interval
			class := order[i%len(order)]
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				results[i] = send(ctx, client, base, class, start, due, c.timeout)
			}(i)
		}
		time.Sleep(interval / 2)
	}
	wg.Wait()
	return results, nil
}

// send sends one request, due at start+due, and returns its result.
func send(ctx context.Context, client *http.Client, base string, class int, start time.Time, due, timeout time.Duration) result {
	r := result{class: class, due: due}
	ctx, cancel := context.WithDeadline(ctx, start.Add(due+timeout))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/work", nil)
	req.Header.Set("X-Priority", classes[class])
	resp, err := client.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.status = resp.StatusCode
	}
	r.took = time.Since(start) - due
	return r
}

// slow sets the handler's slowdown factor at the instant at.
func slow(ctx context.Context, base string, at time.Time, factor int) {
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
		return
	}
	resp, err := http.Post(fmt.Sprintf("%s/work/slow?factor=%d", base, factor), "text/plain", nil)
	if err == nil {
		resp.Body.Close()
	}
}

// classOrder is 100 classes, 10% critical, 60% default, 30% sheddable, in
// a fixed shuffled order.
func classOrder() []int {
	var o []int
	for i, n := range []int{10, 60, 30} {
		for range n {
			o = append(o, i)
		}
	}
	r := rand.New(rand.NewPCG(34, 1))
	r.Shuffle(len(o), func(i, j int) { o[i], o[j] = o[j], o[i] })
	return o
}

// listening reads the server's log until it says where it listens; if it
// does not, the error carries what it said.
func listening(r io.Reader, limit time.Duration) (string, error) {
	found := make(chan string, 1)
	var mu sync.Mutex
	var said []string
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			if i := strings.Index(line, "msg=listening addr="); i >= 0 {
				found <- strings.TrimSpace(line[i+len("msg=listening addr="):])
				break
			}
			mu.Lock()
			said = append(said, line)
			mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case a := <-found:
		return a, nil
	case <-time.After(limit):
		mu.Lock()
		defer mu.Unlock()
		return "", fmt.Errorf("the server did not say where it listens; it said:\n%s", strings.Join(said, "\n"))
	}
}

// summary is the outcome of a run by class.
type summary struct {
	n, ok, shed, lost [3]int
	lat               []time.Duration // admitted, sorted
}

func stats(rs []result) summary {
	var s summary
	for _, r := range rs {
		s.n[r.class]++
		switch r.status {
		case http.StatusOK:
			s.ok[r.class]++
			s.lat = append(s.lat, r.took)
		case http.StatusServiceUnavailable:
			s.shed[r.class]++
		default:
			s.lost[r.class]++
		}
	}
	slices.Sort(s.lat)
	return s
}

// q is the q-quantile of the admitted latencies (nearest rank).
func (s summary) q(q float64) time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	i := int(q*float64(len(s.lat))+0.999999) - 1
	return s.lat[min(max(i, 0), len(s.lat)-1)]
}

func summarize(rs []result) []string {
	s := stats(rs)
	var out []string
	for i, name := range classes {
		out = append(out, fmt.Sprintf("class=%s sent=%d ok=%d shed=%d lost=%d", name, s.n[i], s.ok[i], s.shed[i], s.lost[i]))
	}
	out = append(out, fmt.Sprintf("admitted=%d p50=%s p99=%s p99.9=%s max=%s", len(s.lat), ms(s.q(0.5)), ms(s.q(0.99)), ms(s.q(0.999)), ms(s.q(1))))
	return out
}

// timeline is a run in bins of width w, by due time.
func timeline(rs []result, w time.Duration) []string {
	var out []string
	for _, b := range bins(rs, w) {
		s := stats(b.rs)
		out = append(out, fmt.Sprintf("bin t=%s sent=%d ok=%d shed=%d lost=%d p99=%s", b.at, len(b.rs), s.ok[0]+s.ok[1]+s.ok[2],
			s.shed[0]+s.shed[1]+s.shed[2], s.lost[0]+s.lost[1]+s.lost[2], ms(s.q(0.99))))
	}
	return out
}

type bin struct {
	at time.Duration
	rs []result
}

func bins(rs []result, w time.Duration) []bin {
	var out []bin
	for _, r := range rs {
		k := int(r.due / w)
		for len(out) <= k {
			out = append(out, bin{at: time.Duration(len(out)) * w})
		}
		out[k].rs = append(out[k].rs, r)
	}
	return out
}

// slowResult is what a slowdown run is judged by.
type slowResult struct {
	baseP99, p99During, p99After time.Duration
	baseLost                     float64 // the share lost before the slowdown
	lostDuring, lostAfter        [3]int
	extraDuring, extraAfter      int // lost beyond the baseline's share
	latency, success             string
}

func recovery(rs []result, from, to, w time.Duration) slowResult {
	var r slowResult
	var before, during, after []result
	for _, x := range rs {
		switch {
		case x.due < from:
			before = append(before, x)
		case x.due < to:
			during = append(during, x)
			if x.status != http.StatusOK {
				r.lostDuring[x.class]++
			}
		default:
			after = append(after, x)
			if x.status != http.StatusOK {
				r.lostAfter[x.class]++
			}
		}
	}
	r.p99During, r.p99After = stats(during).q(0.99), stats(after).q(0.99)
	// The baseline skips the first second, the server's warm-up.
	var p99s []time.Duration
	var okShare []float64
	for _, b := range bins(before, w) {
		if b.at < time.Second || len(b.rs) == 0 {
			continue
		}
		s := stats(b.rs)
		p99s = append(p99s, s.q(0.99))
		okShare = append(okShare, frac(s.ok[0]+s.ok[1]+s.ok[2], len(b.rs)))
	}
	if len(p99s) == 0 {
		r.latency, r.success = "no baseline", "no baseline"
		return r
	}
	slices.Sort(p99s)
	slices.Sort(okShare)
	r.baseP99 = p99s[len(p99s)/2]
	baseOK := okShare[len(okShare)/2]
	baseLost := 0
	for _, x := range before {
		if x.status != http.StatusOK {
			baseLost++
		}
	}
	r.baseLost = frac(baseLost, len(before))
	r.extraDuring = sum(r.lostDuring) - int(r.baseLost*float64(len(during))+0.5)
	r.extraAfter = sum(r.lostAfter) - int(r.baseLost*float64(len(after))+0.5)
	all := bins(rs, w)
	r.latency = sustained(all, to, func(s summary, n int) bool { return n > 0 && s.q(0.99) <= r.baseP99*3/2 })
	r.success = sustained(all, to, func(s summary, n int) bool { return frac(sum(s.ok), n) >= baseOK-0.05 })
	return r
}

// sustained is the time from to until the first bin from which on good
// holds for a second's worth of bins (4 of 250 ms) in a row.
func sustained(all []bin, to time.Duration, good func(summary, int) bool) string {
	const need = 4
	run := 0
	for i := range all {
		if all[i].at < to {
			continue
		}
		if good(stats(all[i].rs), len(all[i].rs)) {
			run++
		} else {
			run = 0
		}
		if run == need {
			return (all[i-need+1].at - to).String()
		}
	}
	return "not within the run"
}

func sum(a [3]int) int { return a[0] + a[1] + a[2] }

func frac(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func pct(a, b int) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*frac(a, b))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// firstLoad is the load average printed at the start of the raw output.
func firstLoad(raw string) string {
	_, after, ok := strings.Cut(raw, "load average ")
	if !ok {
		return "unknown"
	}
	line, _, _ := strings.Cut(after, "\n")
	return line
}

// repoRoot is the directory of the core module, found by walking up from
// the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/ratekit/ratelimit\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the ratelimit repository")
		}
		dir = parent
	}
}
