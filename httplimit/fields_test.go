package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// TestSFParser checks the test's own structured-field parser on values it
// must take and values it must refuse, so that the checks built on it can
// fail.
func TestSFParser(t *testing.T) {
	good := map[string]int{
		`"a";q=1;w=2`:                             1,
		`"a";q=1;w=2, "b";q=3;w=4`:                2,
		`"a";q=1;w=2,"b";q=3`:                     2,
		`tok;r=0;t=5;pk=:AQID:`:                   1,
		`"x\"y\\z";a;b=?0;c=-12;d=1.5;e=@10;f=*t`: 1,
		`(1 2);p, "s"`:                            2,
		``:                                        0,
	}
	for v, n := range good {
		l, err := parseSFList(v)
		if assert.NoError(t, err, v) {
			assert.Len(t, l, n, v)
		}
	}
	for _, v := range []string{
		`"a";q=1,`, `"a" "b"`, `"unterminated`, `"bad\escape"`, "\"tab\there\"", `"a";Q=1`, `"a";q=1234567890123456`,
		`"a";pk=:AQI:`, `"a";pk=:not base64!:`, `"a";q=1.`, `"a";q=1.2345`, `,"a"`, `"a";=1`, `é`, `"a";q=--1`,
	} {
		_, err := parseSFList(v)
		assert.Error(t, err, "%q", v)
	}
}

// checkPolicy checks a RateLimit-Policy value as the draft defines it: a
// non-empty List of Strings, each with a non-negative Integer q, a
// positive Integer w, and pk a Byte Sequence if present. It returns the
// policies' names.
func checkPolicy(t *testing.T, v string) []string {
	t.Helper()
	return checkItems(t, "RateLimit-Policy", v, "q", "w", 1)
}

// checkLimit checks a RateLimit value: a non-empty List of Strings, each
// with a non-negative Integer r and t, and pk a Byte Sequence if present.
func checkLimit(t *testing.T, v string) []string {
	t.Helper()
	return checkItems(t, "RateLimit", v, "r", "t", 0)
}

// checkItems checks a field's List: String items, each with Integer
// parameters need (required, at least 0) and may (if present, at least
// least), an optional Byte Sequence pk, and nothing else. It returns the
// items' Strings.
func checkItems(t *testing.T, field, v, need, may string, least int64) []string {
	t.Helper()
	l, err := parseSFList(v)
	require.NoError(t, err, "%s: %s", field, v)
	require.NotEmpty(t, l, v)
	var names []string
	for _, it := range l {
		name, ok := it.bare.(string)
		require.True(t, ok, "the policy is a String: %s", v)
		names = append(names, name)
		n, ok := it.param(need)
		require.True(t, ok, "%s is required: %s", need, v)
		assert.GreaterOrEqual(t, n.(int64), int64(0), v)
		if m, ok := it.param(may); ok {
			assert.GreaterOrEqual(t, m.(int64), least, v)
		}
		if pk, ok := it.param("pk"); ok {
			assert.IsType(t, []byte(nil), pk, v)
		}
		for _, p := range it.params {
			assert.Contains(t, []string{need, may, "pk"}, p.key, v)
		}
	}
	return names
}

// TestFieldsParse sends requests, admitted and refused, through the
// middleware over single rules of every algorithm, composites and plans
// of layers, with and without a partition key, and parses every
// RateLimit-Policy and RateLimit value with the strict parser: each lists
// exactly the enforced layers, in order, under the same names.
func TestFieldsParse(t *testing.T) {
	names := []string{"api", "", `a "quoted" \ name`, "é-non-ascii", "with,comma;and=semicolon"}
	type subject struct {
		name  string
		lim   func(clk ratelimit.Clock, name string) ratelimit.KeyedLimiter
		layer []string // the names listed, for the name given; nil: the name given (or "default")
	}
	single := func(rule func(name string) ratelimit.Rule) func(ratelimit.Clock, string) ratelimit.KeyedLimiter {
		return func(clk ratelimit.Clock, name string) ratelimit.KeyedLimiter {
			s, err := ratelimit.NewStore(rule(name), ratelimit.WithClock(clk))
			require.NoError(t, err)
			return s
		}
	}
	layers := func(name string) []ratelimit.Layer {
		return []ratelimit.Layer{
			{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 2, Name: name + "-burst"}},
			{Rule: ratelimit.FixedWindow{Limit: 1000, Window: 24 * time.Hour, Name: name + "-daily"}},
			{Rule: ratelimit.SlidingLog{Limit: 1, Window: time.Hour, Name: name + "-watch"}, Shadow: true},
			{Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(100), Capacity: 50, Name: name + "-queue"}},
		}
	}
	subjects := []subject{
		{name: "TokenBucket", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2, Name: n}
		})},
		{name: "GCRA", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 2, Name: n}
		})},
		{name: "LeakyBucket", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.LeakyBucket{Rate: ratelimit.Every(3 * time.Second), Capacity: 1, Name: n}
		})},
		{name: "FixedWindow", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.FixedWindow{Limit: 2, Window: 1500 * time.Millisecond, Name: n}
		})},
		{name: "SlidingLog", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.SlidingLog{Limit: 2, Window: 10 * time.Second, Name: n}
		})},
		{name: "SlidingCounter", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.SlidingCounter{Limit: 2, Window: time.Minute, Name: n}
		})},
		{name: "SubWindow", lim: single(func(n string) ratelimit.Rule {
			return ratelimit.SubWindow{Limit: 2, Window: time.Minute, Buckets: 6, Name: n}
		})},
		{name: "Composite", lim: func(clk ratelimit.Clock, name string) ratelimit.KeyedLimiter {
			c, err := ratelimit.Compose(layers(name), ratelimit.WithClock(clk))
			require.NoError(t, err)
			return c
		}, layer: []string{"-burst", "-daily", "-queue"}},
		{name: "Plans of layers", lim: func(clk ratelimit.Clock, name string) ratelimit.KeyedLimiter {
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{
				Plans:   map[string]ratelimit.Plan{"pro": {Layers: layers(name)}},
				Default: "pro",
			}, func(string) string { return "pro" }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return p
		}, layer: []string{"-burst", "-daily", "-queue"}},
		{name: "Plans of one rule", lim: func(clk ratelimit.Clock, name string) ratelimit.KeyedLimiter {
			p, err := ratelimit.NewPlans(ratelimit.PlanSet{
				Plans:   map[string]ratelimit.Plan{"free": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerMinute(1), Burst: 2, Name: name}}},
				Default: "free",
			}, func(string) string { return "free" }, ratelimit.WithClock(clk))
			require.NoError(t, err)
			return p
		}},
	}
	// want is the name a field carries for a policy named n: its bytes
	// outside printable ASCII replaced, and "default" for none.
	want := func(n string) string {
		if n == "" {
			return "default"
		}
		b := []byte(n)
		for i, c := range b {
			if c < 0x20 || c > 0x7e {
				b[i] = '?'
			}
		}
		return string(b)
	}
	for _, s := range subjects {
		for _, name := range names {
			for _, pk := range []bool{false, true} {
				opts := []httplimit.Option{httplimit.WithLegacyHeaders()}
				if pk {
					opts = append(opts, httplimit.WithPartitionKey([]byte("a test secret")))
				}
				clk := ratelimit.NewManualClock(0)
				lim := s.lim(clk, name)
				listed := []string{want(name)}
				if s.layer != nil {
					listed = nil
					for _, l := range s.layer {
						listed = append(listed, want(name+l))
					}
				} else if s.name == "Plans of one rule" && name == "" {
					listed = []string{"free"}
				}
				f := newFixtureFor(t, clk, lim, opts...)
				refused := false
				for i := range 6 {
					done := f.start()
					var w *httptest.ResponseRecorder
					for w == nil {
						select {
						case w = <-done:
						case <-time.After(time.Millisecond):
							if at, ok := clk.NextWake(); ok {
								clk.Set(at) // a leaky bucket's queue
							}
						}
					}
					refused = refused || w.Code == http.StatusTooManyRequests
					require.Contains(t, []int{http.StatusOK, http.StatusTooManyRequests}, w.Code)
					msg := s.name + " " + name + " #" + itoa(i)
					require.Len(t, w.Header().Values("RateLimit-Policy"), 1, msg)
					require.Len(t, w.Header().Values("RateLimit"), 1, msg)
					assert.Equal(t, listed, checkPolicy(t, w.Header().Get("RateLimit-Policy")), msg)
					assert.Equal(t, listed, checkLimit(t, w.Header().Get("RateLimit")), msg)
					if pk {
						assert.Contains(t, w.Header().Get("RateLimit"), ";pk=:", msg)
					} else {
						assert.NotContains(t, w.Header().Get("RateLimit"), ";pk=", msg)
					}
				}
				assert.True(t, refused, "%s %q: the trace reaches a refusal", s.name, name)
			}
		}
	}
}

// TestCompositeFieldsEveryLayer: the fields of a composite give each
// layer's own allowance, the per-second and the per-day one together.
func TestCompositeFieldsEveryLayer(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "second"}},
		{Rule: ratelimit.FixedWindow{Limit: 3, Window: 24 * time.Hour, Name: "day"}},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "trial"}, Shadow: true},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	f := newFixtureFor(t, clk, c)
	w := f.do()
	assert.Equal(t, `"second";q=2;w=1, "day";q=3;w=86400`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"second";r=1;t=1, "day";r=2;t=86400`, w.Header().Get("RateLimit"))
	f.do()
	w = f.do()
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, `"second";r=0;t=1, "day";r=1;t=86400`, w.Header().Get("RateLimit"),
		"the day's allowance as it stands: the refused request spent nothing")
	clk.Advance(time.Second)
	w = f.do()
	assert.Equal(t, `"second";r=1;t=1, "day";r=0;t=86399`, w.Header().Get("RateLimit"))
}

// TestPartitionKey: pk is a keyed hash of the request's key, the same for
// one key whatever the policy, different for another key or secret, and
// never the key itself.
func TestPartitionKey(t *testing.T) {
	pkOf := func(secret, remote string) string {
		f := newFixture(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 5, Name: "api"},
			httplimit.WithPartitionKey([]byte(secret)))
		w := f.do(from(remote))
		l, err := parseSFList(w.Header().Get("RateLimit"))
		require.NoError(t, err)
		pk, ok := l[0].param("pk")
		require.True(t, ok)
		p, err := parseSFList(w.Header().Get("RateLimit-Policy"))
		require.NoError(t, err)
		ppk, _ := p[0].param("pk")
		assert.Equal(t, pk, ppk, "the same pk in both fields")
		assert.Len(t, pk, 8)
		assert.NotContains(t, w.Header().Get("RateLimit"), remote[:9])
		return string(pk.([]byte))
	}
	a := pkOf("s1", "192.0.2.1:1")
	assert.Equal(t, a, pkOf("s1", "192.0.2.1:2"), "one key, one partition")
	assert.NotEqual(t, a, pkOf("s1", "192.0.2.2:1"), "another key")
	assert.NotEqual(t, a, pkOf("s2", "192.0.2.1:1"), "another secret")
	assert.Panics(t, func() { httplimit.WithPartitionKey(nil) })
}

// TestPartitionKeyOnCostAboveCapacity: the 400 for a cost the policy can
// never admit names the policy in RateLimit-Policy, and with
// WithPartitionKey that item carries the key's pk like every other item of
// the field, the same as the key's other answers.
func TestPartitionKeyOnCostAboveCapacity(t *testing.T) {
	huge := httplimit.WithCost(func(r *http.Request) (ratelimit.Units, error) {
		if r.URL.Path == "/huge" {
			return 6 * ratelimit.Unit, nil
		}
		return ratelimit.Unit, nil
	})
	f := newFixture(t, ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 5, Name: "api"},
		httplimit.WithPartitionKey([]byte("a test secret")), huge)
	pkIn := func(w *httptest.ResponseRecorder) any {
		t.Helper()
		p, err := parseSFList(w.Header().Get("RateLimit-Policy"))
		require.NoError(t, err)
		require.Len(t, p, 1)
		pk, ok := p[0].param("pk")
		require.True(t, ok, "pk in %q", w.Header().Get("RateLimit-Policy"))
		return pk
	}
	admitted := f.do()
	require.Equal(t, http.StatusOK, admitted.Code)
	w := f.do(func(r *http.Request) { r.URL.Path = "/huge" })
	require.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, "cost_exceeds_limit", jsonBody(t, w)["error"])
	assert.Equal(t, pkIn(admitted), pkIn(w))
	assert.True(t, strings.HasPrefix(w.Header().Get("RateLimit-Policy"), `"api";q=5;w=5;pk=:`), w.Header().Get("RateLimit-Policy"))
	assert.Empty(t, w.Header().Values("RateLimit"))
}

// TestLayersInShadowModeAndContext: a composite asked in shadow mode, or
// for a request whose context has ended, answers as before.
func TestLayersContextEnded(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	c, err := ratelimit.Compose([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "second"}},
	}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	f := newFixtureFor(t, clk, c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := f.do(withContext(ctx))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, `"second";r=1;t=1`, f.do().Header().Get("RateLimit"), "nothing spent")
}

// TestPlanWithMaxDelay: a Plans limiter with WithMaxDelay is asked with
// CheckLayers, which takes the request's context: the plan WithPlan
// chooses reaches it.
func TestPlanWithMaxDelay(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	p, err := ratelimit.NewPlans(ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 5}},
			"pro":  {Rule: ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(10), Capacity: 50}},
		},
		Default: "free",
	}, func(string) string { return "free" }, ratelimit.WithClock(clk))
	require.NoError(t, err)
	f := newFixtureFor(t, clk, p, httplimit.WithMaxDelay(time.Second),
		httplimit.WithPlan(func(r *http.Request) string { return r.Header.Get("X-Plan") }))
	w := f.do(header("X-Plan", "pro"))
	assert.Equal(t, `"pro";q=50;w=5`, w.Header().Get("RateLimit-Policy"))
	w = f.do(from("192.0.2.2:1"))
	assert.Equal(t, `"free";q=5;w=5`, w.Header().Get("RateLimit-Policy"))
}
