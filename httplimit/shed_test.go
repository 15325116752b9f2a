package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

var shedClasses = []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: 90}, {Name: "sheddable", Share: 70}}

// shedServer is a handler behind httplimit.Shed whose requests each wait
// until the test lets them go (or their context ends), and announce that
// they entered.
type shedServer struct {
	t       *testing.T
	h       http.Handler
	entered chan struct{}
	gate    chan struct{}
}

func newShedServer(t *testing.T, s ratelimit.Shedder, inner func(http.Handler) http.Handler, opts ...httplimit.Option) *shedServer {
	t.Helper()
	srv := &shedServer{t: t, entered: make(chan struct{}, 100), gate: make(chan struct{})}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.entered <- struct{}{}
		select {
		case <-srv.gate:
		case <-r.Context().Done():
			return
		}
		if r.URL.Query().Has("panic") {
			panic(http.ErrAbortHandler)
		}
		_, _ = w.Write([]byte("ok"))
	})
	if inner != nil {
		h = inner(h)
	}
	classes := map[string]ratelimit.Priority{"critical": 0, "default": 1, "sheddable": 2}
	srv.h = httplimit.Shed(s, func(r *http.Request) ratelimit.Priority { return classes[r.URL.Query().Get("class")] }, opts...)(h)
	return srv
}

// send serves a request on a goroutine of its own; its response arrives on
// the channel returned.
func (srv *shedServer) send(ctx context.Context, query string) <-chan *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/x?"+query, nil).WithContext(ctx)
	r.RemoteAddr = client1
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		defer func() {
			_ = recover() // as net/http would
			done <- w
		}()
		srv.h.ServeHTTP(w, r)
	}()
	return done
}

// hold sends a request that must reach the handler, and waits until it
// does.
func (srv *shedServer) hold(ctx context.Context, query string) <-chan *httptest.ResponseRecorder {
	srv.t.Helper()
	done := srv.send(ctx, query)
	select {
	case <-srv.entered:
	case w := <-done:
		srv.t.Fatalf("%s answered %d instead of reaching the handler", query, w.Code)
	case <-time.After(testWait):
		srv.t.Fatal("the request never reached the handler")
	}
	return done
}

// answered sends a request that must be answered without reaching the
// handler.
func (srv *shedServer) answered(query string) *httptest.ResponseRecorder {
	srv.t.Helper()
	select {
	case w := <-srv.send(context.Background(), query):
		return w
	case <-srv.entered:
		srv.t.Fatalf("%s reached the handler", query)
	case <-time.After(testWait):
		srv.t.Fatal("no response")
	}
	return nil
}

func wait(t *testing.T, done <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case w := <-done:
		return w
	case <-time.After(testWait):
		t.Fatal("no response")
		return nil
	}
}

// holdSheddable holds 7 sheddable requests in the handler: with
// shedClasses and a limit of 10, sheddable ones are refused from then on.
func (srv *shedServer) holdSheddable() []<-chan *httptest.ResponseRecorder {
	var held []<-chan *httptest.ResponseRecorder
	for range 7 {
		held = append(held, srv.hold(context.Background(), "class=sheddable"))
	}
	return held
}

func TestShedAnswers503(t *testing.T) {
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses, Name: "workers", RetryAfter: 1500 * time.Millisecond})
	require.NoError(t, err)
	srv := newShedServer(t, s, nil)
	held := srv.holdSheddable()
	w := srv.answered("class=sheddable")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "2", w.Header().Get("Retry-After"), "1.5 s rounded up")
	assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	assert.Empty(t, w.Header().Get("RateLimit"))
	var body map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	assert.Equal(t, "overloaded", body["error"])
	assert.Equal(t, "workers", body["policy"])
	assert.Equal(t, "sheddable", body["class"])
	assert.EqualValues(t, 1500, body["retry_after_ms"])

	held = append(held, srv.hold(context.Background(), "class=critical"))
	close(srv.gate)
	for _, h := range held {
		assert.Equal(t, http.StatusOK, wait(t, h).Code)
	}
	assert.Zero(t, s.InUse())
}

// Retry-After says at least what is left of the shedder's Hold, in whole
// seconds rounded up: a request sent back sooner would be shed again.
func TestShedRetryAfterCoversHold(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses, Hold: 4500 * time.Millisecond},
		ratelimit.WithClock(clk))
	require.NoError(t, err)
	srv := newShedServer(t, s, nil)
	held := srv.holdSheddable()
	w := srv.answered("class=sheddable")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "5", w.Header().Get("Retry-After"), "4.5 s of Hold left, rounded up")
	clk.Advance(4 * time.Second)
	w = srv.answered("class=sheddable")
	assert.Equal(t, "1", w.Header().Get("Retry-After"), "the one-second hint, longer than the Hold left")
	close(srv.gate)
	for _, h := range held {
		assert.Equal(t, http.StatusOK, wait(t, h).Code)
	}
}

// A request shed never reaches the rate limits inside: it spends nothing,
// and a client over its quota still gets 429, not 503.
func TestShedSpendsNothing(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store := newKeyed(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 2, Name: "api"}, clk)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 2, Classes: []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: 50}}})
	require.NoError(t, err)
	srv := newShedServer(t, s, httplimit.Middleware(store))
	held := srv.hold(context.Background(), "class=default") // 1 of 2: default now refused
	w := srv.answered("class=default")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	probe := httptest.NewRequest(http.MethodGet, "/", nil)
	probe.RemoteAddr = client1
	key, err := httplimit.ClientIP{}.Key(probe)
	require.NoError(t, err)
	d, err := store.Peek(key, ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the shed request spent nothing: one of the burst of 2 is left")

	close(srv.gate)
	assert.Equal(t, http.StatusOK, wait(t, held).Code)
	assert.Equal(t, http.StatusOK, wait(t, srv.send(context.Background(), "class=critical")).Code)
	w = wait(t, srv.send(context.Background(), "class=critical"))
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "over quota is 429")
	assert.Zero(t, s.InUse())
}

// A place is given back when the handler returns, panics, or returns as
// its request's context ends.
func TestShedReleases(t *testing.T) {
	fleet, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 10, Classes: shedClasses})
	require.NoError(t, err)
	worker, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses})
	require.NoError(t, err)
	inUse := map[string]func() int64{
		"fleet":  func() int64 { n, _ := fleet.InUse(context.Background()); return n },
		"worker": worker.InUse,
	}
	for name, s := range map[string]ratelimit.Shedder{"fleet": fleet, "worker": worker} {
		t.Run(name, func(t *testing.T) {
			srv := newShedServer(t, s, nil)
			ret := srv.hold(context.Background(), "class=default")
			pan := srv.hold(context.Background(), "class=default&panic")
			ctx, cancel := context.WithCancel(context.Background())
			canc := srv.hold(ctx, "class=default")
			assert.Equal(t, int64(3), inUse[name]())
			cancel()
			wait(t, canc)
			assert.Equal(t, int64(2), inUse[name](), "cancellation")
			close(srv.gate)
			assert.Equal(t, http.StatusOK, wait(t, ret).Code)
			wait(t, pan)
			assert.Zero(t, inUse[name](), "return and panic")

			ended, cancel := context.WithCancel(context.Background())
			cancel()
			w := wait(t, srv.send(ended, "class=critical"))
			assert.Equal(t, http.StatusServiceUnavailable, w.Code)
			assert.Contains(t, w.Body.String(), "request_ended")
			assert.Zero(t, inUse[name]())
		})
	}
}

func TestTrustedClassHeader(t *testing.T) {
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: shedClasses})
	require.NoError(t, err)
	classOf := httplimit.TrustedClassHeader("X-Priority", s, 1)
	for _, tc := range []struct {
		header string
		want   ratelimit.Priority
	}{{"critical", 0}, {"sheddable", 2}, {"", 1}, {"root", 1}, {"Critical", 1}} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.header != "" {
			r.Header.Set("X-Priority", tc.header)
		}
		assert.Equal(t, tc.want, classOf(r), tc.header)
	}
}

// Without a ClassFunc, every request is in the least important class,
// whatever it claims.
func TestShedNilClassIsLeastImportant(t *testing.T) {
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 2, Classes: []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "low", Share: 50}}})
	require.NoError(t, err)
	var class string
	shed := httplimit.Shed(s, nil, httplimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, _ ratelimit.Decision) {
		class = httplimit.ShedClass(r)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	// The outer request takes one place of two; the inner one, claiming
	// to be critical, is low, and low may fill only half.
	h := shed(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Priority", "critical")
		shed(http.NotFoundHandler()).ServeHTTP(inner, req)
		w.WriteHeader(inner.Code)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Equal(t, "low", class)
	assert.Zero(t, s.InUse())
}

type downCounter struct{}

func (downCounter) Acquire(context.Context, int64) (ratelimit.Release, ratelimit.Decision, error) {
	return func() {}, ratelimit.Decision{}, errors.New("down")
}
func (downCounter) InUse(context.Context) (int64, error) { return 0, errors.New("down") }

func TestShedCounterFailure(t *testing.T) {
	s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 10, Classes: shedClasses, Counter: downCounter{}})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	rec := httptest.NewRecorder()
	httplimit.Shed(s, httplimit.FixedClass(0), httplimit.WithLogger(slog.New(slog.DiscardHandler)))(ok).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusNoContent, rec.Code, "fail open")
	rec = httptest.NewRecorder()
	httplimit.Shed(s, httplimit.FixedClass(0), httplimit.WithErrorHandler(httplimit.FailClosed), httplimit.WithLogger(slog.New(slog.DiscardHandler)))(ok).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "fail closed")
}

func TestShedNilPanics(t *testing.T) {
	var s *ratelimit.WorkerShedder
	assert.Panics(t, func() { httplimit.Shed(s, nil) })
}
