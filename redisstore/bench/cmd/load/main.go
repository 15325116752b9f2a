// Command load drives the example servers with real HTTP traffic and
// prints what they answered, as Markdown tables:
//
//   - replicas: three processes of redisstore/examples/server sharing one
//     redis-server, under a fixed rate of GET /quote spread over -keys
//     keys (the first -hot of them sent -hot-percent of the traffic, far
//     above their rate), round robin over the replicas; once with the deny
//     cache on, once off;
//   - deny: the same replicas, every request to one of -deny-keys keys,
//     each far above its limit, deny cache on and off: the Redis calls a
//     refused request costs;
//   - outage: the replicas with Redis killed (SIGKILL) at -kill-at and
//     restarted empty on the same port -down later, once per failure
//     policy (-failure open, closed, fallback), deny cache on and off: a
//     timeline per second, and how long after Redis answered again each
//     replica's answers were Redis's;
//   - inproc: one process of examples/server (limits in process) under a
//     fixed rate over -inproc-keys keys, its resident memory read from
//     /proc every second.
//
// Every rule here is the examples' token bucket, 10 a second with bursts
// of 20, so that no key may be admitted more than 20 + 10 t in any span of
// t seconds; each key's admissions are checked against that exact bound.
// Everything listens on 127.0.0.1 and is stopped at the end, on an error
// or an interrupt too.
//
//	cd redisstore/bench && go run ./cmd/load [-scenario all] [-rate 500] [-duration 20s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ratekit/ratelimit/redisstore/bench/load"
	"github.com/ratekit/ratelimit/redisstore/internal/redistest"
)

// rule is the examples' token bucket: 10 a second, bursts of 20.
var rule = load.Rule{Burst: 20, Count: 10, Per: time.Second}

type flags struct {
	scenario      string
	rate          int
	duration      time.Duration
	keys, hot     int
	hotPercent    int
	denyKeys      int
	killAt, down  time.Duration
	policies      string
	outageDeny    string
	steadyFailure string
	inprocRate    int
	inprocKeys    int
	inprocDur     time.Duration
	keep          bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) (err error) {
	var f flags
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.StringVar(&f.scenario, "scenario", "all", "comma-separated `list` of replicas, deny, outage, inproc, or all")
	fs.IntVar(&f.rate, "rate", 500, "requests a `second` to the replicas")
	fs.DurationVar(&f.duration, "duration", 20*time.Second, "how long each Redis-backed run lasts")
	fs.IntVar(&f.keys, "keys", 1000, "keys in the replicas and outage runs")
	fs.IntVar(&f.hot, "hot", 5, "hot keys among them")
	fs.IntVar(&f.hotPercent, "hot-percent", 30, "`percent` of the requests that go to the hot keys")
	fs.IntVar(&f.denyKeys, "deny-keys", 10, "keys in the deny runs, all far above their limit")
	fs.DurationVar(&f.killAt, "kill-at", 8*time.Second, "when Redis is killed in an outage run")
	fs.DurationVar(&f.down, "down", 3*time.Second, "how long Redis stays down")
	fs.StringVar(&f.policies, "policies", "open,closed,fallback", "failure `policies` for the outage runs")
	fs.StringVar(&f.outageDeny, "outage-deny", "on,off", "deny cache settings for the outage runs")
	fs.StringVar(&f.steadyFailure, "steady-failure", "open", "the replicas' -failure in the replicas and deny runs")
	fs.IntVar(&f.inprocRate, "inproc-rate", 1000, "requests a `second` to the in-process server")
	fs.IntVar(&f.inprocKeys, "inproc-keys", 10_000, "keys in the inproc run")
	fs.DurationVar(&f.inprocDur, "inproc-duration", 30*time.Second, "how long the inproc run lasts")
	fs.BoolVar(&f.keep, "keep", false, "keep the servers' logs (their directory is printed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scenarios := map[string]bool{}
	for _, s := range strings.Split(f.scenario, ",") {
		switch s = strings.TrimSpace(s); s {
		case "all":
			for _, n := range []string{"replicas", "deny", "outage", "inproc"} {
				scenarios[n] = true
			}
		case "replicas", "deny", "outage", "inproc":
			scenarios[s] = true
		default:
			return fmt.Errorf("-scenario: unknown %q", s)
		}
	}

	root, err := load.RepoRoot()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "ratelimit-load-")
	if err != nil {
		return err
	}
	defer func() {
		if f.keep || err != nil {
			fmt.Fprintf(os.Stderr, "server logs in %s\n", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	h := &harness{f: f, out: out, root: root, tmp: tmp}
	defer h.stopAll()

	fmt.Fprintf(out, "# load run, %s\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "%s, %d CPUs (GOMAXPROCS %d), %s; load average at start: %s\n\n",
		runtime.Version(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS+"/"+runtime.GOARCH, loadavg())

	if scenarios["replicas"] || scenarios["deny"] || scenarios["outage"] {
		if err := h.setupRedis(ctx); err != nil {
			return err
		}
	}
	if scenarios["replicas"] {
		if err := h.replicas(ctx); err != nil {
			return err
		}
	}
	if scenarios["deny"] {
		if err := h.deny(ctx); err != nil {
			return err
		}
	}
	if scenarios["outage"] {
		if err := h.outage(ctx); err != nil {
			return err
		}
	}
	if scenarios["inproc"] {
		if err := h.inproc(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "load average at the end: %s\n", loadavg())
	return nil
}

type harness struct {
	f         flags
	out       io.Writer
	root, tmp string
	redis     *redistest.Server
	redisBin  string // redisstore/examples/server, built
	stops     []func()
	runs      int
}

// stopAll stops everything started, the latest first.
func (h *harness) stopAll() {
	for i := len(h.stops) - 1; i >= 0; i-- {
		h.stops[i]()
	}
	h.stops = nil
}

func (h *harness) setupRedis(ctx context.Context) error {
	h.redisBin = filepath.Join(h.tmp, "redis-example-server")
	if err := load.Build(ctx, filepath.Join(h.root, "redisstore"), "./examples/server", h.redisBin); err != nil {
		return err
	}
	r, err := redistest.Start()
	if err != nil {
		return err
	}
	h.redis = r
	h.stops = append(h.stops, func() {
		if err := r.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	})
	return nil
}

// startReplicas starts three replicas of the Redis example server with
// extra flags, and returns them with a function that stops them.
func (h *harness) startReplicas(extra ...string) ([]*load.Server, func(), error) {
	h.runs++
	var servers []*load.Server
	stop := func() {
		for _, s := range servers {
			s.Stop()
		}
		servers = nil
	}
	for i := range 3 {
		logf, err := os.Create(filepath.Join(h.tmp, fmt.Sprintf("run%02d-replica%d.log", h.runs, i)))
		if err != nil {
			stop()
			return nil, nil, err
		}
		h.stops = append(h.stops, func() { logf.Close() })
		args := append([]string{"-redis", h.redis.Addr(), "-decided-by"}, extra...)
		s, err := load.StartServer(h.redisBin, args, logf)
		if err != nil {
			stop()
			return nil, nil, err
		}
		servers = append(servers, s)
	}
	h.stops = append(h.stops, stop)
	return servers, stop, nil
}

func urls(servers []*load.Server) []string {
	var u []string
	for _, s := range servers {
		u = append(u, s.URL)
	}
	return u
}

func (h *harness) flush(ctx context.Context) error {
	rdb := h.redis.Client(nil)
	defer rdb.Close()
	return rdb.FlushAll(ctx).Err()
}

// steady is one run of the replicas: the attack, its summary, its bounds
// and what Redis did.
type steady struct {
	name  string
	sum   load.Summary
	keys  load.KeyBounds
	redis load.RedisStats
	// byRedis compares only the admissions Redis decided with the bound.
	byRedis  load.KeyBounds
	replicas time.Duration // CPU the three replicas used during the attack
	self     time.Duration // CPU this process (the load generator) used
}

// byRedis counts an admission Redis decided.
func byRedis(r load.Record) bool { return r.By == "redis" }

// cpuOf sums the CPU the processes pids have used.
func cpuOf(pids []int) time.Duration {
	var t time.Duration
	for _, pid := range pids {
		c, _ := load.ProcCPU(pid)
		t += c
	}
	return t
}

func (h *harness) steadyRun(ctx context.Context, name string, plan load.Plan, extra ...string) (steady, error) {
	if err := h.flush(ctx); err != nil {
		return steady{}, err
	}
	servers, stop, err := h.startReplicas(extra...)
	if err != nil {
		return steady{}, err
	}
	defer stop()
	rdb := h.redis.Client(nil)
	defer rdb.Close()
	meter, err := load.StartMeter(ctx, rdb)
	if err != nil {
		return steady{}, err
	}
	plan.URLs = urls(servers)
	plan.Name = fmt.Sprintf("%s%d", strings.ReplaceAll(name, " ", "-"), time.Now().UnixNano())
	var pids []int
	for _, s := range servers {
		pids = append(pids, s.Pid())
	}
	cpu0, self0 := cpuOf(pids), load.SelfCPU()
	res, err := load.Attack(ctx, plan)
	if err != nil {
		return steady{}, err
	}
	cpu1, self1 := cpuOf(pids), load.SelfCPU()
	rs, err := meter.Read(ctx)
	if err != nil {
		return steady{}, err
	}
	return steady{name: name, sum: load.Summarize(res), keys: load.Bounds(res, rule, nil), redis: rs,
		byRedis: load.Bounds(res, rule, byRedis), replicas: cpu1 - cpu0, self: self1 - self0}, nil
}

func (h *harness) replicas(ctx context.Context) error {
	f := h.f
	plan := load.Plan{Path: "/quote", Rate: f.rate, Duration: f.duration, Keys: f.keys, Hot: f.hot, HotPercent: f.hotPercent}
	fmt.Fprintf(h.out, "## Three Redis-backed replicas, one redis-server\n\n")
	fmt.Fprintf(h.out, "GET /quote at %d/s for %v over %d keys, round robin over 3 replicas of redisstore/examples/server (-failure %s); %d hot keys take %d%% of the requests (%.0f/s each, against a limit of 10/s), the others %.2f/s each.\n\n",
		f.rate, f.duration, f.keys, f.steadyFailure, f.hot, f.hotPercent,
		float64(f.rate*f.hotPercent)/100/float64(max(f.hot, 1)), float64(f.rate*(100-f.hotPercent))/100/float64(f.keys-f.hot))
	return h.denyCacheOnAndOff(ctx, plan)
}

func (h *harness) deny(ctx context.Context) error {
	f := h.f
	plan := load.Plan{Path: "/quote", Rate: f.rate, Duration: f.duration, Keys: f.denyKeys}
	fmt.Fprintf(h.out, "## Keys over their limit: the deny cache on and off\n\n")
	fmt.Fprintf(h.out, "GET /quote at %d/s for %v over %d keys (%.0f/s each, against a limit of 10/s), round robin over 3 replicas (-failure %s).\n\n",
		f.rate, f.duration, f.denyKeys, float64(f.rate)/float64(f.denyKeys), f.steadyFailure)
	return h.denyCacheOnAndOff(ctx, plan)
}

// denyCacheOnAndOff runs plan with the replicas' deny cache on, then off,
// and writes the two runs' tables.
func (h *harness) denyCacheOnAndOff(ctx context.Context, plan load.Plan) error {
	var runs []steady
	for _, deny := range []string{"10000", "0"} {
		name := "deny cache on"
		if deny == "0" {
			name = "deny cache off"
		}
		st, err := h.steadyRun(ctx, name, plan, "-deny-cache", deny, "-failure", h.f.steadyFailure)
		if err != nil {
			return err
		}
		runs = append(runs, st)
	}
	h.steadyTables(runs)
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func (h *harness) steadyTables(runs []steady) {
	w := h.out
	fmt.Fprintln(w, "| run | requests | asked/s | sent/s | answered/s | 200 | 429 | 5xx | other | no answer | p50 ms | p99 ms | p99.9 ms | max ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		s := r.sum
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %d | %d | %d | %d | %d | %s | %s | %s | %s |\n",
			r.name, s.Requests, s.Asked, s.Sent, s.Answered, s.OK, s.Refused, s.Server5xx, s.Other, s.Errors,
			ms(s.P50), ms(s.P99), ms(s.P999), ms(s.Max))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | decided by | keys admitted | keys over the bound | largest excess | most admitted (its bound) | keys refused | least slack of those | keys over the bound, Redis's admissions only | least slack, Redis's only |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		k := r.keys
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d (%d) | %d | %s | %d | %s |\n",
			r.name, byString(r.sum.By), k.Keys, k.Over, k.MaxOver, k.MaxAdmitted, k.MaxBound, k.Refused, slack(k), r.byRedis.Over, slack(r.byRedis))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | Redis CPU (INFO cpu) | Redis CPU µs/request | script calls | script calls/request | µs/script call (commandstats) | all commands/request (the scripts' own TIME, GET, SET... included) | 3 replicas' CPU µs/request | load generator's CPU µs/request |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		n := float64(max(r.sum.Requests, 1))
		var all int64
		for name, c := range r.redis.Commands {
			if name != "info" && name != "config|resetstat" {
				all += c
			}
		}
		fmt.Fprintf(w, "| %s | %v | %.1f | %d | %.3f | %.1f | %.3f | %.0f | %.0f |\n",
			r.name, r.redis.CPU.Round(time.Millisecond), float64(r.redis.CPU.Microseconds())/n, r.redis.ScriptCalls,
			float64(r.redis.ScriptCalls)/n, float64(r.redis.ScriptUsec)/float64(max(r.redis.ScriptCalls, 1)), float64(all)/n,
			float64(r.replicas.Microseconds())/n, float64(r.self.Microseconds())/n)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Load average after these runs: %s\n\n", loadavg())
}

// slack is the least bound - admitted over the keys that were refused,
// "-" when none was.
func slack(k load.KeyBounds) string {
	if k.Refused == 0 {
		return "-"
	}
	return fmt.Sprint(k.MinSlack)
}

func byString(by map[string]int) string {
	var names []string
	for n := range by {
		names = append(names, n)
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, by[n]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func (h *harness) outage(ctx context.Context) error {
	f := h.f
	fmt.Fprintf(h.out, "## Redis killed mid-run\n\n")
	fmt.Fprintf(h.out, "GET /quote at %d/s for %v over %d keys (%d hot at %d%%), round robin over 3 replicas; Redis SIGKILLed at %v and restarted empty on the same port %v later. Rows are the seconds the requests were sent in.\n\n",
		f.rate, f.duration, f.keys, f.hot, f.hotPercent, f.killAt, f.down)
	type outcome struct {
		name    string
		sum     load.Summary
		keys    load.KeyBounds
		redis   load.KeyBounds // Redis's admissions only
		rec     load.Recovery
		killed  time.Duration
		started time.Duration
		back    time.Duration
	}
	var outcomes []outcome
	for _, policy := range strings.Split(f.policies, ",") {
		for _, deny := range strings.Split(f.outageDeny, ",") {
			n := "10000"
			if deny == "off" {
				n = "0"
			}
			name := fmt.Sprintf("-failure %s, deny cache %s", policy, deny)
			if err := h.flush(ctx); err != nil {
				return err
			}
			servers, stop, err := h.startReplicas("-failure", policy, "-deny-cache", n)
			if err != nil {
				return err
			}
			plan := load.Plan{Path: "/quote", Rate: f.rate, Duration: f.duration, Keys: f.keys, Hot: f.hot, HotPercent: f.hotPercent,
				URLs: urls(servers), Name: fmt.Sprintf("outage-%s-%s-%d", policy, deny, time.Now().UnixNano())}
			began := make(chan time.Time, 1)
			plan.OnStart = func(t time.Time) { began <- t }
			type times struct {
				killed, started, back time.Duration
				err                   error
			}
			drill := make(chan times, 1)
			go func() {
				var t0 time.Time
				select {
				case t0 = <-began:
				case <-ctx.Done():
					drill <- times{err: ctx.Err()}
					return
				}
				select {
				case <-time.After(time.Until(t0.Add(f.killAt))):
				case <-ctx.Done():
					drill <- times{err: ctx.Err()}
					return
				}
				if err := h.redis.Kill(); err != nil {
					drill <- times{err: err}
					return
				}
				killed := time.Since(t0)
				select {
				case <-time.After(f.down):
				case <-ctx.Done():
				}
				started := time.Since(t0)
				err := h.redis.Restart()
				drill <- times{killed: killed, started: started, back: time.Since(t0), err: err}
			}()
			res, err := load.Attack(ctx, plan)
			d := <-drill
			stop()
			if err != nil {
				return err
			}
			if d.err != nil {
				return fmt.Errorf("restarting redis: %w", d.err)
			}
			o := outcome{name: name, sum: load.Summarize(res), keys: load.Bounds(res, rule, nil), redis: load.Bounds(res, rule, byRedis),
				rec: load.Recover(res, len(servers), d.killed, d.back), killed: d.killed, started: d.started, back: d.back}
			outcomes = append(outcomes, o)
			h.timeline(name, res, d.killed, d.back)
		}
	}
	w := h.out
	fmt.Fprintln(w, "### Outage runs: summary")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | requests | sent/s | 200 | 429 | 5xx | no answer | p50 ms | p99 ms | p99.9 ms | max ms | decided by | keys over the bound | largest excess | keys over the bound, Redis's admissions only |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, o := range outcomes {
		s := o.sum
		fmt.Fprintf(w, "| %s | %d | %.1f | %d | %d | %d | %d | %s | %s | %s | %s | %s | %d | %d | %d |\n",
			o.name, s.Requests, s.Sent, s.OK, s.Refused, s.Server5xx, s.Errors, ms(s.P50), ms(s.P99), ms(s.P999), ms(s.Max),
			byString(s.By), o.keys.Over, o.keys.MaxOver, o.redis.Over)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Recovery: from the restarted Redis answering the harness's PING (on a new connection every millisecond) to each replica's first admission decided by Redis (of a request sent after the kill). Late policy answers: the failure policy's answers to requests sent more than 1 s after that PING, i.e. checks that missed their 100 ms deadline on a live Redis.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | killed at s | restarted at s | answering again at s | first Redis answer, per replica (ms) | late policy answers, per replica | \"redis\" answers during the outage (deny cache) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, o := range outcomes {
		var late []string
		for _, n := range o.rec.Late {
			late = append(late, fmt.Sprint(n))
		}
		fmt.Fprintf(w, "| %s | %.3f | %.3f | %.3f | %s | %s | %d |\n", o.name, o.killed.Seconds(), o.started.Seconds(), o.back.Seconds(),
			durList(o.rec.First), strings.Join(late, " / "), o.rec.DuringOutage)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Load average after these runs: %s\n\n", loadavg())
	return nil
}

func durList(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		if d == -1 {
			parts = append(parts, "none")
			continue
		}
		parts = append(parts, fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)))
	}
	return strings.Join(parts, " / ")
}

func (h *harness) timeline(name string, res *load.Result, killed, back time.Duration) {
	w := h.out
	fmt.Fprintf(w, "### %s\n\n", name)
	fmt.Fprintln(w, "| s | 200 | 429 | 5xx | no answer | by redis | by policy | p99 ms | max ms | |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for i, s := range load.Timeline(res) {
		var note []string
		start, end := time.Duration(i)*time.Second, time.Duration(i+1)*time.Second
		if killed >= start && killed < end {
			note = append(note, fmt.Sprintf("killed at %.3f s", killed.Seconds()))
		}
		if back >= start && back < end {
			note = append(note, fmt.Sprintf("answering again at %.3f s", back.Seconds()))
		}
		policy := 0
		for by, n := range s.By {
			if by != "redis" {
				policy += n
			}
		}
		fmt.Fprintf(w, "| %d | %d | %d | %d | %d | %d | %d | %s | %s | %s |\n",
			i, s.OK, s.Refused, s.Server5xx, s.Errors, s.By["redis"], policy, ms(s.P99), ms(s.Max), strings.Join(note, "; "))
	}
	fmt.Fprintln(w)
}

func (h *harness) inproc(ctx context.Context) error {
	f := h.f
	bin := filepath.Join(h.tmp, "example-server")
	if err := load.Build(ctx, h.root, "./examples/server", bin); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(h.tmp, "inproc.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	srv, err := load.StartServer(bin, nil, logf)
	if err != nil {
		return err
	}
	h.stops = append(h.stops, srv.Stop)
	defer srv.Stop()

	type sample struct {
		at  time.Duration
		rss int64
	}
	var samples []sample
	done := make(chan struct{})
	sampled := make(chan struct{})
	began := make(chan time.Time, 1)
	go func() {
		defer close(sampled)
		t0 := <-began
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if rss, err := load.RSS(srv.Pid()); err == nil {
				samples = append(samples, sample{time.Since(t0), rss})
			}
			select {
			case <-tick.C:
			case <-done:
				if rss, err := load.RSS(srv.Pid()); err == nil {
					samples = append(samples, sample{time.Since(t0), rss})
				}
				return
			}
		}
	}()
	before, _ := load.RSS(srv.Pid())
	plan := load.Plan{URLs: []string{srv.URL}, Path: "/quote", Rate: f.inprocRate, Duration: f.inprocDur, Keys: f.inprocKeys,
		Hot: f.hot, HotPercent: f.hotPercent, Name: fmt.Sprintf("inproc%d", time.Now().UnixNano()),
		OnStart: func(t time.Time) { began <- t }}
	cpu0, self0 := cpuOf([]int{srv.Pid()}), load.SelfCPU()
	res, err := load.Attack(ctx, plan)
	cpu1, self1 := cpuOf([]int{srv.Pid()}), load.SelfCPU()
	close(done)
	<-sampled
	if err != nil {
		return err
	}
	sum, keys := load.Summarize(res), load.Bounds(res, rule, nil)
	w := h.out
	cold := float64(f.inprocRate*(100-f.hotPercent)) / 100
	fmt.Fprintf(w, "## The in-process examples/server\n\n")
	fmt.Fprintf(w, "GET /quote at %d/s for %v over %d keys, one process of examples/server (limits in process); %d hot keys take %d%% of the requests (%.0f/s each), the others %.3f/s each, every cold key first used within %.1f s.\n\n",
		f.inprocRate, f.inprocDur, f.inprocKeys, f.hot, f.hotPercent, float64(f.inprocRate*f.hotPercent)/100/float64(max(f.hot, 1)),
		cold/float64(f.inprocKeys-f.hot), float64(f.inprocKeys-f.hot)/cold)
	h.steadyTables2(sum, keys)
	n := float64(max(sum.Requests, 1))
	fmt.Fprintf(w, "Server CPU: %.0f µs/request; load generator CPU: %.0f µs/request.\n\n",
		float64((cpu1-cpu0).Microseconds())/n, float64((self1-self0).Microseconds())/n)
	var peak int64
	for _, s := range samples {
		peak = max(peak, s.rss)
	}
	mib := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	// Once every key has been used the store holds them all: from then
	// on nothing should grow.
	covered := time.Duration(float64(f.inprocKeys-f.hot) / cold * float64(time.Second))
	fmt.Fprintln(w, "| VmRSS MiB: before the attack | first sample | once every key was used | last sample | max | last − first | last − once every key was used |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	if len(samples) > 0 {
		first, last := samples[0].rss, samples[len(samples)-1].rss
		all, allS := int64(-1), "not reached"
		for _, s := range samples {
			if s.at >= covered {
				all, allS = s.rss, fmt.Sprintf("%s (at %.0f s)", mib(s.rss), s.at.Seconds())
				break
			}
		}
		growth := "-"
		if all >= 0 {
			growth = mib(last - all)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n\n", mib(before), mib(first), allS, mib(last), mib(peak), mib(last-first), growth)
	}
	// The trend once every key was used: a least-squares slope.
	var xs, ys []float64
	for _, s := range samples {
		if s.at >= covered {
			xs, ys = append(xs, s.at.Minutes()), append(ys, float64(s.rss)/(1<<20))
		}
	}
	if slope, ok := load.Slope(xs, ys); ok {
		fmt.Fprintf(w, "VmRSS trend once every key was used (least squares over %d samples): %+.2f MiB a minute.\n\n", len(xs), slope)
	}
	var series []string
	for _, s := range samples {
		series = append(series, fmt.Sprintf("%.0fs %s", s.at.Seconds(), mib(s.rss)))
	}
	fmt.Fprintf(w, "VmRSS each second (MiB): %s\n\n", strings.Join(series, ", "))
	fmt.Fprintf(w, "Load average after this run: %s\n\n", loadavg())
	return nil
}

func (h *harness) steadyTables2(s load.Summary, k load.KeyBounds) {
	w := h.out
	fmt.Fprintln(w, "| requests | asked/s | sent/s | answered/s | 200 | 429 | 5xx | other | no answer | p50 ms | p99 ms | p99.9 ms | max ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| %d | %d | %.1f | %.1f | %d | %d | %d | %d | %d | %s | %s | %s | %s |\n\n",
		s.Requests, s.Asked, s.Sent, s.Answered, s.OK, s.Refused, s.Server5xx, s.Other, s.Errors, ms(s.P50), ms(s.P99), ms(s.P999), ms(s.Max))
	fmt.Fprintln(w, "| keys admitted | keys over the bound | largest excess | most admitted (its bound) | keys refused | least slack of those |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| %d | %d | %d | %d (%d) | %d | %s |\n\n", k.Keys, k.Over, k.MaxOver, k.MaxAdmitted, k.MaxBound, k.Refused, slack(k))
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
