package main

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/grpclimit"
)

// start serves the example on a loopback port, its store on a ManualClock,
// and returns its address and the clock. It stops when the test ends.
func start(t *testing.T) (string, *ratelimit.ManualClock) {
	t.Helper()
	clk := ratelimit.NewManualClock(0)
	srv, err := newServer(clk)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), clk
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func call(ctx context.Context, conn *grpc.ClientConn, method, apiKey string) error {
	if apiKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", apiKey)
	}
	return conn.Invoke(ctx, method, wrapperspb.String("x"), new(wrapperspb.StringValue))
}

func TestLimitsPerAPIKey(t *testing.T) {
	addr, clk := start(t)
	conn := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i := range 5 {
		require.NoError(t, call(ctx, conn, helloMethod, "alice"), "call %d", i+1)
	}
	err := call(ctx, conn, helloMethod, "alice")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	d, ok := grpclimit.RetryDelay(err)
	require.True(t, ok)
	assert.Equal(t, 500*time.Millisecond, d)

	// HelloAll costs 5: bob's first takes his whole burst.
	require.NoError(t, call(ctx, conn, helloAllMethod, "bob"))
	err = call(ctx, conn, helloMethod, "bob")
	d, _ = grpclimit.RetryDelay(err)
	assert.Equal(t, 500*time.Millisecond, d)

	assert.Equal(t, codes.Unauthenticated, status.Code(call(ctx, conn, helloMethod, "")))

	// Health checks need no key and are not limited.
	hc := healthpb.NewHealthClient(conn)
	for range 10 {
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, res.GetStatus())
	}

	clk.Advance(d)
	require.NoError(t, call(ctx, conn, helloMethod, "alice"))
}

func TestDemo(t *testing.T) {
	addr, clk := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- runDemo(ctx, addr, clk, &out) }()
	// The last call is refused and waits its RetryInfo on the clock.
	require.NoError(t, clk.BlockUntilSleepers(ctx, 1))
	clk.Advance(500 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the demo never ended")
	}
	want := `alice #1: "hello, alice" [ratelimit: ["per-key";r=4;t=1]]
alice #2: "hello, alice" [ratelimit: ["per-key";r=3;t=1]]
alice #3: "hello, alice" [ratelimit: ["per-key";r=2;t=2]]
alice #4: "hello, alice" [ratelimit: ["per-key";r=1;t=2]]
alice #5: "hello, alice" [ratelimit: ["per-key";r=0;t=3]]
alice #6: ResourceExhausted, retry in 500ms [ratelimit: ["per-key";r=0;t=3]]
alice #7: ResourceExhausted, retry in 500ms [ratelimit: ["per-key";r=0;t=3]]
bob #1: "hello, bob" [ratelimit: ["per-key";r=4;t=1]]
alice, waiting out RetryInfo: "hello, alice" [ratelimit: ["per-key";r=0;t=3]]
`
	assert.Equal(t, want, out.String())
}
