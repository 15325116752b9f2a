package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/internal/exampleserver"
	"github.com/ratekit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// route is one route of the API and the limit it is under, as GET / lists
// them.
type route = exampleserver.Route

// readRules reads and checks a -rules file (exampleserver.ReadRules).
func readRules(path string) (exampleserver.RulesFile, error) { return exampleserver.ReadRules(path) }

const batchCost = 10

// quoteInFlight is how many quotes of one key may be in progress at once,
// across every replica.
const quoteInFlight = 4

// api is the server's handler and its limits.
type api struct {
	handler http.Handler
	rdb     redis.UniversalClient
	cfg     config
	opts    []redisstore.Option // added to every limit's (tests: a client clock, a prefix)
	logger  *slog.Logger
	plans   *redisstore.Plans
	local   *ratelimit.Plans // -failure fallback: the plans in process; nil otherwise
	keys    atomic.Pointer[map[string]string]
	table   atomic.Pointer[[]route]
	clock   ratelimit.Clock
	loginL  string
}

// routes builds the API with its limits in the Redis rdb talks to; opts
// are added to every limit's.
func routes(logger *slog.Logger, rdb redis.UniversalClient, cfg config, opts ...redisstore.Option) (http.Handler, error) {
	a, err := newAPI(logger, rdb, cfg, opts...)
	if err != nil {
		return nil, err
	}
	return a.handler, nil
}

// newAPI builds the API with its limits.
func newAPI(logger *slog.Logger, rdb redis.UniversalClient, cfg config, opts ...redisstore.Option) (*api, error) {
	if _, ok := failurePolicies[cfg.failure]; !ok {
		return nil, fmt.Errorf("unknown failure policy %q", cfg.failure)
	}
	a := &api{rdb: rdb, cfg: cfg, opts: opts, logger: logger}
	if err := a.build(cfg.rules); err != nil {
		return nil, err
	}

	client := httplimit.ClientIP{TrustedProxies: cfg.proxies}
	byAPIKey := httplimit.WithKey(httplimit.HeaderKey("X-API-Key", client.Key))
	logTo := httplimit.WithLogger(logger)

	slotOpts := append(a.policyOptions(), opts...)
	if cfg.failure == "fallback" {
		local, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: quoteInFlight, Name: "quote-in-flight"})
		if err != nil {
			return nil, err
		}
		slotOpts = append(slotOpts, redisstore.WithInFlightFallback(local))
	}
	// MaxHold gives back the slots of a replica that died holding them,
	// well after any quote could still be running.
	hold := max(time.Minute, 4*cfg.work)
	slots, err := redisstore.NewInFlight(rdb, ratelimit.InFlightLimit{Limit: quoteInFlight, MaxHold: hold, Name: "quote-in-flight"}, slotOpts...)
	if err != nil {
		return nil, err
	}
	byPlan := &planLimiter{a: a}
	// The slot and the plan's allowance are taken together, or neither.
	perKeyQuote := httplimit.InFlight(&planSlots{f: slots, a: a}, byPlan, byAPIKey, logTo)
	perKeyBatch := httplimit.Middleware(byPlan, byAPIKey, logTo, httplimit.WithCost(httplimit.FixedCost(batchCost*ratelimit.Unit)))
	loginH, err := a.newLogin(client, logTo)
	if err != nil {
		return nil, err
	}
	a.table.Store(a.routes(cfg.rules.Rules))

	quoteWait := cfg.quoteWait
	if quoteWait == nil && cfg.work > 0 {
		quoteWait = exampleserver.Working(cfg.work)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /quote", perKeyQuote(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if quoteWait != nil {
			quoteWait(r)
		}
		quote(w, r)
	})))
	mux.Handle("POST /labels:batch", perKeyBatch(http.HandlerFunc(labels)))
	mux.Handle("POST /login", loginH)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, map[string]any{"routes": *a.table.Load()})
	})
	a.handler = mux
	if cfg.decidedBy {
		a.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decidedByKey{}, w.Header())))
		})
	}
	return a, nil
}

// policyOptions are the -failure policy's options for a Store or an
// InFlight (a fallback is added by who builds it).
func (a *api) policyOptions() []redisstore.Option {
	if a.cfg.failure == "closed" {
		return []redisstore.Option{redisstore.WithFailureMode(redisstore.FailClosed)}
	}
	return nil
}

// build makes the plans, in Redis, of a rule set, and the in-process plans
// of -failure fallback. A plan of layers has no deny cache and no fallback
// of its own: the fallback is the in-process plans as a whole.
func (a *api) build(rules exampleserver.RulesFile) error {
	a.keys.Store(secretKeys(rules))
	planOf := func(key string) string { return (*a.keys.Load())[key] }
	opts := append(a.policyOptions(), redisstore.WithDenyCache(a.cfg.denyCache))
	if a.cfg.failure == "fallback" {
		local, err := ratelimit.NewPlans(rules.Rules, planOf)
		if err != nil {
			return err
		}
		a.local = local
		opts = append(opts, redisstore.WithFallback(local))
	}
	plans, err := redisstore.NewPlans(a.rdb, rules.Rules, planOf, append(opts, a.opts...)...)
	if err != nil {
		return err
	}
	a.plans = plans
	return nil
}

// secretKeys maps the limiter's key of each API key of rules to its plan.
func secretKeys(rules exampleserver.RulesFile) *map[string]string {
	keys := make(map[string]string, len(rules.Keys))
	for k, plan := range rules.Keys {
		keys[httplimit.SecretKey(k)] = plan
	}
	return &keys
}

// routes lists the routes and their limits under a rule set.
func (a *api) routes(set ratelimit.PlanSet) *[]route {
	limit := "per X-API-Key, or else client address, by its plan, in Redis: " + exampleserver.Plans(set)
	return &[]route{
		{Route: "GET /quote", Limit: limit + fmt.Sprintf("; 1 a call; at most %d in progress per key across every replica", quoteInFlight)},
		{Route: "POST /labels:batch", Limit: limit + fmt.Sprintf("; %d a call", batchCost)},
		{Route: "POST /login", Limit: a.loginL},
		{Route: "GET /", Limit: "none: this list"},
	}
}

// reload reads the rules file again and puts it in force with
// Plans.Update, logging what changed, or why the file was refused (the
// rules in force then stay). Keys keep what they had used, in Redis, on
// this replica and on every other: a replica still on the old rules moves
// a key back as it moves it, never handing it a fresh allowance.
func (a *api) reload(path string) {
	rules, err := readRules(path)
	if err == nil && a.local != nil {
		err = a.local.Update(rules.Rules, ratelimit.MigrateProportional)
	}
	if err == nil {
		err = a.plans.Update(rules.Rules, ratelimit.MigrateProportional)
	}
	if err != nil {
		a.logger.Error("rules refused; the rules in force stay", "file", path, "error", err)
		return
	}
	a.keys.Store(secretKeys(rules))
	a.table.Store(a.routes(rules.Rules))
	a.logger.Info("rules reloaded", "file", path, "plans", len(rules.Rules.Plans), "keys", len(rules.Keys),
		"limits", (*a.table.Load())[0].Limit)
}

// planLimiter checks each key against its plan's Redis limiter.
type planLimiter struct{ a *api }

func (p *planLimiter) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return p.CheckContext(context.Background(), key, cost)
}

func (p *planLimiter) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	d, err := p.a.plans.CheckContext(ctx, key, cost)
	markDecided(ctx, err, failurePolicies[p.a.cfg.failure])
	return d, err
}

// Clock is the limits' clock, so that httplimit waits on it.
func (p *planLimiter) Clock() ratelimit.Clock { return p.a.clock }

// planSlots is the quotes' in-flight limit, taken together with the plan
// of the key: AcquireWith takes a slot, asks the plans, and gives the slot
// back if they refuse.
type planSlots struct {
	f *redisstore.InFlight
	a *api
}

func (p *planSlots) AcquireContext(ctx context.Context, key string) (ratelimit.Release, ratelimit.Decision, error) {
	rel, d, err := p.f.AcquireContext(ctx, key)
	markDecided(ctx, err, failurePolicies[p.a.cfg.failure])
	return rel, d, err
}

func (p *planSlots) AcquireWith(ctx context.Context, key string, _ ratelimit.KeyedLimiter, cost ratelimit.Units) (ratelimit.Release, ratelimit.Decision, error) {
	rel, d, err := p.f.AcquireWith(ctx, key, p.a.plans, cost)
	markDecided(ctx, err, failurePolicies[p.a.cfg.failure])
	return rel, d, err
}

func (p *planSlots) Clock() ratelimit.Clock { return p.f.Clock() }

// decidedByKey is the context key under which the handler passes the
// response's header to the limits, for DecidedBy.
type decidedByKey struct{}

// markDecided sets DecidedBy, with -decided-by, to the path that decided a
// check that returned err: Redis, or policy, the failure policy's answer
// when Redis failed. The policy's Decision comes with an error matching
// [ratelimit.ErrDegraded], which httplimit logs (capped) and then obeys:
// a limit failing closed refuses, one failing open admits.
func markDecided(ctx context.Context, err error, policy string) {
	h, ok := ctx.Value(decidedByKey{}).(http.Header)
	if !ok {
		return
	}
	switch {
	case err == nil:
		h.Set(DecidedBy, "redis")
	case errors.Is(err, redisstore.ErrUnavailable):
		h.Set(DecidedBy, policy)
	}
}

func quote(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"symbol": "RTK", "price": "42.00"})
}

func labels(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"accepted": 10})
}
