package grpclimit

import (
	"context"
	"fmt"
	"reflect"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratekit/ratelimit"
)

// ClassFunc returns the priority class of a call for a load shedder
// ([UnaryShedInterceptor]): from its method, its authenticated caller, or
// metadata set by a proxy the server trusts, never from what the client
// may claim (see [TrustedClassMetadata]).
type ClassFunc func(ctx context.Context, fullMethod string, md metadata.MD) ratelimit.Priority

// MethodClasses returns a [ClassFunc] giving each full method name
// ("/package.Service/Method") its class, and other methods fallback.
// The map is copied.
func MethodClasses(classes map[string]ratelimit.Priority, fallback ratelimit.Priority) ClassFunc {
	m := make(map[string]ratelimit.Priority, len(classes))
	for k, v := range classes {
		m[k] = v
	}
	return func(_ context.Context, method string, _ metadata.MD) ratelimit.Priority {
		if p, ok := m[method]; ok {
			return p
		}
		return fallback
	}
}

// TrustedClassMetadata returns a [ClassFunc] that reads the class of a
// call, by name, from the metadata key, and gives calls without it, or
// naming no class of s, the class fallback.
//
// Use it only for metadata that something the server trusts sets and a
// client cannot: a gateway that authenticates callers and strips the key
// from what clients send. A client that could set it would put all its
// calls in the most important class. It panics if s is nil.
func TrustedClassMetadata(key string, s ratelimit.Shedder, fallback ratelimit.Priority) ClassFunc {
	if nilShedder(s) {
		panic("grpclimit: TrustedClassMetadata given a nil shedder")
	}
	classes := s.Classes()
	return func(_ context.Context, _ string, md metadata.MD) ratelimit.Priority {
		if v := md.Get(key); len(v) > 0 {
			for i := range classes {
				if classes[i].Name == v[0] {
					return ratelimit.Priority(i)
				}
			}
		}
		return fallback
	}
}

// nilShedder reports whether s is nil or a nil pointer.
func nilShedder(s ratelimit.Shedder) bool {
	if s == nil {
		return true
	}
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// shedder is the state both shedding interceptors share.
type shedder struct {
	s       ratelimit.Shedder
	classOf ClassFunc
	classes []ratelimit.ShedClass
	onError ErrorHandler
	skip    func(ctx context.Context, fullMethod string) bool
}

func newShedder(s ratelimit.Shedder, classOf ClassFunc, opts []Option) *shedder {
	if nilShedder(s) {
		panic("grpclimit: shedding interceptor given a nil shedder; pass the one ratelimit.NewWorkerShedder or NewFleetShedder returned, after checking its error")
	}
	c := config{onError: FailOpen}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	sh := &shedder{s: s, classOf: classOf, classes: s.Classes(), onError: c.onError, skip: c.skip}
	if sh.classOf == nil {
		last := ratelimit.Priority(len(sh.classes) - 1)
		sh.classOf = func(context.Context, string, metadata.MD) ratelimit.Priority { return last }
	}
	return sh
}

// UnaryShedInterceptor returns a unary server interceptor that sheds load:
// each call is admitted by s ([ratelimit.WorkerShedder],
// [ratelimit.FleetShedder]) in the class classOf gives it, and its handler
// runs only if it is admitted, holding its place in the work in progress
// until the handler returns (or panics). A nil classOf puts every call in
// the least important class.
//
// A call shed ends with codes.Unavailable, not ResourceExhausted: the
// server is overloaded, whoever is calling, where ResourceExhausted says
// that this client is over its own quota. Its status carries a
// google.rpc.RetryInfo detail with the shedder's RetryAfter, a hint, which
// [UnaryClientInterceptor] waits out before it tries again and
// [RetryDelay] reads.
//
// Chain it before the rate-limiting interceptor, so that a call shed
// spends none of its client's allowance:
//
//	grpc.ChainUnaryInterceptor(grpclimit.UnaryShedInterceptor(shedder, classOf), grpclimit.UnaryServerInterceptor(store))
//
// Metrics by class come from the shedder's Observer (see
// [ratelimit.ShedObserver]).
//
// Of the options, [WithErrorHandler] (for an error of a
// [ratelimit.FleetCounter]; [FailOpen] lets the call go on without a
// place) and [WithSkip] apply. It panics if s is nil.
func UnaryShedInterceptor(s ratelimit.Shedder, classOf ClassFunc, opts ...Option) grpc.UnaryServerInterceptor {
	sh := newShedder(s, classOf, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if sh.skip != nil && sh.skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		release, err := sh.admit(ctx, info.FullMethod)
		defer release()
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamShedInterceptor returns a stream server interceptor that admits
// each stream when it opens, as [UnaryShedInterceptor] admits a call; the
// stream holds its place until its handler returns.
func StreamShedInterceptor(s ratelimit.Shedder, classOf ClassFunc, opts ...Option) grpc.StreamServerInterceptor {
	sh := newShedder(s, classOf, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if sh.skip != nil && sh.skip(ss.Context(), info.FullMethod) {
			return handler(srv, ss)
		}
		release, err := sh.admit(ss.Context(), info.FullMethod)
		defer release()
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// admit admits a call; the error ends it (nil lets it go on).
func (sh *shedder) admit(ctx context.Context, method string) (ratelimit.Release, error) {
	in, _ := metadata.FromIncomingContext(ctx)
	if in == nil {
		in = metadata.MD{}
	}
	p := sh.classOf(ctx, method, in)
	release, d, err := sh.s.Admit(ctx, p)
	if err != nil {
		if ctx.Err() != nil {
			return release, status.FromContextError(ctx.Err()).Err()
		}
		return release, sh.onError(ctx, method, fmt.Errorf("grpclimit: shedder: %w", err))
	}
	if d.Allowed {
		return release, nil
	}
	if p < 0 || int(p) >= len(sh.classes) {
		p = ratelimit.Priority(len(sh.classes) - 1)
	}
	st := status.Newf(codes.Unavailable, "grpclimit: overloaded: %q shed a call of class %q; retry in %v",
		policyName(d), sh.classes[p].Name, d.RetryAfter)
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = ds
	}
	return release, st.Err()
}
