// Command server is a small HTTP API behind rate limits, showing the
// httplimit middleware:
//
//   - GET /quote is limited per API key (the X-API-Key header), or per
//     client address for requests without one, by a token bucket of 10 per
//     second with bursts of 20;
//   - POST /labels:batch spends the same per-key bucket, at 10 units a call;
//   - POST /login is limited per client address by a sliding log of 5
//     attempts per minute, successful or not;
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
//	go run ./examples/server [-addr 127.0.0.1:8080] [-trust 10.0.0.0/8,...]
//
// -trust lists the networks of reverse proxies in front of the server; their
// X-Forwarded-For is believed. By default nothing is trusted and clients are
// keyed by the address they connect from. Try it:
//
//	for i in $(seq 25); do curl -s -o /dev/null -w '%{http_code} ' localhost:8080/quote; done
//	curl -si -X POST localhost:8080/login
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
	"net/netip"
	"os"
	"os/signal"
	"strings"
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

	logger := slog.New(slog.NewTextHandler(logw, nil))
	h, table, err := routes(logger, proxies)
	if err != nil {
		return err
	}
	fmt.Fprintln(logw, "routes:")
	for _, r := range table {
		fmt.Fprintf(logw, "  %-20s %s\n", r.Route, r.Limit)
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

// routes builds the API with its limits, and the list of its routes.
func routes(logger *slog.Logger, proxies []netip.Prefix) (http.Handler, []route, error) {
	apiRule := ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}
	loginRule := ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"}
	const batchCost = 10
	api, err := ratelimit.NewStore(apiRule)
	if err != nil {
		return nil, nil, err
	}
	logins, err := ratelimit.NewStore(loginRule)
	if err != nil {
		return nil, nil, err
	}

	client := httplimit.ClientIP{TrustedProxies: proxies}
	byAPIKey := httplimit.WithKey(httplimit.HeaderKey("X-API-Key", client.Key))
	// WithLogger: one line for each refused request (none without it).
	logTo := httplimit.WithLogger(logger)
	perKey := httplimit.Middleware(api, byAPIKey, logTo)
	perKeyBatch := httplimit.Middleware(api, byAPIKey, logTo, httplimit.WithCost(httplimit.FixedCost(batchCost*ratelimit.Unit)))
	perAddr := httplimit.Middleware(logins, httplimit.WithKey(client.Key), logTo)

	apiLimit := fmt.Sprintf("%q: token bucket, %d per %v, bursts of %d, per X-API-Key or else client address",
		apiRule.Name, apiRule.Rate.Count, apiRule.Rate.Per, apiRule.Burst)
	table := []route{
		{"GET /quote", apiLimit + ", 1 a call"},
		{"POST /labels:batch", apiLimit + fmt.Sprintf(", %d a call", batchCost)},
		{"POST /login", fmt.Sprintf("%q: sliding log, %d per %v, per client address",
			loginRule.Name, loginRule.Limit, loginRule.Window)},
		{"GET /", "none: this list"},
	}
	mux := http.NewServeMux()
	mux.Handle(table[0].Route, perKey(http.HandlerFunc(quote)))
	mux.Handle(table[1].Route, perKeyBatch(http.HandlerFunc(labels)))
	mux.Handle(table[2].Route, perAddr(http.HandlerFunc(login)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, map[string]any{"routes": table})
	})
	return mux, table, nil
}

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
