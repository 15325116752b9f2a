// Command server is the HTTP API of examples/server with every limit kept
// in Redis, so that any number of replicas behind a load balancer share
// one allowance per client instead of granting one each:
//
//   - GET /quote is limited per API key (the X-API-Key header), or per
//     client address for requests without one, by the plan of the key: by
//     default every key is on plan "free", a token bucket of 10 per second
//     with bursts of 20; at most 4 quotes of a key are in progress at once
//     across every replica (a redisstore.InFlight), and a quote refused for
//     either limit spends nothing of the other;
//   - POST /labels:batch spends the same per-key allowance, at 10 units a
//     call;
//   - POST /login checks a form field "password" against -password: only
//     failed logins count, 5 a minute per client address, and 5 failures
//     within a minute lock the address out for 15 minutes on every replica
//     (a redisstore.Lockout; 429 with the exact Retry-After);
//   - GET / lists these routes and their limits.
//
// Each limit is used through httplimit's middleware, which checks with the
// request's context, so a client that goes away cancels its check.
// Decisions run on the Redis server's clock.
//
// When Redis fails (an error, or no answer within the 100 ms deadline),
// each limit's failure policy answers, and the server answers as that
// Decision says: /login fails closed (a lockout that opens when Redis is
// down would let guesses through uncounted: 429 with Retry-After), and
// /quote and /labels:batch follow -failure:
//
//   - open (the default): admitted, as if the key were fresh (and a quote
//     holds no slot);
//   - closed: refused, 429 with a Retry-After of one second (the circuit's
//     pause, 250 ms, rounded up);
//   - fallback: decided by in-process limits with the same rules (and an
//     in-process in-flight limit of 4), so that each replica limits on its
//     own until Redis is back.
//
// Failures are logged, at most a few lines a second. -deny-cache sets how
// many refused keys each plan of one rule, and the login limit, remember to
// refuse again without a round trip (see redisstore.WithDenyCache; 0 turns
// it off). With -decided-by,
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
//	    [-trust 10.0.0.0/8,...] [-rules rules.json] [-password letmein] [-work 0s]
//	    [-failure open|closed|fallback] [-deny-cache 10000] [-decided-by]
//
// -rules reads the plans, and which API keys are on which plan, from a file
// in the format of examples/server's (examples/server/rules.json is one). A
// SIGHUP reads it again, and a file that does not read or validate is
// refused, logged, and changes nothing. The plans are a redisstore.Plans,
// and a SIGHUP is its Update with ratelimit.MigrateProportional: a key whose
// plan's rule changed, or that moved to another plan, keeps what it had
// used, in Redis, on every replica. Reload the replicas one after another:
// while some run the old rules and some the new, a key moves between them
// as its requests alternate, and no move hands it a fresh allowance.
//
// -trust lists the networks of reverse proxies in front of the server; their
// X-Forwarded-For is believed. -work makes each quote take that long, so
// that quotes stay in progress and their in-flight limit shows.
//
// Start two or three on different -addr with the same -redis and spread
// requests over them: together they admit what one admits alone. One curl
// sending 40 quotes in a row, more than the burst of 20 and what the rate
// earns meanwhile, shows the last ones refused; with -work 2s, 6 quotes at
// once show 2 refused for the in-flight limit; then a wrong password:
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
	"time"

	"github.com/ratekit/ratelimit/internal/exampleserver"
	"github.com/redis/go-redis/v9"
)

func main() { exampleserver.Main(run) }

// run serves until ctx ends, then shuts down, waiting up to 10 s for
// requests in flight. It logs to logw, and calls ready (if not nil) with the
// listening address once connections are accepted.
func run(ctx context.Context, args []string, logw io.Writer, ready func(net.Addr)) error {
	f, fs := exampleserver.NewFlags(logw)
	redisAddr := fs.String("redis", "127.0.0.1:6379", "`host:port` of the Redis that keeps the limits")
	cfg := defaultConfig()
	fs.StringVar(&cfg.failure, "failure", cfg.failure, "what /quote and /labels:batch answer when Redis fails: `open, closed or fallback`")
	fs.IntVar(&cfg.denyCache, "deny-cache", cfg.denyCache, "how many refused `keys` each plan of one rule and the login limit remember (0: none)")
	fs.BoolVar(&cfg.decidedBy, "decided-by", cfg.decidedBy, "say in "+DecidedBy+" which path decided each response")
	if err := f.Parse(args); err != nil {
		return err
	}
	if _, ok := failurePolicies[cfg.failure]; !ok {
		return fmt.Errorf("-failure: %q is not open, closed or fallback", cfg.failure)
	}
	cfg.proxies, cfg.rules, cfg.password, cfg.work = f.Proxies, f.Rules, f.Password, f.Work

	rdb := redis.NewClient(clientOptions(*redisAddr))
	defer rdb.Close()
	ping, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := rdb.Ping(ping).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", *redisAddr, err)
	}

	logger := slog.New(slog.NewTextHandler(logw, nil))
	a, err := newAPI(logger, rdb, cfg)
	if err != nil {
		return err
	}
	exampleserver.PrintRoutes(logw, *a.table.Load())
	defer exampleserver.ReloadOnHangup(ctx, f.RulesPath, a.reload)()
	return exampleserver.Serve(ctx, f.Addr, a.handler, logger, ready, "redis", *redisAddr)
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
	failure   string                  // a key of failurePolicies
	denyCache int                     // redisstore.WithDenyCache's n
	decidedBy bool                    // set DecidedBy on every limited response
	rules     exampleserver.RulesFile // -rules, or exampleserver.DefaultRules
	password  string                  // what POST /login accepts
	work      time.Duration           // how long a quote takes
	proxies   []netip.Prefix          // trusted reverse proxies

	// quoteWait, if set, is called by every quote before it answers
	// (tests hold quotes in progress with it); -work sets one.
	quoteWait func(*http.Request)
}

// defaultConfig is the flags' defaults.
func defaultConfig() config {
	return config{failure: "open", denyCache: 10_000, rules: exampleserver.DefaultRules(), password: "letmein"}
}

// failurePolicies maps -failure to the value of DecidedBy for the answers
// of that policy.
var failurePolicies = map[string]string{"open": "fail-open", "closed": "fail-closed", "fallback": "fallback"}

// DecidedBy is the response field that says, with -decided-by, which path
// decided a limited request: "redis", or the failure policy's "fail-open",
// "fail-closed" or "fallback".
const DecidedBy = "X-Ratelimit-Decided-By"

func reply(w http.ResponseWriter, v any) { exampleserver.Reply(w, v) }
