package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// slotServer is a handler behind httplimit.InFlight that holds every
// request until the test lets it go: each request announces itself on
// entered and waits until its gate is closed.
type slotServer struct {
	t       *testing.T
	lim     *ratelimit.InFlight
	h       http.Handler
	entered chan string
	gates   sync.Map // request id -> chan struct{}
	ids     atomic.Int64
}

// slotRequest is one request sent to a slotServer.
type slotRequest struct {
	id   string
	gate chan struct{}
	done chan *httptest.ResponseRecorder
}

func newSlotServer(t *testing.T, limit int64, rate ratelimit.KeyedLimiter, opts ...httplimit.Option) *slotServer {
	t.Helper()
	lim, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: limit, Name: "conc"})
	require.NoError(t, err)
	s := &slotServer{t: t, lim: lim, entered: make(chan string)}
	s.h = httplimit.InFlight(lim, rate, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		s.entered <- id
		gate, _ := s.gates.Load(id)
		<-gate.(chan struct{})
		if r.URL.Query().Has("panic") {
			panic(http.ErrAbortHandler)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	return s
}

// start sends a request from remote on a goroutine of its own; the
// response arrives on its done channel.
func (s *slotServer) start(remote, query string) *slotRequest {
	q := &slotRequest{id: strconv.FormatInt(s.ids.Add(1), 10), gate: make(chan struct{}), done: make(chan *httptest.ResponseRecorder, 1)}
	s.gates.Store(q.id, q.gate)
	r := httptest.NewRequest(http.MethodGet, "/x?id="+q.id+"&"+query, nil)
	r.RemoteAddr = remote
	go func() {
		w := httptest.NewRecorder()
		defer func() {
			_ = recover() // a handler's panic, which net/http would recover
			q.done <- w
		}()
		s.h.ServeHTTP(w, r)
	}()
	return q
}

// hold sends a request from remote and waits until its handler runs.
func (s *slotServer) hold(remote string) *slotRequest {
	s.t.Helper()
	q := s.start(remote, "")
	select {
	case id := <-s.entered:
		require.Equal(s.t, q.id, id)
	case w := <-q.done:
		s.t.Fatalf("request from %s answered %d instead of reaching the handler", remote, w.Code)
	case <-time.After(testWait):
		s.t.Fatal("the request never reached the handler")
	}
	return q
}

// answered sends a request from remote that must be answered without
// reaching the handler.
func (s *slotServer) answered(remote string) *httptest.ResponseRecorder {
	s.t.Helper()
	q := s.start(remote, "")
	select {
	case w := <-q.done:
		return w
	case <-s.entered:
		s.t.Fatalf("request from %s reached the handler", remote)
	case <-time.After(testWait):
		s.t.Fatal("no response")
	}
	return nil
}

// finish lets a held request's handler return, and returns its response.
func (s *slotServer) finish(q *slotRequest) *httptest.ResponseRecorder {
	s.t.Helper()
	close(q.gate)
	select {
	case w := <-q.done:
		return w
	case <-time.After(testWait):
		s.t.Fatal("no response")
		return nil
	}
}

const (
	client1 = "192.0.2.1:1234"
	client2 = "192.0.2.2:1234"
)

func TestInFlightMiddleware(t *testing.T) {
	s := newSlotServer(t, 2, nil)
	a := s.hold(client1)
	b := s.hold(client1)
	assert.Equal(t, int64(2), s.lim.InUse("ip:192.0.2.1"))

	w := s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Empty(t, w.Header().Get("RateLimit"), "an in-flight limit is not a quota over time")
	assert.Empty(t, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, "rate_limited", jsonBody(t, w)["error"])
	assert.Equal(t, "conc", jsonBody(t, w)["policy"])

	c := s.hold(client2) // another key has slots of its own

	assert.Equal(t, http.StatusOK, s.finish(a).Code)
	assert.Equal(t, int64(1), s.lim.InUse("ip:192.0.2.1"), "the slot is given back when the handler returns")
	d := s.hold(client1)
	s.finish(b)
	s.finish(c)
	s.finish(d)
	assert.Zero(t, s.lim.Len(), "every slot given back")
}

func TestInFlightMiddlewareReleasesOnPanic(t *testing.T) {
	s := newSlotServer(t, 1, nil)
	q := s.start(client1, "panic")
	select {
	case <-s.entered:
	case <-time.After(testWait):
		t.Fatal("the request never reached the handler")
	}
	s.finish(q)
	assert.Zero(t, s.lim.InUse("ip:192.0.2.1"), "a panicking handler gives its slot back")
	s.finish(s.hold(client1))
}

func TestInFlightMiddlewareWithRate(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	rate := newKeyed(t, ratelimit.FixedWindow{Limit: 2, Window: time.Minute, Name: "per-minute"}, clk)
	s := newSlotServer(t, 1, rate)
	// left is how many more requests the rate admits now.
	left := func() int64 {
		d, err := rate.Peek("ip:192.0.2.1", ratelimit.Unit)
		require.NoError(t, err)
		if !d.Allowed {
			return 0
		}
		return d.Remaining + 1
	}

	a := s.hold(client1)
	assert.Equal(t, int64(1), left())

	// No slot: refused, spending nothing of the rate.
	w := s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "conc", jsonBody(t, w)["policy"])
	assert.Equal(t, int64(1), left(), "a request refused a slot spends no allowance")

	ok := s.finish(a)
	assert.Equal(t, `"per-minute";r=1;t=60`, ok.Header().Get("RateLimit"), "an admitted request carries the rate's fields")
	s.finish(s.hold(client1))
	assert.Zero(t, left())

	// The rate refuses: no slot is taken.
	w = s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "per-minute", jsonBody(t, w)["policy"])
	assert.Equal(t, "60", w.Header().Get("Retry-After"))
	assert.Equal(t, `"per-minute";q=2;w=60`, w.Header().Get("RateLimit-Policy"))
	assert.Zero(t, s.lim.InUse("ip:192.0.2.1"), "a request the rate refuses takes no slot")
}

func TestInFlightMiddlewareBadRequests(t *testing.T) {
	s := newSlotServer(t, 1, nil, httplimit.WithKey(httplimit.HeaderKey("X-API-Key", nil)))
	w := s.answered(client1)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, "missing_key", jsonBody(t, w)["error"])
	assert.Zero(t, s.lim.Len())

	clk := ratelimit.NewManualClock(0)
	rate := newKeyed(t, ratelimit.FixedWindow{Limit: 2, Window: time.Minute}, clk)
	s = newSlotServer(t, 1, rate, httplimit.WithCost(httplimit.FixedCost(3*ratelimit.Unit)))
	w = s.answered(client1)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, "cost_exceeds_limit", jsonBody(t, w)["error"])
	assert.Zero(t, s.lim.Len(), "a cost the rate can never admit takes no slot")
}

func TestInFlightMiddlewareShadow(t *testing.T) {
	s := newSlotServer(t, 1, nil, httplimit.WithShadowMode(nil))
	a := s.hold(client1)
	b := s.hold(client1) // no slot, but shadow mode forwards it
	assert.Equal(t, http.StatusOK, s.finish(a).Code)
	assert.Equal(t, http.StatusOK, s.finish(b).Code)
	assert.Zero(t, s.lim.Len())
}

func TestInFlightMiddlewareNil(t *testing.T) {
	assert.Panics(t, func() { httplimit.InFlight(nil, nil) })
	lim, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: 1})
	require.NoError(t, err)
	assert.Panics(t, func() { httplimit.InFlight(lim, nil)(nil) })
}

// TestInFlightMiddlewareDegradedRate: a rate limiter whose backend is down
// and whose failure policy admits (a Redis store failing open, or its
// fallback) decides the rate, never the slot: with 2 slots, 20 concurrent
// requests of one client put 2 in progress and refuse the rest.
func TestInFlightMiddlewareDegradedRate(t *testing.T) {
	admitted := ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4, Window: time.Second, ResetAfter: 200 * time.Millisecond}
	s := newSlotServer(t, 2, degraded{admitted})
	a := s.hold(client1)
	b := s.hold(client1)
	for range 18 {
		w := s.answered(client1)
		assert.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, "conc", jsonBody(t, w)["policy"])
	}
	assert.Equal(t, int64(2), s.lim.InUse("ip:192.0.2.1"))
	ok := s.finish(a)
	assert.Equal(t, http.StatusOK, ok.Code)
	assert.Equal(t, `"default";r=4;t=1`, ok.Header().Get("RateLimit"), "the degraded Decision decides the rate")
	s.finish(b)
	assert.Zero(t, s.lim.Len(), "every slot given back")

	// A degraded refusal (fail closed) refuses, taking no slot.
	refused := ratelimit.Decision{Limit: 5, Window: time.Second, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Second}
	s = newSlotServer(t, 2, degraded{refused})
	w := s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "2", w.Header().Get("Retry-After"))
	assert.Zero(t, s.lim.Len())
}

// TestInFlightMiddlewareNilRate: a rate limiter that is a nil pointer (a
// *ratelimit.Store left nil after NewStore failed) is a mistake in the
// program, refused when the middleware is built, as Middleware refuses
// one; a nil interface means no rate limit.
func TestInFlightMiddlewareNilRate(t *testing.T) {
	lim, err := ratelimit.NewInFlight(ratelimit.InFlightLimit{Limit: 1})
	require.NoError(t, err)
	assert.PanicsWithValue(t,
		"httplimit: InFlight given a nil rate limiter (*ratelimit.Store); pass the limiter that ratelimit.NewStore or ratelimit.Compose returned, after checking their error, or a nil interface for no rate limit",
		func() { httplimit.InFlight(lim, (*ratelimit.Store)(nil)) })
	assert.Panics(t, func() { httplimit.InFlight(lim, (*ratelimit.Composite)(nil)) })
	assert.NotPanics(t, func() { httplimit.InFlight(lim, nil) })
}

// TestInFlightMiddlewareListsEveryLayer: an in-flight limit over a
// composite rate lists every enforced layer of the rate in the fields, as
// Middleware over the composite alone does, admitted and refused; a
// request refused a slot still gets none.
func TestInFlightMiddlewareListsEveryLayer(t *testing.T) {
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "second"}},
		{Rule: ratelimit.FixedWindow{Limit: 3, Window: 24 * time.Hour, Name: "day"}},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "trial"}, Shadow: true},
	}, ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	s := newSlotServer(t, 1, c)
	a := s.hold(client1)
	w := s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "no slot")
	assert.Empty(t, w.Header().Get("RateLimit-Policy"), "a slot refusal has no fields")
	ok := s.finish(a)
	assert.Equal(t, `"second";q=2;w=1, "day";q=3;w=86400`, ok.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"second";r=1;t=1, "day";r=2;t=86400`, ok.Header().Get("RateLimit"))
	s.finish(s.hold(client1))
	w = s.answered(client1)
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "the rate refuses")
	assert.Equal(t, `"second";r=0;t=1, "day";r=1;t=86400`, w.Header().Get("RateLimit"))
	assert.Zero(t, s.lim.Len(), "every slot given back")
}
