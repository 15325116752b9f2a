package httplimit

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ratekit/ratelimit"
)

// WithCountOnly makes the limit charge a request only if its response
// counts: counts is given the response's status and returns whether the
// request is charged. A login limit counts failed logins only,
//
//	httplimit.WithCountOnly(func(status int) bool { return status == 401 || status == 403 })
//
// and an API may leave out its own failures (status < 500). A nil counts
// charges every request, as without the option.
//
// The request is still checked before it is forwarded, and spends its cost
// as any admitted request does; once the handler has returned, a response
// that does not count gets its cost back through the limiter's Refund, at
// the admitting Decision's At. So at any instant the requests still running
// and those that counted together never exceed the limit, however many
// arrive at once: a request refused because others were running is refused
// with the exact Retry-After of that moment, and may pass once they end.
// What is given back is what [ratelimit.Store.Refund] gives: all of it
// under the window rules while the window lasts, exactly for a
// [ratelimit.SlidingLog]; under the buckets, less whatever the bucket
// earned back while the request ran.
//
// Only requests that reach the handler are given back: one admitted but
// answered by the middleware itself (its context ended while it waited
// its Delay) stays charged, as without the option.
//
// The status is the first one the handler writes, other than an
// informational 1xx: 200 if it writes a body or flushes without one, and
// if it writes nothing at all. A request whose handler panics or hijacks
// the connection stays charged, its status being unknown. The handler sees
// its [http.ResponseWriter] wrapped; the wrapper has Flush and Hijack,
// which reach the original's where it has them, and Unwrap, so that an
// [http.ResponseController] reaches every other feature of the original.
//
// The limiter must have a method
//
//	Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error)
//
// as [ratelimit.Store], [ratelimit.Composite] and [ratelimit.Plans] have.
// With one that has not, nothing can be given back: every admitted request
// stays charged, as without the option, and [Middleware] logs an error
// saying so when it is built. In shadow mode ([WithShadowMode]) the
// limiter is given back what it spent, exactly as if it enforced.
func WithCountOnly(counts func(status int) bool) Option {
	return func(c *config) { c.countOnly = counts }
}

// refunder is a keyed limiter that can give back an admitted cost.
type refunder interface {
	Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error)
}

// refunderOf returns lim's Refund if the responses to count are chosen
// (WithCountOnly), for the handler to give back the cost of those that do
// not count; nil otherwise. lim is the limiter itself, not its shadow: a
// shadow limiter spends as lim would, so lim gives back as it would.
func (c *config) refunderOf(lim ratelimit.KeyedLimiter) refunder {
	if c.countOnly == nil {
		return nil
	}
	r, ok := lim.(refunder)
	if !ok {
		c.logger.Error("httplimit: WithCountOnly needs a limiter with a Refund method; every admitted request will count",
			slog.String("limiter", fmt.Sprintf("%T", lim)))
	}
	return r
}

// serveCounted forwards an admitted request, then gives back its cost if
// its response does not count (see WithCountOnly).
func (h *handler) serveCounted(w http.ResponseWriter, r *http.Request, key string, cost ratelimit.Units, d ratelimit.Decision) {
	sw := &statusWriter{ResponseWriter: w}
	h.next.ServeHTTP(sw, r)
	// A shadow limit that would have refused the request spent nothing.
	if sw.hijacked || d.Shadowed || h.countOnly(sw.final()) {
		return
	}
	if _, err := h.refund.Refund(key, cost, d.At); err != nil {
		h.errs.log(r.Context(), h.logger, "httplimit: refund failed; the request stays counted",
			slog.String("key", key), slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Any("error", err))
	}
}

// statusWriter records the status of the response written through it.
type statusWriter struct {
	http.ResponseWriter
	status   int // the first status written other than an informational 1xx; 0: none yet
	hijacked bool
}

// final returns the response's status: what net/http sends for a handler
// that wrote none is 200.
func (s *statusWriter) final() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

func (s *statusWriter) WriteHeader(code int) {
	// As net/http: 1xx codes other than 101 are informational, and the
	// final status is still to come.
	if s.status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush sends what has been written, as the original's Flush does; the
// status, if none was written, is then 200.
func (s *statusWriter) Flush() {
	if err := http.NewResponseController(s.ResponseWriter).Flush(); err == nil && s.status == 0 {
		s.status = http.StatusOK
	}
}

// Hijack takes over the connection, if the original allows it.
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.hijacked = true
	}
	return c, rw, err
}

// Unwrap returns the original, for [http.ResponseController].
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
