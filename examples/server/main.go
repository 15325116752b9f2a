// Command server is a small HTTP API behind rate limits, showing the
// httplimit middleware:
//
//   - GET /quote is limited per API key (the X-API-Key header), or per
//     client address for requests without one, by the plan of the key: by
//     default every key is on plan "free", a token bucket of 10 per second
//     with bursts of 20; at most 4 quotes of a key are in progress at once,
//     and a quote refused for either limit spends nothing of the other;
//   - POST /labels:batch spends the same per-key allowance, at 10 units a
//     call;
//   - POST /login checks a form field "password" against -password: only
//     failed logins count, 5 a minute per client address, and 5 failures
//     within a minute lock the address out for 15 minutes (429 with the
//     exact Retry-After);
//   - GET / lists these routes and their limits, as the server prints them
//     when it starts.
//
// Every response carries the RateLimit-Policy and RateLimit fields; a client
// over its limit gets 429 with Retry-After and a JSON body, and the server
// logs one line for it. SIGINT or SIGTERM shuts the server down cleanly,
// letting requests in flight finish.
//
// Usage:
//
//	go run ./examples/server [-addr 127.0.0.1:8080] [-trust 10.0.0.0/8,...] [-rules rules.json] [-password letmein] [-work 0s]
//
// -rules reads the plans, and which API keys are on which plan, from a file
// (examples/server/rules.json is one):
//
//	{"rules": <a rule set, see ratelimit.PlanSet>, "keys": {"<API key>": "<plan>", ...}}
//
// A SIGHUP reads it again: the new plans apply at once, each key keeping
// the fraction of its allowance it had used, and a file that does not read
// or validate is refused, logged, and changes nothing.
//
// -trust lists the networks of reverse proxies in front of the server; their
// X-Forwarded-For is believed. By default nothing is trusted and clients are
// keyed by the address they connect from.
//
// -work makes each quote take that long, so that quotes stay in progress
// and their in-flight limit shows.
//
// Try it: 40 quotes in a row over one connection, more than the burst of 20
// and the few the rate earns meanwhile, so the last ones get 429; then,
// with -work 2s, 6 quotes at once, of which 4 may be in progress, so 2 get
// 429; then a wrong password:
//
//	curl -s -o /dev/null -w '%{http_code} ' 'localhost:8080/quote?n=[1-40]'; echo
//	curl --no-progress-meter -Z --parallel-immediate -o /dev/null -w '%{http_code} ' 'localhost:8080/quote?n=[1-6]'; echo
//	curl -si -d password=guess localhost:8080/login
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down, waiting up to 10 s for
// requests in flight. It logs to logw, and calls ready (if not nil) with the
// listening address once connections are accepted.
func run(ctx context.Context, args []string, logw io.Writer, ready func(net.Addr)) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(logw)
	addr := fs.String("addr", "127.0.0.1:8080", "`address` to listen on")
	trust := fs.String("trust", "", "comma-separated `networks` of trusted reverse proxies, such as 10.0.0.0/8")
	rulesFile := fs.String("rules", "", "`file` of plans and the API keys on them (JSON); SIGHUP reads it again")
	password := fs.String("password", "letmein", "the `password` POST /login accepts")
	work := fs.Duration("work", 0, "how long each quote takes (`duration`), to see its in-flight limit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var proxies []netip.Prefix
	for _, s := range strings.Split(*trust, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("-trust: %w", err)
		}
		proxies = append(proxies, p.Masked())
	}

	rules := defaultRules()
	if *rulesFile != "" {
		var err error
		if rules, err = readRules(*rulesFile); err != nil {
			return fmt.Errorf("-rules: %w", err)
		}
	}
	logger := slog.New(slog.NewTextHandler(logw, nil))
	a, err := newAPI(logger, proxies, rules, loginConfig{verify: passwordIs(*password), clock: ratelimit.SystemClock()})
	if err != nil {
		return err
	}
	if *work > 0 {
		a.quoteWait = working(*work)
	}
	fmt.Fprintln(logw, "routes:")
	for _, r := range *a.table.Load() {
		fmt.Fprintf(logw, "  %-20s %s\n", r.Route, r.Limit)
	}
	if *rulesFile != "" {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					a.reload(*rulesFile)
				}
			}
		}()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           a.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String())
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// route is one route of the API and the limit it is under, as GET / lists
// them.
type route struct {
	Route string `json:"route"`
	Limit string `json:"limit"`
}

// rulesFile is the -rules file: plans, and the API keys on each.
type rulesFile struct {
	Rules ratelimit.PlanSet `json:"rules"`
	Keys  map[string]string `json:"keys"` // API key -> plan
}

// defaultRules are the limits without -rules: one plan, "free", for every
// key.
func defaultRules() rulesFile {
	return rulesFile{Rules: ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}},
		},
		Default: "free",
	}}
}

// readRules reads and checks a -rules file, strictly: an unknown field, a
// malformed rule or a key on a plan that does not exist is an error.
func readRules(path string) (rulesFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return rulesFile{}, err
	}
	var rf rulesFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rf); err != nil {
		return rulesFile{}, err
	}
	if rf.Rules.Plans == nil {
		return rulesFile{}, errors.New(`"rules" is missing`)
	}
	for key, plan := range rf.Keys {
		if _, ok := rf.Rules.Plans[plan]; !ok {
			return rulesFile{}, fmt.Errorf("key %q is on plan %q, which is not one of the plans", key, plan)
		}
	}
	return rf, nil
}

// api is the server's handler, its plans, and the routes as GET / lists
// them.
type api struct {
	mux    *http.ServeMux
	plans  *ratelimit.Plans
	keys   atomic.Pointer[map[string]string] // limiter key -> plan
	table  atomic.Pointer[[]route]
	logger *slog.Logger
	loginL string
	// quoteWait, if set, is called by every quote before it answers (tests
	// hold quotes in progress with it).
	quoteWait func(*http.Request)
}

const batchCost = 10

// quoteInFlight is how many quotes of one key may be in progress at once.
const quoteInFlight = 4

// newAPI builds the API with its limits.
func newAPI(logger *slog.Logger, proxies []netip.Prefix, rules rulesFile, login loginConfig) (*api, error) {
	a := &api{logger: logger}
	a.keys.Store(limiterKeys(rules.Keys))
	plans, err := ratelimit.NewPlans(rules.Rules, func(key string) string { return (*a.keys.Load())[key] })
	if err != nil {
		return nil, err
	}
	a.plans = plans

	client := httplimit.ClientIP{TrustedProxies: proxies}
	byAPIKey := httplimit.WithKey(httplimit.HeaderKey("X-API-Key", client.Key))
	// WithLogger: one line for each refused request (none without it).
	logTo := httplimit.WithLogger(logger)
	quoteSlots, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: quoteInFlight, Name: "quote-in-flight"})
	if err != nil {
		return nil, err
	}
	// The slot and the plan's allowance are taken together, or neither.
	perKeyQuote := httplimit.InFlight(quoteSlots, plans, byAPIKey, logTo)
	perKeyBatch := httplimit.Middleware(plans, byAPIKey, logTo, httplimit.WithCost(httplimit.FixedCost(batchCost*ratelimit.Unit)))
	loginH, loginL, err := newLogin(login, client, logTo, logger)
	if err != nil {
		return nil, err
	}
	a.loginL = loginL
	a.table.Store(a.routes(rules.Rules))

	a.mux = http.NewServeMux()
	a.mux.Handle("GET /quote", perKeyQuote(http.HandlerFunc(a.quote)))
	a.mux.Handle("POST /labels:batch", perKeyBatch(http.HandlerFunc(labels)))
	a.mux.Handle("POST /login", loginH)
	a.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, map[string]any{"routes": *a.table.Load()})
	})
	return a, nil
}

// limiterKeys maps the API keys of a rules file to the keys the middleware
// limits them by: HeaderKey's "hdr:" and the first 16 bytes of the value's
// SHA-256 in hex.
func limiterKeys(keys map[string]string) *map[string]string {
	m := make(map[string]string, len(keys))
	for k, plan := range keys {
		m[httplimit.SecretKey(k)] = plan
	}
	return &m
}

// routes lists the routes and their limits under a rule set.
func (a *api) routes(set ratelimit.PlanSet) *[]route {
	names := make([]string, 0, len(set.Plans))
	for name := range set.Plans {
		names = append(names, name)
	}
	sort.Strings(names)
	var plans []string
	for _, name := range names {
		spec, _ := json.Marshal(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{name: set.Plans[name]}, Default: name})
		var doc struct{ Plans map[string]json.RawMessage }
		_ = json.Unmarshal(spec, &doc)
		label := name
		if name == set.Default {
			label += " (default)"
		}
		plans = append(plans, label+" "+string(doc.Plans[name]))
	}
	limit := "per X-API-Key, or else client address, by its plan: " + strings.Join(plans, "; ")
	return &[]route{
		{"GET /quote", limit + fmt.Sprintf("; 1 a call; at most %d in progress per key", quoteInFlight)},
		{"POST /labels:batch", limit + fmt.Sprintf("; %d a call", batchCost)},
		{"POST /login", a.loginL},
		{"GET /", "none: this list"},
	}
}

// reload reads the rules file again and puts it in force, logging what
// changed, or why the file was refused (the rules in force then stay).
func (a *api) reload(path string) {
	rules, err := readRules(path)
	if err == nil {
		err = a.plans.Update(rules.Rules, ratelimit.MigrateProportional)
	}
	if err != nil {
		a.logger.Error("rules refused; the rules in force stay", "file", path, "error", err)
		return
	}
	a.keys.Store(limiterKeys(rules.Keys))
	a.table.Store(a.routes(rules.Rules))
	a.logger.Info("rules reloaded", "file", path, "plans", len(rules.Rules.Plans), "keys", len(rules.Keys),
		"limits", (*a.table.Load())[0].Limit)
}

// working returns a quoteWait that takes d, or until the client goes away.
func working(d time.Duration) func(*http.Request) {
	return func(r *http.Request) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
	}
}

func (a *api) quote(w http.ResponseWriter, r *http.Request) {
	if a.quoteWait != nil {
		a.quoteWait(r)
	}
	reply(w, map[string]any{"symbol": "RTK", "price": "42.00"})
}

func labels(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"accepted": 10})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
