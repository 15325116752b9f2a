// Command server is the HTTP API of examples/server with every limit kept
// in Redis, so that any number of replicas behind a load balancer share
// one allowance per client instead of granting one each:
//
//   - GET /quote is limited per API key (the X-API-Key header), or per
//     client address for requests without one, by a token bucket of 10 per
//     second with bursts of 20;
//   - POST /labels:batch spends the same per-key bucket, at 10 units a call;
//   - POST /login is limited per client address by a sliding log of 5
//     attempts per minute, successful or not.
//
// Each limit is a [redisstore.Store] used through httplimit.Middleware,
// which checks with the request's context, so a client that goes away
// cancels its check. Decisions run on the Redis server's clock.
//
// When Redis fails (an error, or no answer within the store's 100 ms
// deadline), the store's failure policy answers, and the server answers as
// that Decision says: /login fails closed (refused, 429 with Retry-After),
// and /quote and /labels:batch follow -failure:
//
//   - open (the default): admitted, as if the key were fresh;
//   - closed: refused, 429 with a Retry-After of one second (the circuit's
//     pause, 250 ms, rounded up);
//   - fallback: decided by an in-process store with the same rule, so that
//     each replica limits on its own until Redis is back.
//
// Failures are logged, at most a few lines a second. -deny-cache sets how
// many refused keys each store remembers to refuse again without a round
// trip (see redisstore.WithDenyCache; 0 turns it off). With -decided-by,
// every limited response carries a field saying which path decided it:
//
//	X-Ratelimit-Decided-By: redis | fail-open | fail-closed | fallback
//
// "redis" includes the refusals the deny cache repeats from Redis's own.
// It is meant for tests and load runs (redisstore/bench/cmd/load measures
// the recovery after an outage with it), not for clients.
//
// Usage:
//
//	go run ./examples/server [-addr 127.0.0.1:8080] [-redis 127.0.0.1:6379]
//	    [-failure open|closed|fallback] [-deny-cache 10000] [-decided-by]
//
// Start two or three on different -addr with the same -redis and spread
// requests over them: together they admit what one admits alone. One curl
// sending 40 quotes in a row, more than the burst of 20 and what the rate
// earns meanwhile, shows the last ones refused:
//
//	curl -s -o /dev/null -w '%{http_code} ' 'localhost:8080/quote?n=[1-40]'; echo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
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
	redisAddr := fs.String("redis", "127.0.0.1:6379", "`host:port` of the Redis that keeps the limits")
	cfg := defaultConfig()
	fs.StringVar(&cfg.failure, "failure", cfg.failure, "what /quote and /labels:batch answer when Redis fails: `open, closed or fallback`")
	fs.IntVar(&cfg.denyCache, "deny-cache", cfg.denyCache, "how many refused `keys` each store remembers (0: none)")
	fs.BoolVar(&cfg.decidedBy, "decided-by", cfg.decidedBy, "say in "+DecidedBy+" which path decided each response")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if _, ok := failurePolicies[cfg.failure]; !ok {
		return fmt.Errorf("-failure: %q is not open, closed or fallback", cfg.failure)
	}

	rdb := redis.NewClient(clientOptions(*redisAddr))
	defer rdb.Close()
	ping, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := rdb.Ping(ping).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", *redisAddr, err)
	}

	logger := slog.New(slog.NewTextHandler(logw, nil))
	h, err := routes(logger, rdb, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "redis", *redisAddr)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// clientOptions are the go-redis options of the server's client. A check
// has a deadline of its own, shorter than go-redis's pause between
// retries, so a retry could only turn the reason a check failed (a
// connection refused, say) into that deadline's: the client dials once and
// sends once, and the store's circuit breaker does the retrying.
func clientOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}
}

// config is what the flags choose beyond the addresses.
type config struct {
	failure   string // a key of failurePolicies
	denyCache int    // redisstore.WithDenyCache's n
	decidedBy bool   // set DecidedBy on every limited response
}

// defaultConfig is the flags' defaults.
func defaultConfig() config {
	return config{failure: "open", denyCache: 10_000}
}

// failurePolicies maps -failure to the value of DecidedBy for the answers
// of that policy.
var failurePolicies = map[string]string{"open": "fail-open", "closed": "fail-closed", "fallback": "fallback"}

// DecidedBy is the response field that says, with -decided-by, which path
// decided a limited request: "redis", or the failure policy's "fail-open",
// "fail-closed" or "fallback".
const DecidedBy = "X-Ratelimit-Decided-By"

// routes builds the API with its limits in the Redis rdb talks to; opts
// are added to every store's (tests give a client clock and a prefix).
func routes(logger *slog.Logger, rdb redis.UniversalClient, cfg config, opts ...redisstore.Option) (http.Handler, error) {
	if _, ok := failurePolicies[cfg.failure]; !ok {
		return nil, fmt.Errorf("unknown failure policy %q", cfg.failure)
	}
	rule := ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}
	apiOpts := []redisstore.Option{redisstore.WithDenyCache(cfg.denyCache)}
	switch cfg.failure {
	case "closed":
		apiOpts = append(apiOpts, redisstore.WithFailureMode(redisstore.FailClosed))
	case "fallback":
		local, err := ratelimit.NewStore(rule)
		if err != nil {
			return nil, err
		}
		apiOpts = append(apiOpts, redisstore.WithFallback(local))
	}
	api, err := redisstore.New(rdb, rule, append(apiOpts, opts...)...)
	if err != nil {
		return nil, err
	}
	logins, err := redisstore.New(rdb, ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"},
		append([]redisstore.Option{redisstore.WithFailureMode(redisstore.FailClosed), redisstore.WithDenyCache(cfg.denyCache)}, opts...)...)
	if err != nil {
		return nil, err
	}
	client := httplimit.ClientIP{}
	byAPIKey := httplimit.WithKey(httplimit.HeaderKey("X-API-Key", client.Key))
	logTo := httplimit.WithLogger(logger)
	apiLim := &policyAnswers{s: api, policy: failurePolicies[cfg.failure]}
	loginLim := &policyAnswers{s: logins, policy: "fail-closed"}
	perKey := httplimit.Middleware(apiLim, byAPIKey, logTo)
	perKeyBatch := httplimit.Middleware(apiLim, byAPIKey, logTo, httplimit.WithCost(httplimit.FixedCost(10*ratelimit.Unit)))
	perAddr := httplimit.Middleware(loginLim, httplimit.WithKey(client.Key), logTo)

	mux := http.NewServeMux()
	mux.Handle("GET /quote", perKey(http.HandlerFunc(quote)))
	mux.Handle("POST /labels:batch", perKeyBatch(http.HandlerFunc(labels)))
	mux.Handle("POST /login", perAddr(http.HandlerFunc(login)))
	if !cfg.decidedBy {
		return mux, nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decidedByKey{}, w.Header())))
	}), nil
}

// decidedByKey is the context key under which routes passes the response's
// header to policyAnswers, for DecidedBy.
type decidedByKey struct{}

// policyAnswers is a Redis store that says, with -decided-by, which path
// decided each request: Redis, or its failure policy when Redis failed.
// The policy's Decision comes with an error matching
// [ratelimit.ErrDegraded], which httplimit logs (capped) and then obeys: a
// store failing closed refuses, one failing open admits.
type policyAnswers struct {
	s      *redisstore.Store
	policy string // DecidedBy's value for the failure policy's answers
}

func (p *policyAnswers) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return p.CheckContext(context.Background(), key, cost)
}

func (p *policyAnswers) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	d, err := p.s.CheckContext(ctx, key, cost)
	if h, ok := ctx.Value(decidedByKey{}).(http.Header); ok {
		switch {
		case err == nil:
			h.Set(DecidedBy, "redis")
		case errors.Is(err, redisstore.ErrUnavailable):
			h.Set(DecidedBy, p.policy)
		}
	}
	return d, err
}

// Clock is the store's, so that httplimit waits on it.
func (p *policyAnswers) Clock() ratelimit.Clock { return p.s.Clock() }

func quote(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"symbol": "RTK", "price": "42.00"})
}

func labels(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"accepted": 10})
}

// login stands in for a real one: the limit counts attempts, whether or not
// the credentials turn out to be right.
func login(w http.ResponseWriter, _ *http.Request) {
	reply(w, map[string]any{"ok": true})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
