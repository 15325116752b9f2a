package bench

import (
	"net"
	"net/http"
	"time"

	"github.com/go-chi/httprate"
	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	golimithttp "github.com/sethvargo/go-limiter/httplimit"
)

// HTTP is an HTTP middleware subject: New wraps next in the subject's
// middleware, keyed by the client's address (RemoteAddr), under the limit
// of the scenario, and returns a func that releases it.
type HTTP struct {
	Name string
	Ours bool
	New  func(sc Scenario, next http.Handler) (http.Handler, func())
}

// Admitted is the handler behind every HTTP subject: it answers 204 No
// Content, so that a response with that status is an admitted request.
var Admitted = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusNoContent)
})

// Client is the RemoteAddr of every request of the HTTP benchmarks: one
// client.
const Client = "192.0.2.1:31337"

// HTTPSubjects returns the HTTP middleware subjects, each with its own
// defaults (response fields, refusal body) and the limits of [Single]'s
// scenarios: go-limiter's memorystore is configured as in [SingleSubjects],
// httprate's sliding window counts 1e12 per second when allowed and 1 per
// hour when denied.
func HTTPSubjects() []HTTP {
	return []HTTP{
		{Name: "ratelimit.httplimit", Ours: true, New: func(sc Scenario, next http.Handler) (http.Handler, func()) {
			rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(allowRate), Burst: allowBurst}
			if sc == Denied {
				rule = ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 1}
			}
			store, err := ratelimit.NewStore(rule, ratelimit.WithClock(ratelimit.SystemClock()))
			if err != nil {
				panic(err)
			}
			return httplimit.Middleware(store)(next), nop
		}},
		{Name: "httprate", New: func(sc Scenario, next http.Handler) (http.Handler, func()) {
			limit, window := allowBurst, time.Second
			if sc == Denied {
				limit, window = 1, time.Hour
			}
			// httprate's KeyByIP, which its documentation deprecates in
			// favour of stating the source of the address, as here.
			byIP := func(r *http.Request) (string, error) {
				ip, _, err := net.SplitHostPort(r.RemoteAddr)
				if err != nil {
					ip = r.RemoteAddr
				}
				return httprate.CanonicalizeIP(ip), nil
			}
			return httprate.LimitBy(limit, window, byIP)(next), nop
		}},
		{Name: "go-limiter", New: func(sc Scenario, next http.Handler) (http.Handler, func()) {
			st, done := goLimiterStore(sc)
			m, err := golimithttp.NewMiddleware(st, golimithttp.IPKeyFunc())
			if err != nil {
				panic(err)
			}
			return m.Handle(next), done
		}},
	}
}

// discard is the ResponseWriter of the HTTP benchmarks: it keeps the
// header map and the status, and drops the body.
type discard struct {
	h    http.Header
	code int
}

func newDiscard() *discard { return &discard{h: make(http.Header)} }

func (d *discard) Header() http.Header { return d.h }

func (d *discard) WriteHeader(code int) {
	if d.code == 0 {
		d.code = code
	}
}

func (d *discard) Write(b []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	return len(b), nil
}

// serve sends r through h to a reset d and reports whether it was
// admitted.
func (d *discard) serve(h http.Handler, r *http.Request) bool {
	clear(d.h)
	d.code = 0
	h.ServeHTTP(d, r)
	return d.code == http.StatusNoContent
}

// newRequest returns a GET request from [Client].
func newRequest() *http.Request {
	r, err := http.NewRequest(http.MethodGet, "http://example.com/", nil)
	if err != nil {
		panic(err)
	}
	r.RemoteAddr = Client
	return r
}
