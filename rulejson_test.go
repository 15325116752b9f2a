package ratelimit_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

func TestParseRate(t *testing.T) {
	good := []struct {
		in   string
		want ratelimit.Rate
	}{
		{"10/s", ratelimit.PerSecond(10)},
		{"100/min", ratelimit.PerMinute(100)},
		{"5000/h", ratelimit.PerHour(5000)},
		{"7/3s", ratelimit.Rate{Count: 7, Per: 3 * time.Second}},
		{"1/24h", ratelimit.Rate{Count: 1, Per: 24 * time.Hour}},
		{"3/250ms", ratelimit.Rate{Count: 3, Per: 250 * time.Millisecond}},
		{"2/1h30m", ratelimit.Rate{Count: 2, Per: 90 * time.Minute}},
		{"5/2min", ratelimit.Rate{Count: 5, Per: 2 * time.Minute}},
		{"10/1s", ratelimit.PerSecond(10)},
		{"1/m", ratelimit.PerMinute(1)},
		{"1/ms", ratelimit.Rate{Count: 1, Per: time.Millisecond}},
		{"1/us", ratelimit.Rate{Count: 1, Per: time.Microsecond}},
		{"1/µs", ratelimit.Rate{Count: 1, Per: time.Microsecond}},
		{"13/7us", ratelimit.Rate{Count: 13, Per: 7 * time.Microsecond}},
		{"1/ns", ratelimit.Rate{Count: 1, Per: 1}},
		{"9/1500ns", ratelimit.Rate{Count: 9, Per: 1500}},
		{"1000003/h", ratelimit.PerHour(1_000_003)},
		{"1000000000000000/s", ratelimit.PerSecond(1e15)},
		{"1/1.5s", ratelimit.Rate{Count: 1, Per: 1500 * time.Millisecond}},
		{"10/1h30min", ratelimit.Rate{Count: 10, Per: 90 * time.Minute}},
		{"10/1min30s", ratelimit.Rate{Count: 10, Per: 90 * time.Second}},
		{"10/1m30s", ratelimit.Rate{Count: 10, Per: 90 * time.Second}},
		{"1/0.5us", ratelimit.Rate{Count: 1, Per: 500}},
		{"1/1.000000001s", ratelimit.Rate{Count: 1, Per: time.Second + 1}},
		{"1/1.500000000000000000000000000s", ratelimit.Rate{Count: 1, Per: 1500 * time.Millisecond}},
		{"1/0.0001220703125h", ratelimit.Rate{Count: 1, Per: 439_453_125}},
		{"1/1h1h", ratelimit.Rate{Count: 1, Per: 2 * time.Hour}},
		{"1/4611686018427387903ns", ratelimit.Rate{Count: 1, Per: ratelimit.MaxTime - 1}},
	}
	for _, tc := range good {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ratelimit.ParseRate(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			again, err := ratelimit.ParseRate(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, again, "String %q reads back differently", got.String())
		})
	}
	bad := []struct {
		in, why string
	}{
		{"", "is not a rate"},
		{"10", "is not a rate"},
		{"10 per second", "is not a rate"},
		{"10/", "has a period that is neither"},
		{"/s", "has a count that is not a whole number"},
		{"ten/s", "has a count that is not a whole number"},
		{"-1/s", "has a count that is not a whole number"},
		{"+1/s", "has a count that is not a whole number"},
		{" 10/s", "has a count that is not a whole number"},
		{"1e3/s", "has a count that is not a whole number"},
		{"1.5/s", "has a count that is not a whole number"},
		{"99999999999999999999/s", "has a count that is not a whole number"},
		{"10/x", "has a period that is neither"},
		{"10/ s", "has a period that is neither"},
		{"10/s/s", "has a period that is neither"},
		{"10/-1s", "has a period that is neither"},
		{"10/+1s", "has a period that is neither"},
		{"10/.5s", "has a period that is neither"},
		{"10/1d", "has a period that is neither"},
		{"10/3", "has a period that is neither"},
		{"10/99999999999h", "has a period that must be less than MaxTime"},
		{"10/4611686018427387904ns", "has a period that must be less than MaxTime"},
		{"10/4611686018427387905ns", "has a period that must be less than MaxTime"},
		{"10/1281168h1ns", "has a period that must be less than MaxTime"},
		{"10/99999999999999999999999s", "has a period that must be less than MaxTime"},
		{"10/99999999999999999999999sx", "has a period that is neither"},
		{"10/1.9ns", "has a period that is not a whole number of nanoseconds"},
		{"10/1.5ns", "has a period that is not a whole number of nanoseconds"},
		{"3/1.0000000001s", "has a period that is not a whole number of nanoseconds"},
		{"3/0.00000000000000000000000001h", "has a period that is not a whole number of nanoseconds"},
		{"3/1.5ns1x", "has a period that is neither"},
		{"10/1.s", "has a period that is neither"},
		{"10/1..5s", "has a period that is neither"},
		{"10/1e3s", "has a period that is neither"},
		{"10/1 s", "has a period that is neither"},
		{"10/1sx", "has a period that is neither"},
		{"10/1s2", "has a period that is neither"},
		{"10/s1s", "has a period that is neither"},
		{"10/1d", "has a period that is neither"},
		{"10/1mins", "has a period that is neither"},
		{"0/s", "has a count that must be positive"},
		{"1000000000000001/s", "has a count that must be at most 1e15"},
		{"10/0s", "has a period that must be positive"},
		{"1/2000000h", "has a period that must be less than MaxTime"},
	}
	for _, tc := range bad {
		t.Run("bad "+tc.in, func(t *testing.T) {
			_, err := ratelimit.ParseRate(tc.in)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.Contains(t, err.Error(), tc.why)
		})
	}
}

// drawAnyRate draws a rate from the whole range the constructors accept.
func drawAnyRate(t *rapid.T) ratelimit.Rate {
	return ratelimit.Rate{
		Count: rapid.OneOf(rapid.Int64Range(1, 100), rapid.Int64Range(1, 1e15)).Draw(t, "count"),
		Per: time.Duration(rapid.OneOf(
			rapid.SampledFrom([]int64{int64(time.Second), int64(time.Minute), int64(time.Hour), int64(time.Millisecond)}),
			rapid.Map(rapid.Int64Range(1, 1e6), func(n int64) int64 { return n * int64(time.Second) }),
			rapid.Int64Range(1, int64(ratelimit.MaxTime)-1),
		).Draw(t, "per")),
	}
}

func TestParseRateInvertsString(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := drawAnyRate(t)
		got, err := ratelimit.ParseRate(r.String())
		require.NoError(t, err, "%q", r.String())
		require.Equal(t, r, got, "%q", r.String())
	})
}

// TestParseRateReadsGoDurations: a period written as time.Duration's String
// writes it (decimal fractions such as "1.5µs" or "2h3m4.000000005s")
// reads back exactly.
func TestParseRateReadsGoDurations(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := time.Duration(rapid.OneOf(
			rapid.Int64Range(1, 1e6),
			rapid.Int64Range(1, int64(ratelimit.MaxTime)-1),
		).Draw(t, "per"))
		got, err := ratelimit.ParseRate("1/" + d.String())
		require.NoError(t, err, "%q", d.String())
		require.Equal(t, ratelimit.Every(d), got, "%q", d.String())
	})
}

// drawRuleSpec draws a valid rule of any algorithm from the whole accepted
// range, with any name, in either mode.
func drawRuleSpec(t *rapid.T) ratelimit.RuleSpec {
	name := rapid.OneOf(rapid.SampledFrom([]string{"", "free-global", "login-per-ip", `a "quoted" <name> & more`}), rapid.String()).Draw(t, "name")
	capacity := rapid.OneOf(rapid.Int64Range(1, 100), rapid.Int64Range(1, 1e15)).Draw(t, "capacity")
	a := rapid.SampledFrom(testedAlgorithms).Draw(t, "kind")
	s := settings{capacity: capacity, name: name}
	if a.bucket {
		s.rate = drawAnyRate(t)
		for !spanFits(s.rate, capacity) {
			s.rate = drawAnyRate(t)
		}
	} else {
		s.window = time.Duration(rapid.OneOf(
			rapid.SampledFrom([]int64{int64(time.Second), int64(time.Minute), int64(10 * time.Second), int64(time.Hour)}),
			rapid.Int64Range(1, int64(ratelimit.MaxTime)-1),
		).Draw(t, "window"))
	}
	rule := a.rule(s)
	return ratelimit.RuleSpec{Rule: rule, Shadow: rapid.Bool().Draw(t, "shadow")}
}

func TestRuleSpecRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := drawRuleSpec(t)
		data, err := json.Marshal(spec)
		require.NoError(t, err)
		var back ratelimit.RuleSpec
		require.NoError(t, json.Unmarshal(data, &back), "%s", data)
		require.Equal(t, spec, back, "%s", data)
		again, err := json.Marshal(back)
		require.NoError(t, err)
		require.Equal(t, string(data), string(again))
	})
}

func TestRuleSpecGood(t *testing.T) {
	for _, tc := range []struct {
		in        string
		want      ratelimit.RuleSpec
		canonical string // "" when it is in
	}{
		{
			in:   `{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":20}`,
			want: ratelimit.RuleSpec{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "free-global"}},
		},
		{
			in:        `{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"60s","mode":"shadow"}`,
			want:      ratelimit.RuleSpec{Rule: ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login-per-ip"}, Shadow: true},
			canonical: `{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"1m","mode":"shadow"}`,
		},
		{
			in:   `{"algorithm":"gcra","rate":"100/min","burst":100}`,
			want: ratelimit.RuleSpec{Rule: ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}},
		},
		{
			in:   `{"name":"partner","algorithm":"leaky_bucket","rate":"7/3s","capacity":21}`,
			want: ratelimit.RuleSpec{Rule: ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Second}, Capacity: 21, Name: "partner"}},
		},
		{
			in:        "{\n  \"mode\": \"enforce\",\n  \"window\": \"1h30m\",\n  \"limit\": 5000,\n  \"algorithm\": \"fixed_window\"\n}",
			want:      ratelimit.RuleSpec{Rule: ratelimit.FixedWindow{Limit: 5000, Window: 90 * time.Minute}},
			canonical: `{"algorithm":"fixed_window","limit":5000,"window":"90m"}`,
		},
		{
			in:        `{"algorithm":"sliding_log","limit":5,"window":"1min30s"}`,
			want:      ratelimit.RuleSpec{Rule: ratelimit.SlidingLog{Limit: 5, Window: 90 * time.Second}},
			canonical: `{"algorithm":"sliding_log","limit":5,"window":"90s"}`,
		},
		{
			in:        `{"algorithm":"fixed_window","limit":5,"window":"1.5us"}`,
			want:      ratelimit.RuleSpec{Rule: ratelimit.FixedWindow{Limit: 5, Window: 1500}},
			canonical: `{"algorithm":"fixed_window","limit":5,"window":"1500ns"}`,
		},
		{
			in:        `{"name":"","algorithm":"sliding_counter","limit":100,"window":"60000ms"}`,
			want:      ratelimit.RuleSpec{Rule: ratelimit.SlidingCounter{Limit: 100, Window: time.Minute}},
			canonical: `{"algorithm":"sliding_counter","limit":100,"window":"1m"}`,
		},
		{
			in:        `{"name":"\u0062ulk","algorithm":"token_bucket","rate":"5000/1h","burst":1000000000}`,
			want:      ratelimit.RuleSpec{Rule: ratelimit.TokenBucket{Rate: ratelimit.PerHour(5000), Burst: 1e9, Name: "bulk"}},
			canonical: `{"name":"bulk","algorithm":"token_bucket","rate":"5000/h","burst":1000000000}`,
		},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var got ratelimit.RuleSpec
			require.NoError(t, json.Unmarshal([]byte(tc.in), &got))
			assert.Equal(t, tc.want, got)
			out, err := json.Marshal(got)
			require.NoError(t, err)
			want := tc.canonical
			if want == "" {
				want = tc.in
			}
			assert.Equal(t, want, string(out))
		})
	}
}

func TestRuleSpecBad(t *testing.T) {
	for _, tc := range []struct {
		in    string
		rule  string // how the error names the rule
		field string
		why   string
	}{
		{`[]`, "rule", "JSON", "must be an object"},
		{`"token_bucket"`, "rule", "JSON", "must be an object"},
		{`null`, "rule", "JSON", "must be an object"},
		{`{"algorithm":"gcra","rate":"1/s","burst":1,"burst":2}`, "rule", "burst", "appears more than once"},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","burst":2,"burst":3}`, `rule "api"`, "burst", "appears more than once"},
		{`{"name":"api","algoritm":"gcra","rate":"1/s","burst":2}`, `rule "api"`, "algoritm", "is not a rule field"},
		{`{"algoritm":"gcra","rate":"1/s","burst":2}`, "rule", "algoritm", "is not a rule field"},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","brust":2}`, `rule "api"`, "brust", "is not a rule field"},
		{`{"name":"a","name":"b","algorithm":"gcra","rate":"1/s","burst":1}`, "rule", "name", "appears more than once"},
		{`{"name":7,"algorithm":"gcra","rate":"1/s","burst":1}`, "rule", "name", "must be a JSON string"},
		{`{"name":"api","rate":"1/s","burst":1}`, `rule "api"`, "algorithm", "is missing"},
		{`{"name":"api","algorithm":"token-bucket","rate":"1/s","burst":1}`, `rule "api"`, "algorithm", `"token-bucket" is not one of`},
		{`{"name":"api","algorithm":null,"rate":"1/s","burst":1}`, `rule "api"`, "algorithm", "must be a JSON string"},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","burst":1,"mode":"dry-run"}`, `rule "api"`, "mode", `"dry-run" is neither`},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","burst":1,"mode":true}`, `rule "api"`, "mode", "must be a JSON string"},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","burst":1,"Burst":2}`, `rule "api"`, "Burst", "is not a rule field"},
		{`{"name":"api","algorithm":"gcra","rate":"1/s","burst":1,"limit":2}`, `rule "api"`, "limit", "is not a field of gcra"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"60s","rate":"5/min"}`, `rule "login"`, "rate", "is not a field of sliding_log"},
		{`{"algorithm":"leaky_bucket","rate":"1/s","burst":1}`, "leaky_bucket rule", "burst", "is not a field of leaky_bucket"},
		{`{"name":"api","algorithm":"token_bucket","burst":20}`, `rule "api"`, "rate", "is missing"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s"}`, `rule "api"`, "burst", "is missing"},
		{`{"algorithm":"fixed_window","limit":5}`, "fixed_window rule", "window", "is missing"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/x","burst":20}`, `rule "api"`, "rate", `"10/x" has a period that is neither`},
		{`{"name":"api","algorithm":"token_bucket","rate":10,"burst":20}`, `rule "api"`, "rate", "must be a JSON string"},
		{`{"name":"api","algorithm":"token_bucket","rate":"0/s","burst":20}`, `rule "api"`, "rate", `"0/s" has a count that must be positive`},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":"20"}`, `rule "api"`, "burst", "must be a whole number of units"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":20.5}`, `rule "api"`, "burst", "must be a whole number of units"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":2e1}`, `rule "api"`, "burst", "must be a whole number of units"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":null}`, `rule "api"`, "burst", "must be a whole number of units"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":99999999999999999999}`, `rule "api"`, "burst", "must be a whole number of units"},
		{`{"name":"api","algorithm":"token_bucket","rate":"10/s","burst":0}`, `rule "api"`, "burst", "must be positive"},
		{`{"name":"api","algorithm":"gcra","rate":"10/s","burst":-3}`, `rule "api"`, "burst", "must be positive"},
		{`{"name":"api","algorithm":"gcra","rate":"10/s","burst":1000000000000001}`, `rule "api"`, "burst", "must be at most 1e15"},
		{`{"name":"slow","algorithm":"gcra","rate":"1/2000h","burst":1000000000000000}`, `rule "slow"`, "burst", "takes longer than MaxTime to refill at the rate"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"a minute"}`, `rule "login"`, "window", `"a minute" is not a duration`},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":60}`, `rule "login"`, "window", "must be a JSON string"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"0s"}`, `rule "login"`, "window", "must be positive"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"1.5ns"}`, `rule "login"`, "window", `"1.5ns" is not a whole number of nanoseconds`},
		{`{"name":"login","algorithm":"fixed_window","limit":5,"window":"1.0000000001s"}`, `rule "login"`, "window", `"1.0000000001s" is not a whole number of nanoseconds`},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"2000000h"}`, `rule "login"`, "window", "must be less than MaxTime"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"4611686018427387904ns"}`, `rule "login"`, "window", "must be less than MaxTime"},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"60"}`, `rule "login"`, "window", `"60" is not a duration`},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":".5s"}`, `rule "login"`, "window", `".5s" is not a duration`},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"+1m"}`, `rule "login"`, "window", `"+1m" is not a duration`},
		{`{"name":"login","algorithm":"sliding_log","limit":5,"window":"1d"}`, `rule "login"`, "window", `"1d" is not a duration`},
		{`{"name":"login","algorithm":"sliding_counter","limit":5,"window":"-1m"}`, `rule "login"`, "window", "must be positive"},
		{`{"name":"login","algorithm":"fixed_window","limit":0,"window":"1m"}`, `rule "login"`, "limit", "must be positive"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var got ratelimit.RuleSpec
			err := json.Unmarshal([]byte(tc.in), &got)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re), "%T %v", err, err)
			assert.Equal(t, tc.rule, re.Rule)
			assert.Equal(t, tc.field, re.Field)
			assert.Contains(t, re.Reason, tc.why)
			assert.Equal(t, ratelimit.RuleSpec{}, got, "a failed read leaves the spec alone")
		})
	}
	t.Run("an error names the rule and the field", func(t *testing.T) {
		var got ratelimit.RuleSpec
		err := json.Unmarshal([]byte(`{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":0}`), &got)
		assert.EqualError(t, err, `ratelimit: invalid rule "free-global": burst must be positive`)
	})
	t.Run("not JSON at all", func(t *testing.T) {
		var got ratelimit.RuleSpec
		require.Error(t, json.Unmarshal([]byte(`{"algorithm":`), &got))
		require.ErrorIs(t, got.UnmarshalJSON([]byte(`{"algorithm":"gcra"} {}`)), ratelimit.ErrInvalidRule)
	})
}

func TestRuleSpecList(t *testing.T) {
	var specs []ratelimit.RuleSpec
	require.NoError(t, json.Unmarshal([]byte(`[
		{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":20},
		{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"60s","mode":"shadow"}
	]`), &specs))
	require.Len(t, specs, 2)
	assert.Equal(t, "free-global", specs[0].Rule.(ratelimit.TokenBucket).Name)
	assert.True(t, specs[1].Shadow)
	// Every rule read is one the constructors accept.
	for _, s := range specs {
		_, err := ratelimit.New(s.Rule)
		require.NoError(t, err)
	}
}

func TestRuleSpecMarshalErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		spec  ratelimit.RuleSpec
		field string
	}{
		"nil rule":         {ratelimit.RuleSpec{}, "Rule"},
		"nil pointer":      {ratelimit.RuleSpec{Rule: (*ratelimit.GCRA)(nil)}, "Rule"},
		"invalid rule":     {ratelimit.RuleSpec{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1)}}, "Burst"},
		"invalid window":   {ratelimit.RuleSpec{Rule: ratelimit.SlidingLog{Limit: 1, Window: math.MinInt64}}, "Window"},
		"invalid UTF-8":    {ratelimit.RuleSpec{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1, Name: "\xff"}}, "Rule.Name"},
		"zero rate period": {ratelimit.RuleSpec{Rule: ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 1}, Capacity: 1}}, "Rate.Per"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := json.Marshal(tc.spec)
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re), "%v", err)
			assert.Equal(t, tc.field, re.Field)
		})
	}
	t.Run("pointer rules are written as the rule", func(t *testing.T) {
		out, err := json.Marshal(ratelimit.RuleSpec{Rule: &ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 2}})
		require.NoError(t, err)
		assert.Equal(t, `{"algorithm":"gcra","rate":"3/s","burst":2}`, string(out))
	})
}

// FuzzParseRule reads arbitrary bytes as a rule: it never panics; what it
// accepts is a rule the constructors accept, and writes and reads back
// unchanged; what it rejects outside JSON syntax is a *RuleError.
func FuzzParseRule(f *testing.F) {
	for _, seed := range []string{
		`{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":20}`,
		`{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"60s","mode":"shadow"}`,
		`{"algorithm":"leaky_bucket","rate":"7/3s","capacity":21}`,
		`{"algorithm":"sliding_counter","limit":100,"window":"1m"}`,
		`{"algorithm":"fixed_window","limit":1,"window":"1ns","mode":"enforce"}`,
		`{"algorithm":"gcra","rate":"1000000000000000/1ns","burst":1}`,
		`{"algorithm":"gcra","rate":"1/s","burst":1,"burst":1}`,
		`{"name":"api","algorithm":"gcra","rate":"1/s","burst":2,"burst":3}`,
		`{"name":"api","algoritm":"gcra","rate":"1/s","burst":2}`,
		`{"algorithm":"sliding_log","limit":5,"window":"1.5ns"}`,
		`{"algorithm":"fixed_window","limit":5,"window":"1min30.5s"}`,
		`{"algorithm":"token_bucket","rate":"3/1.0000000001s","burst":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec ratelimit.RuleSpec
		if err := json.Unmarshal(data, &spec); err != nil {
			var syntax *json.SyntaxError
			var re *ratelimit.RuleError
			if !errors.As(err, &syntax) && !errors.As(err, &re) {
				t.Fatalf("%q: unexpected error %T %v", data, err, err)
			}
			return
		}
		if _, err := ratelimit.New(spec.Rule); err != nil {
			t.Fatalf("%q: read a rule New rejects: %v", data, err)
		}
		out, err := json.Marshal(spec)
		if err != nil {
			t.Fatalf("%q: cannot write what was read: %v", data, err)
		}
		var back ratelimit.RuleSpec
		if err := json.Unmarshal(out, &back); err != nil || back != spec {
			t.Fatalf("%q: wrote %s, read back %+v (%v), want %+v", data, out, back, err, spec)
		}
	})
}

// FuzzParseRate checks that whatever ParseRate accepts prints and reads back
// to the same rate.
func FuzzParseRate(f *testing.F) {
	for _, seed := range []string{"10/s", "100/min", "5000/h", "7/3s", "2/1h30m", "1/1.5s", "0/s", "10/µs", "10/1.9ns", "3/1.0000000001s", "10/1min30s", "10/1h30min", "1/0.0001220703125h", "1/4611686018427387904ns"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ratelimit.ParseRate(s)
		if err != nil {
			if !errors.Is(err, ratelimit.ErrInvalidRule) {
				t.Fatalf("%q: error %v does not match ErrInvalidRule", s, err)
			}
			return
		}
		back, err := ratelimit.ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("%q: read %+v, printed %q, read back %+v (%v)", s, r, r.String(), back, err)
		}
	})
}
