// Command server is a small gRPC service behind a rate limit per API key,
// showing the grpclimit interceptors:
//
//   - ratekit.example.Greeter/Hello answers "hello, <name>"; every call must
//     carry an API key in the x-api-key metadata field (a call without one
//     is refused with Unauthenticated), and each key may make 5 calls at
//     once and 2 a second after that (GCRA, named "per-key");
//   - ratekit.example.Greeter/HelloAll, a bulk call, costs 5 of them;
//   - the standard health service (grpc.health.v1.Health) is not limited.
//
// A call over its limit is refused with ResourceExhausted and a RetryInfo
// giving the exact wait; every limited call carries the ratelimit-policy and
// ratelimit metadata fields. The Greeter service is registered by hand, on
// the protobuf well-known type StringValue, so it needs no generated code.
//
// Usage:
//
//	go run ./examples/server [-addr 127.0.0.1:50051]
//	go run ./examples/server -demo
//
// -demo starts the server on a free loopback port, makes a few calls
// against it, first a burst that goes over the limit and then one through
// a client that waits out the RetryInfo, prints what each got, and exits.
// SIGINT or SIGTERM stops the server, letting calls in flight finish.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
)

// The Greeter's methods.
const (
	helloMethod    = "/ratekit.example.Greeter/Hello"
	helloAllMethod = "/ratekit.example.Greeter/HelloAll"
)

// greeterDesc registers the Greeter by hand: each method takes and returns
// a StringValue.
var greeterDesc = grpc.ServiceDesc{
	ServiceName: "ratekit.example.Greeter",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Hello", Handler: unary(helloMethod, func(name string) string { return "hello, " + name })},
		{MethodName: "HelloAll", Handler: unary(helloAllMethod, func(names string) string { return "hello, all of " + names })},
	},
}

// unary adapts f to a gRPC method handler that runs the server's
// interceptors.
func unary(method string, f func(string) string) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
		req := new(wrapperspb.StringValue)
		if err := dec(req); err != nil {
			return nil, err
		}
		h := func(_ context.Context, req any) (any, error) {
			return wrapperspb.String(f(req.(*wrapperspb.StringValue).GetValue())), nil
		}
		if in == nil {
			return h(ctx, req)
		}
		return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
	}
}

// rule is the limit of each API key.
var rule = ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 5, Name: "per-key"}

// newServer returns the service with its limits, on a store reading clk.
func newServer(clk ratelimit.Clock) (*grpc.Server, error) {
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithMaxKeys(100_000))
	if err != nil {
		return nil, err
	}
	opts := []grpclimit.Option{
		grpclimit.WithKey(grpclimit.MetadataKey("x-api-key", nil)),
		grpclimit.WithCost(grpclimit.MethodCosts(map[string]ratelimit.Units{helloAllMethod: 5 * ratelimit.Unit}, ratelimit.Unit)),
		grpclimit.WithSkip(func(_ context.Context, method string) bool {
			return method == healthpb.Health_Check_FullMethodName || method == healthpb.Health_Watch_FullMethodName ||
				method == healthpb.Health_List_FullMethodName
		}),
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(store, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(store, opts...)),
	)
	srv.RegisterService(&greeterDesc, struct{}{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "address to listen on")
	demo := flag.Bool("demo", false, "serve on a free loopback port, make a few calls against it, and exit")
	flag.Parse()
	log.SetFlags(0)

	if *demo {
		*addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := newServer(ratelimit.SystemClock())
	if err != nil {
		log.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	if *demo {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := runDemo(ctx, lis.Addr().String(), ratelimit.SystemClock(), os.Stdout)
		srv.GracefulStop()
		if err != nil {
			log.Fatal(err)
		}
		return
	}

	log.Printf("serving ratekit.example.Greeter on %s: %s per API key (x-api-key); HelloAll costs 5",
		lis.Addr(), "5 at once, 2/s")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
		log.Print("stopping")
		srv.GracefulStop()
	case err := <-served:
		log.Fatal(err)
	}
}

// hello calls Hello as the API key, through conn, and describes the
// outcome.
func hello(ctx context.Context, conn *grpc.ClientConn, apiKey, name string) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", apiKey)
	var hdr metadata.MD
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, helloMethod, wrapperspb.String(name), out, grpc.Header(&hdr))
	fields := fmt.Sprintf("[ratelimit: %s]", hdr.Get(grpclimit.LimitField))
	if err != nil {
		if d, ok := grpclimit.RetryDelay(err); ok {
			return fmt.Sprintf("%v, retry in %v %s", status.Code(err), d, fields), nil
		}
		return "", err
	}
	return fmt.Sprintf("%q %s", out.GetValue(), fields), nil
}

// runDemo makes a burst of calls against the server at addr, then one
// through a client that waits out the server's RetryInfo on clk, writing
// what each got to w.
func runDemo(ctx context.Context, addr string, clk ratelimit.Clock, w io.Writer) error {
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer plain.Close()
	for i := 1; i <= 7; i++ {
		got, err := hello(ctx, plain, "alice", "alice")
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "alice #%d: %s\n", i, got)
	}
	got, err := hello(ctx, plain, "bob", "bob")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "bob #1: %s\n", got)

	patient, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.WithRetries(3), grpclimit.WithClock(clk))))
	if err != nil {
		return err
	}
	defer patient.Close()
	got, err = hello(ctx, patient, "alice", "alice")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "alice, waiting out RetryInfo: %s\n", got)
	return nil
}
