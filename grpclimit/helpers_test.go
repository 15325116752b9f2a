package grpclimit_test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service, registered by hand so that it needs no generated code:
// Say echoes a string, and Chat echoes every message of a stream.
const (
	sayMethod  = "/grpclimit.test.Echo/Say"
	chatMethod = "/grpclimit.test.Echo/Chat"
)

// echo counts the calls that reached a handler.
type echo struct{ calls atomic.Int64 }

var echoDesc = grpc.ServiceDesc{
	ServiceName: "grpclimit.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Say",
		Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(wrapperspb.StringValue)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				srv.(*echo).calls.Add(1)
				return wrapperspb.String(req.(*wrapperspb.StringValue).GetValue()), nil
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: sayMethod}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Chat",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			srv.(*echo).calls.Add(1)
			for {
				m := new(wrapperspb.StringValue)
				if err := ss.RecvMsg(m); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				if err := ss.SendMsg(m); err != nil {
					return err
				}
			}
		},
	}},
}

// serve starts the echo service behind opts on a loopback listener and
// returns a client connected to it (with copts) and the service. Both stop
// when the test ends.
func serve(t *testing.T, opts []grpc.ServerOption, copts ...grpc.DialOption) (*grpc.ClientConn, *echo) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	e := &echo{}
	srv.RegisterService(&echoDesc, e)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	copts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, copts...)
	cc, err := grpc.NewClient(lis.Addr().String(), copts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc, e
}

// testCtx is a context for one call: every blocking wait in these tests
// ends within a few seconds, whatever happens.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// say calls Say with the API key (none if empty) and returns the reply, the
// response header and the error.
func say(ctx context.Context, cc *grpc.ClientConn, apiKey string) (string, metadata.MD, error) {
	if apiKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", apiKey)
	}
	var hdr metadata.MD
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, sayMethod, wrapperspb.String("hi"), out, grpc.Header(&hdr))
	return out.GetValue(), hdr, err
}

var chatDesc = &grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true}

// chat opens a Chat stream with the API key (none if empty).
func chat(ctx context.Context, cc *grpc.ClientConn, apiKey string) (grpc.ClientStream, error) {
	if apiKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", apiKey)
	}
	return cc.NewStream(ctx, chatDesc, chatMethod)
}

// roundTrip sends s on the stream and returns what comes back.
func roundTrip(cs grpc.ClientStream, s string) (string, error) {
	if err := cs.SendMsg(wrapperspb.String(s)); err != nil && err != io.EOF {
		return "", err
	}
	m := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(m); err != nil {
		return "", err
	}
	return m.GetValue(), nil
}
