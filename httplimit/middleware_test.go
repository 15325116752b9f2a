package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

var api = ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}

func TestAdmittedResponse(t *testing.T) {
	f := newFixture(t, api)
	w := f.do()
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "ok", w.Body.String())
	assert.Equal(t, `"api";q=20;w=2`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"api";r=19;t=1`, w.Header().Get("RateLimit"))
	for _, h := range []string{"Retry-After", "Cache-Control", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		assert.Empty(t, w.Header().Values(h), h)
	}
	assert.EqualValues(t, 1, f.calls.Load())
	assert.Empty(t, f.logs.String(), "admitted requests are not logged")
}

func TestDeniedResponse(t *testing.T) {
	f := newFixture(t, api)
	for i := 0; i < 20; i++ {
		require.Equal(t, http.StatusOK, f.do().Code, "request %d", i)
	}
	w := f.do()
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	assert.Equal(t, `"api";q=20;w=2`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"api";r=0;t=2`, w.Header().Get("RateLimit"))
	assert.JSONEq(t, `{"error":"rate_limited","policy":"api","retry_after_ms":100,`+
		`"message":"too many requests for policy \"api\": retry in 100ms"}`, w.Body.String())
	assert.EqualValues(t, 20, f.calls.Load(), "a denied request never reaches the handler")

	logs := f.logs.lines(t)
	require.Len(t, logs, 1, "one line per limited request")
	assert.Equal(t, "INFO", logs[0]["level"])
	assert.Equal(t, "httplimit: rate limited", logs[0]["msg"])
	assert.Equal(t, "ip:192.0.2.1", logs[0]["key"])
	assert.Equal(t, "api", logs[0]["policy"])
	assert.EqualValues(t, 100*time.Millisecond, logs[0]["retry_after"])
}

func TestRetryAfterRounding(t *testing.T) {
	tests := []struct {
		name       string
		rate       ratelimit.Rate
		retryAfter string
		ms         float64
	}{
		{"1ms rounds up to the minimum of 1 s", ratelimit.PerSecond(1000), "1", 1},
		{"exactly 1 s", ratelimit.Every(time.Second), "1", 1000},
		{"1 s and 1 ns", ratelimit.Every(time.Second + 1), "2", 1001},
		{"1.5 s", ratelimit.Every(1500 * time.Millisecond), "2", 1500},
		{"7 per 3 s: 428571428.57 ns", ratelimit.Rate{Count: 7, Per: 3 * time.Second}, "1", 429},
		{"an hour", ratelimit.PerHour(1), "3600", 3_600_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, ratelimit.GCRA{Rate: tt.rate, Burst: 1})
			require.Equal(t, http.StatusOK, f.do().Code)
			w := f.do()
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			assert.Equal(t, tt.retryAfter, w.Header().Get("Retry-After"))
			assert.Equal(t, tt.ms, jsonBody(t, w)["retry_after_ms"])
		})
	}
}

func TestPolicyFields(t *testing.T) {
	tests := []struct {
		name      string
		rule      ratelimit.Rule
		policy    string // RateLimit-Policy
		ratelimit string // RateLimit after one request at 0
	}{
		{"token bucket: q is the burst, w the time to earn it", api,
			`"api";q=20;w=2`, `"api";r=19;t=1`},
		{"GCRA 100/min burst 100", ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100, Name: "g"},
			`"g";q=100;w=60`, `"g";r=99;t=1`},
		{"leaky bucket: q is the capacity, w the time to drain it", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10, Name: "q"},
			`"q";q=10;w=2`, `"q";r=9;t=1`},
		{"an unnamed rule is \"default\"", ratelimit.TokenBucket{Rate: ratelimit.PerMinute(1), Burst: 3},
			`"default";q=3;w=180`, `"default";r=2;t=60`},
		{"a window under a second is w=1, with the quota of a second: q/w is the rate", ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 5, Name: "g"},
			`"g";q=100;w=1`, `"g";r=4;t=1`},
		{"7 per 3 s in a second is 2.33: q rounds to the nearest", ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Burst: 1},
			`"default";q=2;w=1`, `"default";r=0;t=1`},
		{"windows round up, and q with them: 3 per 2 s", ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 3, Per: 2 * time.Second}, Burst: 2},
			`"default";q=3;w=2`, `"default";r=1;t=1`},
		{"a fixed window under a second", ratelimit.FixedWindow{Limit: 2, Window: 10 * time.Millisecond},
			`"default";q=200;w=1`, `"default";r=1;t=1`},
		{"2.5 s rounds to 3 s", ratelimit.SlidingLog{Limit: 5, Window: 2500 * time.Millisecond},
			`"default";q=6;w=3`, `"default";r=4;t=3`},
		{"fixed window", ratelimit.FixedWindow{Limit: 10, Window: time.Second, Name: "fw"},
			`"fw";q=10;w=1`, `"fw";r=9;t=1`},
		{"sliding log", ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second, Name: "login"},
			`"login";q=5;w=10`, `"login";r=4;t=10`},
		{"sliding counter", ratelimit.SlidingCounter{Limit: 100, Window: time.Minute, Name: "sc"},
			`"sc";q=100;w=60`, ""},
		{"names are structured-field strings", ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 1, Name: `we"ird\név`},
			`"we\"ird\\n??v";q=1;w=1`, `"we\"ird\\n??v";r=0;t=1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.rule)
			w := f.do()
			require.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, tt.policy, w.Header().Get("RateLimit-Policy"))
			if tt.ratelimit != "" {
				assert.Equal(t, tt.ratelimit, w.Header().Get("RateLimit"))
			}
		})
	}
}

func TestDeniedBodyCarriesThePolicyName(t *testing.T) {
	f := newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 1, Name: `we"ird`})
	f.do()
	assert.Equal(t, `we"ird`, jsonBody(t, f.do())["policy"], "JSON carries the name as it is")

	f = newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 1})
	f.do()
	assert.Equal(t, "default", jsonBody(t, f.do())["policy"])
}

func TestLegacyHeaders(t *testing.T) {
	f := newFixture(t, api, httplimit.WithLegacyHeaders())
	w := f.do()
	assert.Equal(t, "20", w.Header().Get("X-RateLimit-Limit"))
	assert.Equal(t, "19", w.Header().Get("X-RateLimit-Remaining"))
	assert.Equal(t, "1", w.Header().Get("X-RateLimit-Reset"))
	for i := 0; i < 19; i++ {
		f.do()
	}
	w = f.do()
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
	assert.Equal(t, "2", w.Header().Get("X-RateLimit-Reset"))
}

func TestCost(t *testing.T) {
	badBatch := errors.New("batch size must be between 1 and 100")
	costs := map[string]func(*http.Request) (ratelimit.Units, error){
		"/ten":  func(*http.Request) (ratelimit.Units, error) { return 10 * ratelimit.Unit, nil },
		"/half": func(*http.Request) (ratelimit.Units, error) { return ratelimit.Unit / 2, nil },
		"/bad":  func(*http.Request) (ratelimit.Units, error) { return 0, badBatch },
		"/zero": func(*http.Request) (ratelimit.Units, error) { return 0, nil },
		"/huge": func(*http.Request) (ratelimit.Units, error) { return 25 * ratelimit.Unit, nil },
	}
	byPath := httplimit.WithCost(func(r *http.Request) (ratelimit.Units, error) {
		if c, ok := costs[r.URL.Path]; ok {
			return c(r)
		}
		return ratelimit.Unit, nil
	})
	path := func(p string) func(*http.Request) { return func(r *http.Request) { r.URL.Path = p } }

	t.Run("weighted costs spend more", func(t *testing.T) {
		f := newFixture(t, api, byPath)
		assert.Equal(t, `"api";r=10;t=1`, f.do(path("/ten")).Header().Get("RateLimit"))
		assert.Equal(t, `"api";r=9;t=2`, f.do(path("/half")).Header().Get("RateLimit"), "9.5 left, rounded down")
		w := f.do(path("/ten"))
		assert.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.EqualValues(t, 50, jsonBody(t, w)["retry_after_ms"], "0.5 units short at 10/s")
	})
	t.Run("a cost function error is 400 with its reason, spending nothing", func(t *testing.T) {
		f := newFixture(t, api, byPath)
		w := f.do(path("/bad"))
		assert.Equal(t, http.StatusBadRequest, w.Code)
		assert.JSONEq(t, `{"error":"invalid_cost","message":"batch size must be between 1 and 100"}`, w.Body.String())
		assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
		assert.Empty(t, w.Header().Values("RateLimit"))
		assert.Empty(t, w.Header().Values("RateLimit-Policy"))
		assert.Empty(t, w.Header().Values("Retry-After"))
		assert.Zero(t, f.calls.Load())
		assert.Equal(t, `"api";r=19;t=1`, f.do().Header().Get("RateLimit"))
	})
	t.Run("a cost of zero is 400", func(t *testing.T) {
		f := newFixture(t, api, byPath)
		w := f.do(path("/zero"))
		assert.Equal(t, http.StatusBadRequest, w.Code)
		body := jsonBody(t, w)
		assert.Equal(t, "invalid_cost", body["error"])
		assert.Equal(t, "api", body["policy"])
		assert.Equal(t, "this request has no positive cost (it costs 0)", body["message"])
		_, want := newKeyed(t, api, ratelimit.NewManualClock(0)).Check("k", 0)
		assert.Equal(t, want.Error(), body["detail"], "the limiter's own error")
		assert.Zero(t, f.calls.Load())
	})
	t.Run("a cost above the capacity is 400, not 429", func(t *testing.T) {
		f := newFixture(t, api, byPath)
		w := f.do(path("/huge"))
		assert.Equal(t, http.StatusBadRequest, w.Code)
		body := jsonBody(t, w)
		assert.Equal(t, "cost_exceeds_limit", body["error"])
		assert.Equal(t, "api", body["policy"])
		assert.Equal(t, `this request costs 25, more than the 20 that policy "api" allows at once; it can never be admitted`, body["message"])
		_, want := newKeyed(t, api, ratelimit.NewManualClock(0)).Check("k", 25*ratelimit.Unit)
		assert.Equal(t, want.Error(), body["detail"], "the limiter's own error, with whatever numbers it gives")
		assert.Equal(t, `"api";q=20;w=2`, w.Header().Get("RateLimit-Policy"))
		assert.Empty(t, w.Header().Values("RateLimit"))
		assert.Empty(t, w.Header().Values("Retry-After"))
		assert.Zero(t, f.calls.Load())
		assert.Equal(t, `"api";r=19;t=1`, f.do().Header().Get("RateLimit"), "nothing spent")
	})
	t.Run("FixedCost", func(t *testing.T) {
		f := newFixture(t, api, httplimit.WithCost(httplimit.FixedCost(10*ratelimit.Unit)))
		assert.Equal(t, http.StatusOK, f.do().Code)
		assert.Equal(t, http.StatusOK, f.do().Code)
		assert.Equal(t, http.StatusTooManyRequests, f.do().Code)
	})
}

// TestSlidingLogVector is the design's sliding-log vector through HTTP:
// 5 per 10 s, requests at 0, 1, 2, 2.5, 3, 3.1, 9, 10.5 and 10.6 s.
func TestSlidingLogVector(t *testing.T) {
	f := newFixture(t, ratelimit.SlidingLog{Limit: 5, Window: 10 * time.Second, Name: "login"})
	steps := []struct {
		at         time.Duration
		status     int
		retryAfter string
		ms         float64
	}{
		{0, 200, "", 0},
		{1 * time.Second, 200, "", 0},
		{2 * time.Second, 200, "", 0},
		{2500 * time.Millisecond, 200, "", 0},
		{3 * time.Second, 200, "", 0},
		{3100 * time.Millisecond, 429, "7", 6900},
		{9 * time.Second, 429, "1", 1000},
		{10500 * time.Millisecond, 200, "", 0},
		{10600 * time.Millisecond, 429, "1", 400},
	}
	for _, s := range steps {
		f.clk.Set(s.at)
		w := f.do()
		require.Equal(t, s.status, w.Code, "at %v", s.at)
		assert.Equal(t, s.retryAfter, w.Header().Get("Retry-After"), "at %v", s.at)
		assert.Equal(t, `"login";q=5;w=10`, w.Header().Get("RateLimit-Policy"))
		if s.status == http.StatusTooManyRequests {
			assert.Equal(t, s.ms, jsonBody(t, w)["retry_after_ms"], "at %v", s.at)
		}
	}
	assert.EqualValues(t, 6, f.calls.Load())
}

func TestLeakyBucketWaits(t *testing.T) {
	f := newFixture(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10, Name: "shaped"})
	w := f.do()
	require.Equal(t, http.StatusOK, w.Code, "the first goes at once")
	assert.Equal(t, `"shaped";r=9;t=1`, w.Header().Get("RateLimit"))
	var queued []<-chan *httptest.ResponseRecorder
	for i := 1; i < 10; i++ {
		queued = append(queued, f.start())
		f.sleepers(i) // each later one waits its Delay on the store's clock
	}
	w = f.do()
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "the queue is full")
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.EqualValues(t, 200, jsonBody(t, w)["retry_after_ms"])

	for i, done := range queued {
		at := time.Duration(i+1) * 200 * time.Millisecond
		f.clk.Set(at - 1)
		f.assertPending(done, "a nanosecond before its turn")
		f.clk.Set(at)
		w := f.await(done)
		require.Equal(t, http.StatusOK, w.Code, "request %d", i+1)
		// The fields describe the moment the request goes on: by then, the
		// queue ahead of it has drained.
		assert.Equal(t, `"shaped";r=`+itoa(8-i)+`;t=1`, w.Header().Get("RateLimit"), "request %d", i+1)
	}
	assert.EqualValues(t, 10, f.calls.Load())
}

func TestLeakyBucketWaitAbandoned(t *testing.T) {
	f := newFixture(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10})
	require.Equal(t, http.StatusOK, f.do().Code, "the first request does not wait")

	ctx, cancel := context.WithCancelCause(context.Background())
	done := f.start(withContext(ctx))
	f.sleepers(1)
	cancel(errors.New("client went away"))
	w := f.await(done)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.JSONEq(t, `{"error":"wait_abandoned","policy":"default","message":"the request ended while waiting for its turn"}`,
		w.Body.String())
	assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	assert.Empty(t, w.Header().Values("Retry-After"))
	assert.EqualValues(t, 1, f.calls.Load(), "the abandoned request never reaches the handler")
	logs := f.logs.lines(t)
	require.Len(t, logs, 1)
	assert.Equal(t, "httplimit: wait abandoned", logs[0]["msg"])
	assert.Equal(t, "client went away", logs[0]["error"])
	assert.EqualValues(t, 200*time.Millisecond, logs[0]["delay"])
	f.start()
	f.sleepers(1)
	at, ok := f.clk.NextWake()
	require.True(t, ok)
	assert.Equal(t, 400*time.Millisecond, at, "the abandoned request stays spent: the next one is third in the queue")
}

// ctxLimiter is a keyed limiter that takes a context, recording the ones
// it is given.
type ctxLimiter struct {
	*ratelimit.Store
	ctxs chan context.Context
}

func (c ctxLimiter) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	c.ctxs <- ctx
	return c.Store.CheckContext(ctx, key, cost)
}

// noWithin is a store without CheckWithin.
type noWithin struct{ s *ratelimit.Store }

func (n noWithin) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return n.s.Check(key, cost)
}

func (n noWithin) Clock() ratelimit.Clock { return n.s.Clock() }

// checkOnly hides every method of a limiter but Check.
type checkOnly struct{ lim ratelimit.KeyedLimiter }

func (c checkOnly) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return c.lim.Check(key, cost)
}

func TestContextChecker(t *testing.T) {
	type ctxKey struct{}
	t.Run("the request's context goes to CheckContext", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim := ctxLimiter{Store: newKeyed(t, api, clk), ctxs: make(chan context.Context, 1)}
		f := newFixtureFor(t, clk, lim)
		ctx := context.WithValue(context.Background(), ctxKey{}, "mine")
		require.Equal(t, http.StatusOK, f.do(withContext(ctx)).Code)
		select {
		case got := <-lim.ctxs:
			assert.Equal(t, "mine", got.Value(ctxKey{}))
		default:
			t.Error("CheckContext was not called")
		}
	})
	t.Run("a request that has ended is not checked, and spends nothing", func(t *testing.T) {
		f := newFixture(t, api)
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("client went away"))
		w := f.do(withContext(ctx))
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Equal(t, "wait_abandoned", jsonBody(t, w)["error"])
		assert.Zero(t, f.calls.Load())
		assert.Equal(t, `"api";r=19;t=1`, f.do().Header().Get("RateLimit"), "nothing spent")
	})
	t.Run("a limiter with only Check works, and waits on the system clock", func(t *testing.T) {
		store := newKeyed(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1_000_000), Capacity: 2, Name: "q"}, ratelimit.SystemClock())
		calls := 0
		h := httplimit.Middleware(checkOnly{store}, httplimit.WithLogger(slog.New(slog.DiscardHandler)))(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls++ }))
		for i := 0; i < 2; i++ { // the second waits a microsecond
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, `"q";q=1000000;w=1`, w.Header().Get("RateLimit-Policy"))
		}
		assert.Equal(t, 2, calls)
	})
}

func TestMaxDelay(t *testing.T) {
	shaped := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10, Name: "shaped"}
	t.Run("a wait over the cap is refused, spending nothing, with the wait until one fits", func(t *testing.T) {
		f := newFixture(t, shaped, httplimit.WithMaxDelay(500*time.Millisecond))
		require.Equal(t, http.StatusOK, f.do().Code)
		queued := []<-chan *httptest.ResponseRecorder{f.start()}
		f.sleepers(1)
		queued = append(queued, f.start()) // Delays 200, 400 ms
		f.sleepers(2)
		w := f.do() // it would wait 600 ms
		assert.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.EqualValues(t, 100, jsonBody(t, w)["retry_after_ms"], "nothing spent: at 100 ms it would wait 500")
		assert.Equal(t, `"shaped";q=10;w=2`, w.Header().Get("RateLimit-Policy"))
		assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
		assert.EqualValues(t, 1, f.calls.Load())

		f.clk.Set(100*time.Millisecond - 1)
		assert.Equal(t, http.StatusTooManyRequests, f.do().Code, "a nanosecond early")
		f.clk.Set(100 * time.Millisecond)
		exact := f.start()
		f.sleepers(3)
		f.clk.Set(600 * time.Millisecond)
		for _, done := range append(queued, exact) {
			assert.Equal(t, http.StatusOK, f.await(done).Code)
		}
	})
	t.Run("no cap by default", func(t *testing.T) {
		f := newFixture(t, shaped)
		require.Equal(t, http.StatusOK, f.do().Code)
		for i := 1; i < 10; i++ {
			f.start()
			f.sleepers(i)
		}
		assert.Equal(t, 9, f.clk.Sleepers())
	})
	t.Run("a limiter without CheckWithin spends the refused request's place", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		f := newFixtureFor(t, clk, noWithin{newKeyed(t, shaped, clk)}, httplimit.WithMaxDelay(500*time.Millisecond))
		require.Equal(t, http.StatusOK, f.do().Code)
		f.start()
		f.sleepers(1)
		f.start()
		f.sleepers(2)
		w := f.do() // Delay 600 ms: admitted by the limiter, refused here
		assert.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.EqualValues(t, 300, jsonBody(t, w)["retry_after_ms"], "its place stays taken: the next would wait 800 ms")
		f.clk.Set(300*time.Millisecond - 1)
		assert.Equal(t, http.StatusTooManyRequests, f.do().Code, "a nanosecond early")
	})
}

// TestMaxDelayComposite combines a slow queue with a fast window. A client
// sending every 10 ms is refused for the queue's wait, by the queue's
// policy, spending nothing; if it then waits out its Retry-After it is
// admitted at its first retry.
func TestMaxDelayComposite(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.LeakyBucket{Rate: ratelimit.Every(10 * time.Second), Capacity: 100, Name: "queue"}},
		{Rule: ratelimit.FixedWindow{Limit: 2, Window: 10 * time.Millisecond, Name: "burst"}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	f := newFixtureFor(t, clk, lim, httplimit.WithMaxDelay(time.Second))

	require.Equal(t, http.StatusOK, f.do().Code)
	for round := 0; round < 5; round++ {
		clk.Advance(10 * time.Millisecond)
		w := f.do()
		require.Equal(t, http.StatusTooManyRequests, w.Code, "round %d", round)
		assert.Equal(t, "queue", jsonBody(t, w)["policy"], "the queue refuses, not the window")
		assert.Equal(t, `"queue";q=100;w=1000, "burst";q=200;w=1`, w.Header().Get("RateLimit-Policy"),
			"every layer is listed")
		retry, err := strconv.Atoi(w.Header().Get("Retry-After"))
		require.NoError(t, err)
		assert.Equal(t, 9, retry, "the queue ends 9.99 s from now: in 8.99 s it waits 1 s")

		clk.Advance(time.Duration(retry) * time.Second)
		done := f.start()
		f.sleepers(1)
		clk.Advance(time.Second)
		assert.Equal(t, http.StatusOK, f.await(done).Code, "round %d: admitted at the first retry", round)
	}
	assert.EqualValues(t, 6, f.calls.Load())
}

func TestShadowMode(t *testing.T) {
	trial := ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2, Name: "trial"}
	t.Run("decides, reports and logs, but forwards everything with the fields", func(t *testing.T) {
		var reports []ratelimit.ShadowReport
		f := newFixture(t, trial, httplimit.WithShadowMode(func(r ratelimit.ShadowReport) { reports = append(reports, r) }))
		want := []string{`"trial";r=1;t=1`, `"trial";r=0;t=2`, `"trial";r=0;t=2`}
		for i := 0; i < 3; i++ {
			w := f.do()
			assert.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, want[i], w.Header().Get("RateLimit"), "request %d", i)
			assert.Equal(t, `"trial";q=2;w=2`, w.Header().Get("RateLimit-Policy"))
			assert.Empty(t, w.Header().Values("Retry-After"))
		}
		assert.EqualValues(t, 3, f.calls.Load())
		require.Len(t, reports, 3)
		assert.Equal(t, "ip:192.0.2.1", reports[2].Key)
		assert.False(t, reports[2].Decision.Allowed)
		assert.Equal(t, time.Second, reports[2].Decision.RetryAfter, "the report has the exact wait")
		logs := f.logs.lines(t)
		require.Len(t, logs, 1, "only the third would have been limited")
		assert.Equal(t, "httplimit: would limit request", logs[0]["msg"])
		assert.Equal(t, "ip:192.0.2.1", logs[0]["key"])
		assert.Equal(t, "trial", logs[0]["policy"])
	})
	t.Run("the same as ShadowKeyed and a shadow Composite layer", func(t *testing.T) {
		type outcome struct {
			fields  []string
			reports []ratelimit.ShadowReport
			logs    []string
		}
		rule := ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 3, Name: "trial"}
		run := func(build func(clk *ratelimit.ManualClock, report ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option)) outcome {
			var o outcome
			clk := ratelimit.NewManualClock(0)
			lim, opts := build(clk, func(r ratelimit.ShadowReport) { o.reports = append(o.reports, r) })
			f := newFixtureFor(t, clk, lim, opts...)
			for i := 0; i < 12; i++ {
				clk.Set(time.Duration(i) * 70 * time.Millisecond)
				w := f.do()
				require.Equal(t, http.StatusOK, w.Code)
				o.fields = append(o.fields, w.Header().Get("RateLimit-Policy")+" "+w.Header().Get("RateLimit"))
			}
			for _, l := range f.logs.lines(t) {
				o.logs = append(o.logs, fmt.Sprint(l["msg"], " ", l["key"], " ", l["policy"]))
			}
			return o
		}
		mode := run(func(clk *ratelimit.ManualClock, report ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option) {
			return newKeyed(t, rule, clk), []httplimit.Option{httplimit.WithShadowMode(report)}
		})
		require.NotEmpty(t, mode.logs, "the trace must overrun the limit")
		assert.Len(t, mode.reports, 12)
		for name, build := range map[string]func(*ratelimit.ManualClock, ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option){
			"WithShadowMode on a limiter with only Check": func(clk *ratelimit.ManualClock, report ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option) {
				return checkOnly{newKeyed(t, rule, clk)}, []httplimit.Option{httplimit.WithShadowMode(report)}
			},
			"ShadowKeyed": func(clk *ratelimit.ManualClock, report ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option) {
				return ratelimit.ShadowKeyed(newKeyed(t, rule, clk), report), nil
			},
			"a shadow Composite layer": func(clk *ratelimit.ManualClock, report ratelimit.ShadowFunc) (ratelimit.KeyedLimiter, []httplimit.Option) {
				c, err := ratelimit.Compose([]ratelimit.Layer{{Rule: rule, Shadow: true, OnShadow: report}}, ratelimit.WithClock(clk))
				require.NoError(t, err)
				return c, nil
			},
		} {
			assert.Equal(t, mode, run(build), name)
		}
	})
	t.Run("spends like enforcement, so it predicts it", func(t *testing.T) {
		for _, rule := range []ratelimit.Rule{
			ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2},
			ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(2), Capacity: 4},
		} {
			// With WithMaxDelay, enforcement asks CheckWithin, which
			// refuses a long wait without spending: so must the shadow.
			var wouldDeny []bool
			shadow := newFixture(t, rule, httplimit.WithMaxDelay(time.Second), httplimit.WithShadowMode(func(r ratelimit.ShadowReport) {
				wouldDeny = append(wouldDeny, !r.Decision.Allowed)
			}))
			clk := ratelimit.NewManualClock(0)
			enforce := newKeyed(t, rule, clk)
			var denied []bool
			for i := 0; i < 20; i++ {
				at := time.Duration(i) * 300 * time.Millisecond
				shadow.clk.Set(at)
				clk.Set(at)
				assert.Equal(t, http.StatusOK, shadow.do().Code)
				d, err := enforce.CheckWithin("ip:192.0.2.1", ratelimit.Unit, time.Second)
				require.NoError(t, err)
				denied = append(denied, !d.Allowed)
			}
			assert.Contains(t, denied, true, "%T", rule)
			assert.Equal(t, denied, wouldDeny, "%T", rule)
			assert.Zero(t, shadow.clk.Sleepers(), "a shadow never holds a request back")
		}
	})
	t.Run("no waits and no 400s", func(t *testing.T) {
		f := newFixture(t, ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10},
			httplimit.WithShadowMode(nil),
			httplimit.WithCost(func(r *http.Request) (ratelimit.Units, error) {
				switch r.URL.Path {
				case "/bad":
					return 0, errors.New("bad")
				case "/huge":
					return 11 * ratelimit.Unit, nil
				}
				return ratelimit.Unit, nil
			}))
		for i := 0; i < 5; i++ {
			assert.Equal(t, http.StatusOK, f.do().Code)
		}
		assert.Zero(t, f.clk.Sleepers())
		w := f.do(func(r *http.Request) { r.URL.Path = "/bad" })
		assert.Equal(t, http.StatusOK, w.Code)
		assert.Empty(t, w.Header().Values("RateLimit"))
		w = f.do(func(r *http.Request) { r.URL.Path = "/huge" })
		assert.Equal(t, http.StatusOK, w.Code, "admitted and reported, as ShadowKeyed does")
		logs := f.logs.lines(t)
		require.Len(t, logs, 2)
		assert.Equal(t, "httplimit: would reject cost", logs[0]["msg"])
		assert.Equal(t, "httplimit: would limit request", logs[1]["msg"])
		assert.EqualValues(t, 7, f.calls.Load())
	})
	t.Run("errors and missing keys are forwarded even when failing closed", func(t *testing.T) {
		for _, err := range []error{errors.New("no session"), httplimit.ErrNoKey} {
			f := newFixture(t, api, httplimit.WithShadowMode(nil), httplimit.WithErrorHandler(httplimit.FailClosed),
				httplimit.WithKey(func(*http.Request) (string, error) { return "", err }))
			assert.Equal(t, http.StatusOK, f.do().Code)
			assert.EqualValues(t, 1, f.calls.Load())
		}
	})
}

// TestLogging: refusals are logged only when asked; errors always, capped.
func TestLogging(t *testing.T) {
	var buf syncBuffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))

	lim := newKeyed(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1}, ratelimit.NewManualClock(0))
	h := httplimit.Middleware(lim)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := 0; i < 100; i++ {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	assert.Empty(t, buf.String(), "a flood of refusals writes nothing by default")

	h = httplimit.Middleware(failing{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := 0; i < 100; i++ {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	logs := buf.lines(t)
	assert.Len(t, logs, 10, "limiter errors are logged, at most 10 at once")
	for _, l := range logs {
		assert.Equal(t, "ERROR", l["level"])
	}
}

func TestDeniedHandler(t *testing.T) {
	var got ratelimit.Decision
	f := newFixture(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 1, Name: "p"},
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
			got = d
			// The fields are already set when the hook runs.
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			assert.Equal(t, `"p";r=0;t=1`, w.Header().Get("RateLimit"))
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte("slow down"))
		}))
	f.do()
	w := f.do()
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "slow down", w.Body.String())
	assert.False(t, got.Allowed)
	assert.Equal(t, 500*time.Millisecond, got.RetryAfter)
	assert.Equal(t, "p", got.Policy)
}

// failing is a keyed limiter whose backend is down.
type failing struct{}

func (failing) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errors.New("backend unreachable")
}

// degraded is a keyed limiter whose backend is down and whose own failure
// policy answers d, as a Redis store does.
type degraded struct{ d ratelimit.Decision }

func (l degraded) Check(string, ratelimit.Units) (ratelimit.Decision, error) {
	return l.d, fmt.Errorf("%w: backend unreachable", ratelimit.ErrDegraded)
}

// TestFailurePolicyDecides: a limiter error that comes with its failure
// policy's Decision is answered by that Decision, not by the ErrorHandler:
// a store that fails closed stays closed behind the default FailOpen, and
// one that fails open stays open behind FailClosed. Shadow mode forwards.
func TestFailurePolicyDecides(t *testing.T) {
	refused := ratelimit.Decision{Limit: 5, Window: time.Second, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Second}
	admitted := ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4, Window: time.Second, ResetAfter: 200 * time.Millisecond}
	handlerCalled := func() (http.Handler, *int) {
		calls := 0
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls++ }), &calls
	}
	onErr := func(t *testing.T) httplimit.Option {
		return httplimit.WithErrorHandler(func(http.ResponseWriter, *http.Request, error) bool {
			t.Error("an error with the policy's Decision reached the ErrorHandler")
			return true
		})
	}
	logs := &syncBuffer{}
	next, calls := handlerCalled()
	w := httptest.NewRecorder()
	httplimit.Middleware(degraded{refused}, onErr(t), httplimit.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))(next).
		ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil))
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "fail closed's refusal is kept")
	assert.Equal(t, "2", w.Header().Get("Retry-After"))
	assert.Zero(t, *calls)
	lines := logs.lines(t)
	require.NotEmpty(t, lines, "the failure is logged")
	assert.Equal(t, "ERROR", lines[0]["level"])
	assert.Equal(t, "ratelimit: decided by the failure policy: backend unreachable", lines[0]["error"])

	next, calls = handlerCalled()
	w = httptest.NewRecorder()
	httplimit.Middleware(degraded{admitted}, httplimit.WithErrorHandler(httplimit.FailClosed))(next).
		ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil))
	assert.Equal(t, http.StatusOK, w.Code, "fail open's admission is kept")
	assert.Equal(t, `"default";r=4;t=1`, w.Header().Get("RateLimit"))
	assert.Equal(t, 1, *calls)

	next, calls = handlerCalled()
	w = httptest.NewRecorder()
	httplimit.Middleware(degraded{refused}, httplimit.WithShadowMode(nil))(next).
		ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil))
	assert.Equal(t, http.StatusOK, w.Code, "shadow mode forwards")
	assert.Equal(t, 1, *calls)
}

func TestErrors(t *testing.T) {
	noKey := httplimit.WithKey(func(*http.Request) (string, error) { return "", errors.New("no session") })
	for _, tt := range []struct {
		name string
		mw   func(...httplimit.Option) func(http.Handler) http.Handler
		opts []httplimit.Option
		err  string
	}{
		{"key error", func(o ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.Middleware(newKeyed(t, api, ratelimit.NewManualClock(0)), o...)
		}, []httplimit.Option{noKey}, "httplimit: key: no session"},
		{"limiter error", func(o ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.Middleware(failing{}, o...)
		}, nil, "httplimit: limiter: backend unreachable"},
	} {
		run := func(t *testing.T, extra ...httplimit.Option) (*httptest.ResponseRecorder, int, []map[string]any) {
			logs := &syncBuffer{}
			calls := 0
			opts := append([]httplimit.Option{httplimit.WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))}, tt.opts...)
			h := tt.mw(append(opts, extra...)...)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls++ }))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil))
			return w, calls, logs.lines(t)
		}
		t.Run(tt.name+": fails open by default, logging", func(t *testing.T) {
			w, calls, logs := run(t)
			assert.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, 1, calls)
			assert.Empty(t, w.Header().Values("RateLimit"))
			require.Len(t, logs, 1)
			assert.Equal(t, "ERROR", logs[0]["level"])
			assert.Equal(t, tt.err, logs[0]["error"])
		})
		t.Run(tt.name+": FailClosed answers 503", func(t *testing.T) {
			w, calls, logs := run(t, httplimit.WithErrorHandler(httplimit.FailClosed))
			assert.Equal(t, http.StatusServiceUnavailable, w.Code)
			assert.JSONEq(t, `{"error":"limiter_unavailable","message":"the rate limiter is unavailable; try again later"}`,
				w.Body.String())
			assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			assert.Zero(t, calls)
			require.Len(t, logs, 1)
		})
		t.Run(tt.name+": a custom handler sees the error", func(t *testing.T) {
			var seen error
			w, calls, _ := run(t, httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) bool {
				seen = err
				w.WriteHeader(http.StatusTeapot)
				return false
			}))
			assert.Equal(t, http.StatusTeapot, w.Code)
			assert.Zero(t, calls)
			assert.EqualError(t, seen, tt.err)
		})
	}
}

func TestHeaderKey(t *testing.T) {
	f := newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		httplimit.WithKey(httplimit.HeaderKey("X-API-Key", httplimit.ClientIP{}.Key)))
	assert.Equal(t, http.StatusOK, f.do(header("X-API-Key", "alpha")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(header("X-API-Key", "alpha")).Code)
	assert.Equal(t, http.StatusOK, f.do(header("X-API-Key", "beta")).Code, "another key, another allowance")
	assert.Equal(t, http.StatusOK, f.do().Code, "no header: the client address")
	assert.Equal(t, http.StatusTooManyRequests, f.do(header("X-API-Key", "")).Code, "an empty header is no header")
	assert.Equal(t, http.StatusOK, f.do(header("X-API-Key", "ip:192.0.2.9"), from("192.0.2.9:1")).Code,
		"a header value cannot name another client's address key")
	assert.Equal(t, http.StatusOK, f.do(from("192.0.2.9:1")).Code)

	key := httplimit.HeaderKey("X-API-Key", nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "alpha")
	k, err := key(r)
	require.NoError(t, err)
	// "hdr:" and the first 16 bytes of SHA-256("alpha").
	assert.Equal(t, "hdr:8ed3f6ad685b959ead7022518e1af76c", k)
	r.Header.Del("X-API-Key")
	_, err = key(r)
	assert.ErrorIs(t, err, httplimit.ErrNoKey)
	assert.ErrorContains(t, err, "X-Api-Key header is missing")
}

// TestRequiredHeaderKey: with no fallback, leaving the header out is the
// client's mistake, answered 400 even when failing open, so it is no way
// round the limit.
func TestRequiredHeaderKey(t *testing.T) {
	f := newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		httplimit.WithKey(httplimit.HeaderKey("X-API-Key", nil)), httplimit.WithErrorHandler(httplimit.FailOpen))
	for i := 0; i < 100; i++ {
		w := f.do()
		require.Equal(t, http.StatusBadRequest, w.Code, "request %d", i)
		if i == 0 {
			assert.JSONEq(t, `{"error":"missing_key","message":"httplimit: the request has no key: the X-Api-Key header is missing"}`,
				w.Body.String())
			assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
		}
	}
	assert.Zero(t, f.calls.Load(), "none served")
	assert.Equal(t, http.StatusOK, f.do(header("X-API-Key", "k")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(header("X-API-Key", "k")).Code)

	t.Run("a KeyFunc of one's own can return ErrNoKey", func(t *testing.T) {
		f := newFixture(t, api, httplimit.WithKey(func(*http.Request) (string, error) {
			return "", fmt.Errorf("%w: no session cookie", httplimit.ErrNoKey)
		}))
		w := f.do()
		assert.Equal(t, http.StatusBadRequest, w.Code)
		assert.Equal(t, "missing_key", jsonBody(t, w)["error"])
		assert.Zero(t, f.calls.Load())
	})
}

func TestMisuseIsReportedWhenBuilt(t *testing.T) {
	var store *ratelimit.Store
	var composite *ratelimit.Composite
	for _, tt := range []struct {
		name string
		lim  ratelimit.KeyedLimiter
		typ  string
	}{
		{"nil", nil, "<nil>"},
		{"nil *Store", store, "*ratelimit.Store"},
		{"nil *Composite", composite, "*ratelimit.Composite"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.PanicsWithValue(t, "httplimit: Middleware given a nil limiter ("+tt.typ+"); pass the limiter that "+
				"ratelimit.NewStore or ratelimit.Compose returned, after checking their error",
				func() { httplimit.Middleware(tt.lim) })
		})
	}
	assert.PanicsWithValue(t, "httplimit: nil handler", func() { httplimit.Middleware(failing{})(nil) })
	assert.PanicsWithValue(t, `httplimit: HeaderKey with an empty header name; name the header that carries the key, such as "X-API-Key"`,
		func() { httplimit.HeaderKey("", nil) })
	assert.Panics(t, func() { httplimit.HeaderKey("", httplimit.ClientIP{}.Key) })
}

func itoa(i int) string { return string(rune('0' + i)) }

// TestWithPlan: a plan chosen from the request, named in RateLimit-Policy.
func TestWithPlan(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	plans, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Minute}},
			"pro":  {Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Minute}},
		},
		Default: "free",
	}, nil, ratelimit.WithClock(clk))
	require.NoError(t, err)
	h := httplimit.Middleware(plans,
		httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil }),
		httplimit.WithPlan(func(r *http.Request) string { return r.Header.Get("X-Plan") }),
	)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	serve := func(plan string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Plan", plan)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := serve("pro")
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, `"pro";q=100;w=60`, w.Header().Get("RateLimit-Policy"))
	w = serve("")
	assert.Equal(t, `"free";q=2;w=60`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, http.StatusOK, w.Code, "1 of 100 on pro is 1 of 2 on free")
	assert.Equal(t, http.StatusTooManyRequests, serve("").Code)
}
