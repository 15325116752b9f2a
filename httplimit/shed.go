package httplimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
)

// ClassFunc returns the priority class of a request for a load shedder
// ([Shed]): from its route, its authenticated caller, or a header set by a
// proxy the server trusts, never from what the client may claim (see
// [TrustedClassHeader]).
type ClassFunc func(*http.Request) ratelimit.Priority

// FixedClass returns a [ClassFunc] putting every request in class p: for
// a route whose requests all have one class.
func FixedClass(p ratelimit.Priority) ClassFunc {
	return func(*http.Request) ratelimit.Priority { return p }
}

// TrustedClassHeader returns a [ClassFunc] that reads the class of a
// request, by name, from the header name, and gives requests without it,
// or naming no class of s, the class fallback.
//
// Use it only for a header that something the server trusts sets and a
// client cannot: a gateway that authenticates callers and strips the
// header from what clients send. A client that could set it would put all
// its requests in the most important class, and defeat the shedder.
//
// It panics if s is nil, as [Shed] does.
func TrustedClassHeader(name string, s ratelimit.Shedder, fallback ratelimit.Priority) ClassFunc {
	if nilShedder(s) {
		panic("httplimit: TrustedClassHeader given a nil shedder")
	}
	name = http.CanonicalHeaderKey(name)
	classes := s.Classes()
	return func(r *http.Request) ratelimit.Priority {
		if v := r.Header.Get(name); v != "" {
			for i := range classes {
				if classes[i].Name == v {
					return ratelimit.Priority(i)
				}
			}
		}
		return fallback
	}
}

// Shed returns net/http middleware that sheds load: each request is
// admitted by s ([ratelimit.WorkerShedder], [ratelimit.FleetShedder]) in
// the class classOf gives it, and forwarded only if admitted. It holds its
// place in the work in progress until the handler returns, panics
// included; a handler that returns when its request's context ends gives
// it back on cancellation too. A nil classOf puts every request in the
// least important class.
//
// A request shed is answered 503 Service Unavailable, not 429: the server
// is overloaded, whoever is calling, where 429 says that this client is
// over its own quota. It carries Retry-After (the Decision's RetryAfter,
// the shedder's hint or what is left of a WorkerShedder's Hold, in whole
// seconds rounded up, at least 1), Cache-Control: no-store, no RateLimit
// fields, and a JSON body {"error":"overloaded","policy":...,"class":...,
// "retry_after_ms":...,"message":...}; a [WithDeniedHandler] replaces the
// body and chooses the status.
//
// Put Shed outside the rate limits, so that a request shed spends none of
// its client's allowance:
//
//	handler := httplimit.Shed(shedder, classOf)(httplimit.Middleware(store)(mux))
//
// Metrics by class come from the shedder: give it an Observer with
// [ratelimit.WithObserver], one that is also a [ratelimit.ShedObserver] to
// count by class.
//
// Of the options, [WithDeniedHandler], [WithErrorHandler] (for an error of
// a [ratelimit.FleetCounter]; [FailOpen] forwards the request without a
// place) and [WithLogger] (a line for each request shed, level Info) apply.
//
// Shed panics if s is nil; the function it returns panics for a nil
// handler.
func Shed(s ratelimit.Shedder, classOf ClassFunc, opts ...Option) func(http.Handler) http.Handler {
	if nilShedder(s) {
		panic("httplimit: Shed given a nil shedder; pass the one ratelimit.NewWorkerShedder or NewFleetShedder returned, after checking its error")
	}
	c := config{denied: overloaded, onError: FailOpen}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if classOf == nil {
		last := ratelimit.Priority(len(s.Classes()) - 1)
		classOf = FixedClass(last)
	}
	classes := s.Classes()
	errs := newErrorLog()
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit: nil handler")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := classOf(r)
			release, d, err := s.Admit(r.Context(), p)
			defer release()
			if err != nil {
				if r.Context().Err() != nil {
					writeJSON(w, http.StatusServiceUnavailable, problem{
						Error: "request_ended", Policy: policyName(d), Message: "the request ended before it was admitted",
					})
					return
				}
				err = fmt.Errorf("httplimit: shedder: %w", err)
				errs.log(r.Context(), c.logger, "httplimit: load not checked",
					slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
				if c.onError(w, r, err) {
					next.ServeHTTP(w, r)
				}
				return
			}
			if !d.Allowed {
				class := className(classes, p)
				setHeaders(w.Header(), "Retry-After", strconv.FormatInt(max(1, ceilDiv(d.RetryAfter, time.Second)), 10),
					"Cache-Control", "no-store")
				if c.logAll {
					c.logger.LogAttrs(r.Context(), slog.LevelInfo, "httplimit: shed", slog.String("policy", policyName(d)),
						slog.String("class", class), slog.String("method", r.Method), slog.String("path", r.URL.Path))
				}
				c.denied(w, r.WithContext(context.WithValue(r.Context(), shedClassKey{}, class)), d)
				return
			}
			next.ServeHTTP(w, r)
		})
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

// shedClassKey is the context key of a shed request's class name, for the
// default response.
type shedClassKey struct{}

// ShedClass returns the name of the class a request was shed in, from the
// request a [DeniedHandler] given to [Shed] receives, and "" elsewhere.
func ShedClass(r *http.Request) string {
	c, _ := r.Context().Value(shedClassKey{}).(string)
	return c
}

// className is the name of class p, out-of-range taken as the last.
func className(classes []ratelimit.ShedClass, p ratelimit.Priority) string {
	if p < 0 || int(p) >= len(classes) {
		p = ratelimit.Priority(len(classes) - 1)
	}
	return classes[p].Name
}

// overloadedBody is the JSON body of the default 503 for a request shed.
type overloadedBody struct {
	Error        string `json:"error"`
	Policy       string `json:"policy"`
	Class        string `json:"class"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

// overloaded is the default DeniedHandler of Shed.
func overloaded(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
	writeJSON(w, http.StatusServiceUnavailable, overloadedBody{
		Error:        "overloaded",
		Policy:       policyName(d),
		Class:        ShedClass(r),
		RetryAfterMs: ceilDiv(d.RetryAfter, time.Millisecond),
		Message:      "the server is overloaded and shed this request; retry later",
	})
}
