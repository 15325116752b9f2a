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
//   - GET /work is protected by a load shedder rather than a rate limit:
//     its requests queue for a few workers, and as the work in progress
//     nears its limit the least important class is refused first, with 503
//     and Retry-After (see work.go and its -work-*, -shed* and
//     -priority-header flags);
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
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/internal/exampleserver"
)

func main() { exampleserver.Main(run) }

// run serves until ctx ends, then shuts down, waiting up to 10 s for
// requests in flight. It logs to logw, and calls ready (if not nil) with the
// listening address once connections are accepted.
func run(ctx context.Context, args []string, logw io.Writer, ready func(net.Addr)) error {
	f, fs := exampleserver.NewFlags(logw)
	wc := workFlags(fs)
	if err := f.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(logw, nil))
	a, err := newAPI(logger, f.Proxies, f.Rules, loginConfig{verify: passwordIs(f.Password), clock: ratelimit.SystemClock()})
	if err != nil {
		return err
	}
	if f.Work > 0 {
		a.quoteWait = exampleserver.Working(f.Work)
	}
	if err := a.mountWork(wc, f.Rules.Rules); err != nil {
		return err
	}
	exampleserver.PrintRoutes(logw, *a.table.Load())
	defer exampleserver.ReloadOnHangup(ctx, f.RulesPath, a.reload)()
	return exampleserver.Serve(ctx, f.Addr, a.mux, logger, ready)
}

// route is one route of the API and the limit it is under, as GET / lists
// them.
type route = exampleserver.Route

// defaultRules are the limits without -rules: one plan, "free", for every
// key.
func defaultRules() exampleserver.RulesFile { return exampleserver.DefaultRules() }

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
	// more are routes added after the API was built (GET /work), listed
	// after the others.
	more []route
}

const batchCost = 10

// quoteInFlight is how many quotes of one key may be in progress at once.
const quoteInFlight = 4

// newAPI builds the API with its limits.
func newAPI(logger *slog.Logger, proxies []netip.Prefix, rules exampleserver.RulesFile, login loginConfig) (*api, error) {
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
	limit := "per X-API-Key, or else client address, by its plan: " + exampleserver.Plans(set)
	routes := append([]route{
		{Route: "GET /quote", Limit: limit + fmt.Sprintf("; 1 a call; at most %d in progress per key", quoteInFlight)},
		{Route: "POST /labels:batch", Limit: limit + fmt.Sprintf("; %d a call", batchCost)},
		{Route: "POST /login", Limit: a.loginL},
		{Route: "GET /", Limit: "none: this list"},
	}, a.more...)
	return &routes
}

// reload reads the rules file again and puts it in force, logging what
// changed, or why the file was refused (the rules in force then stay).
func (a *api) reload(path string) {
	rules, err := exampleserver.ReadRules(path)
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

func (a *api) quote(w http.ResponseWriter, r *http.Request) {
	if a.quoteWait != nil {
		a.quoteWait(r)
	}
	reply(w, map[string]any{"symbol": "RTK", "price": "42.00"})
}

func labels(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"accepted": 10})
}

func reply(w http.ResponseWriter, v any) { exampleserver.Reply(w, v) }
