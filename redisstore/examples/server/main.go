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
// cancels its check. Decisions run on the Redis server's clock. When Redis
// fails, /quote and /labels:batch fail open (a request is served as if its
// key were fresh) and /login fails closed; either way the failure is
// logged.
//
// Usage:
//
//	go run ./examples/server [-addr 127.0.0.1:8080] [-redis 127.0.0.1:6379]
//
// Start two or three on different -addr with the same -redis and spread
// requests over them: together they admit what one admits alone.
//
//	for i in $(seq 25); do curl -s -o /dev/null -w '%{http_code} ' localhost:8080/quote; done
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ping, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := rdb.Ping(ping).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", *redisAddr, err)
	}

	logger := slog.New(slog.NewTextHandler(logw, nil))
	h, err := routes(logger, rdb)
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

// routes builds the API with its limits in the Redis rdb talks to; opts
// are added to every store's (tests give a client clock and a prefix).
func routes(logger *slog.Logger, rdb redis.UniversalClient, opts ...redisstore.Option) (http.Handler, error) {
	api, err := redisstore.New(rdb, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}, opts...)
	if err != nil {
		return nil, err
	}
	logins, err := redisstore.New(rdb, ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"},
		append([]redisstore.Option{redisstore.WithFailureMode(redisstore.FailClosed)}, opts...)...)
	if err != nil {
		return nil, err
	}

	client := httplimit.ClientIP{}
	byAPIKey := httplimit.WithKey(httplimit.HeaderKey("X-API-Key", client.Key))
	logTo := httplimit.WithLogger(logger)
	perKey := httplimit.Middleware(api, byAPIKey, logTo)
	perKeyBatch := httplimit.Middleware(api, byAPIKey, logTo, httplimit.WithCost(httplimit.FixedCost(10*ratelimit.Unit)))
	perAddr := httplimit.Middleware(logins, httplimit.WithKey(client.Key), logTo)

	mux := http.NewServeMux()
	mux.Handle("GET /quote", perKey(http.HandlerFunc(quote)))
	mux.Handle("POST /labels:batch", perKeyBatch(http.HandlerFunc(labels)))
	mux.Handle("POST /login", perAddr(http.HandlerFunc(login)))
	return mux, nil
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
