// Command server is an HTTP API behind a rate limit that Prometheus can
// watch: GET /hello is limited per client address by a token bucket of 10
// requests a minute with bursts of 10 (policy "hello"), through the
// httplimit middleware over a Store; GET /metrics serves the limiter's
// metrics (package ratelimitprom) for Prometheus to scrape.
//
// Usage, from the ratelimitprom directory:
//
//	go run ./examples/server [-addr 127.0.0.1:8080]
//
// Try it:
//
//	for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' localhost:8080/hello; done
//	curl -s localhost:8080/metrics | grep ^ratelimit_
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/ratelimitprom"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		log.Fatal(err)
	}
}

// run serves until ctx ends, then shuts down cleanly. ready, if not nil,
// is called with the address once the server accepts connections.
func run(ctx context.Context, args []string, logw io.Writer, ready func(net.Addr)) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(logw)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	handler, err := newHandler()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(logw, "listening on http://%s (GET /hello, GET /metrics)\n", ln.Addr())
	if ready != nil {
		ready(ln.Addr())
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newHandler builds the limiter, its metrics and the routes.
func newHandler() (http.Handler, error) {
	obs := ratelimitprom.NewObserver()
	store, err := ratelimit.NewStore(
		ratelimit.TokenBucket{Rate: ratelimit.PerMinute(10), Burst: 10, Name: "hello"},
		ratelimit.WithMaxKeys(100_000), ratelimit.WithObserver(obs))
	if err != nil {
		return nil, err
	}
	col := ratelimitprom.NewCollector()
	if err := col.AddStore("hello", store); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs, col)

	mux := http.NewServeMux()
	limit := httplimit.Middleware(store)
	mux.Handle("GET /hello", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux, nil
}
