package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// RuleSpec is a rule as data: one of the six rules and its mode, read from
// and written to JSON with [encoding/json]. Each spec is one JSON object:
//
//	{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":20}
//	{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"60s","mode":"shadow"}
//
// The fields are:
//
//   - "algorithm" (required): "token_bucket", "gcra", "leaky_bucket",
//     "fixed_window", "sliding_log" or "sliding_counter".
//   - "name": the rule's Name, reported as [Decision].Policy.
//   - "rate" (the three buckets): a rate string read by [ParseRate], such as
//     "10/s", "100/min", "5000/h" or "7/3s".
//   - "burst" (token_bucket, gcra), "capacity" (leaky_bucket), "limit" (the
//     window rules): a whole number of units, as a JSON integer.
//   - "window" (the window rules): a duration as [time.ParseDuration] reads
//     it, such as "60s", "1m" or "1h30m".
//   - "mode": "enforce" (the default) or "shadow" (Shadow true), for a rule
//     to be watched before it enforces (see [Shadow] and [Layer]).
//
// Reading is strict, because a limit that silently differs from what its
// author wrote is worse than none: a field that is unknown, repeated, of the
// wrong JSON type, or not used by the rule's algorithm is an error, and so
// is every rule the constructors would reject. Errors are [*RuleError]s
// (matching [ErrInvalidRule]) that name the rule, by its name when it has
// one, and the JSON field.
//
// Writing produces the canonical form: fields in the order above, "name"
// and "mode" left out when empty or "enforce", the rate as [Rate.String]
// prints it, and the window in the largest unit that divides it exactly
// ("1m", not "60s"). Reading what was written gives back an equal RuleSpec:
// the round trip is lossless. A RuleSpec whose Rule is a pointer (such as
// *TokenBucket) is written as the rule it points to and read back as a
// plain value.
type RuleSpec struct {
	Rule   Rule
	Shadow bool
}

// Algorithm names as they appear in JSON.
const (
	algTokenBucket    = "token_bucket"
	algGCRA           = "gcra"
	algLeakyBucket    = "leaky_bucket"
	algFixedWindow    = "fixed_window"
	algSlidingLog     = "sliding_log"
	algSlidingCounter = "sliding_counter"
)

// ruleFields lists, for each algorithm, the fields its rule takes besides
// name, algorithm and mode, in the order they are written.
var ruleFields = map[string][]string{
	algTokenBucket:    {"rate", "burst"},
	algGCRA:           {"rate", "burst"},
	algLeakyBucket:    {"rate", "capacity"},
	algFixedWindow:    {"limit", "window"},
	algSlidingLog:     {"limit", "window"},
	algSlidingCounter: {"limit", "window"},
}

// ruleJSON is the canonical written form.
type ruleJSON struct {
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm"`
	Rate      string `json:"rate,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	Capacity  int64  `json:"capacity,omitempty"`
	Limit     int64  `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"`
	Mode      string `json:"mode,omitempty"`
}

// MarshalJSON writes the spec in its canonical form. A nil Rule, or one the
// constructors would reject, is an error: what is written can always be
// read back.
func (s RuleSpec) MarshalJSON() ([]byte, error) {
	var j ruleJSON
	switch r := deref(s.Rule).(type) {
	case TokenBucket:
		j = ruleJSON{Name: r.Name, Algorithm: algTokenBucket, Rate: r.Rate.String(), Burst: r.Burst}
	case GCRA:
		j = ruleJSON{Name: r.Name, Algorithm: algGCRA, Rate: r.Rate.String(), Burst: r.Burst}
	case LeakyBucket:
		j = ruleJSON{Name: r.Name, Algorithm: algLeakyBucket, Rate: r.Rate.String(), Capacity: r.Capacity}
	case FixedWindow:
		j = ruleJSON{Name: r.Name, Algorithm: algFixedWindow, Limit: r.Limit, Window: shortDuration(r.Window)}
	case SlidingLog:
		j = ruleJSON{Name: r.Name, Algorithm: algSlidingLog, Limit: r.Limit, Window: shortDuration(r.Window)}
	case SlidingCounter:
		j = ruleJSON{Name: r.Name, Algorithm: algSlidingCounter, Limit: r.Limit, Window: shortDuration(r.Window)}
	case nil:
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule", Reason: "is nil"}
	default:
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule", Reason: fmt.Sprintf("is a %T, not one of the six rules", s.Rule)}
	}
	if !utf8.ValidString(j.Name) {
		// JSON would replace the invalid bytes, and the name read back
		// would differ from this one.
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule.Name", Reason: "is not valid UTF-8"}
	}
	if _, err := s.Rule.bind(); err != nil {
		return nil, err
	}
	if s.Shadow {
		j.Mode = "shadow"
	}
	return json.Marshal(j)
}

// deref returns the rule a pointer rule points to (nil for a nil pointer),
// and any other rule as it is.
func deref(r Rule) Rule {
	switch p := r.(type) {
	case *TokenBucket:
		if p != nil {
			return *p
		}
	case *GCRA:
		if p != nil {
			return *p
		}
	case *LeakyBucket:
		if p != nil {
			return *p
		}
	case *FixedWindow:
		if p != nil {
			return *p
		}
	case *SlidingLog:
		if p != nil {
			return *p
		}
	case *SlidingCounter:
		if p != nil {
			return *p
		}
	default:
		return r
	}
	return nil
}

// UnmarshalJSON reads one rule object (see [RuleSpec]) and validates the
// rule. On an error s is left unchanged.
func (s *RuleSpec) UnmarshalJSON(data []byte) error {
	fields, err := readObject(data)
	if err != nil {
		return err
	}
	p := specParser{fields: fields, label: "rule"}
	var name, alg, mode string
	if p.has("name") {
		if err := p.str("name", &name); err != nil {
			return err
		}
		p.label = "rule " + strconv.Quote(name)
	}
	if !p.has("algorithm") {
		return p.fail("algorithm", "is missing")
	}
	if err := p.str("algorithm", &alg); err != nil {
		return err
	}
	own, ok := ruleFields[alg]
	if !ok {
		return p.fail("algorithm", fmt.Sprintf("%q is not one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, sliding_counter", alg))
	}
	if name == "" {
		p.label = alg + " rule"
	}
	shadow := false
	if p.has("mode") {
		if err := p.str("mode", &mode); err != nil {
			return err
		}
		switch mode {
		case "enforce":
		case "shadow":
			shadow = true
		default:
			return p.fail("mode", fmt.Sprintf("%q is neither \"enforce\" nor \"shadow\"", mode))
		}
	}
	// Fields this algorithm does not take, then missing ones, in a fixed
	// order so that the same input always gives the same error.
	extra := make([]string, 0, len(fields))
	for k := range fields {
		if k != "name" && k != "algorithm" && k != "mode" && k != own[0] && k != own[1] {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		if k := extra[0]; isRuleField(k) {
			return p.fail(k, "is not a field of "+alg)
		}
		return p.fail(extra[0], "is not a rule field")
	}
	for _, k := range own {
		if !p.has(k) {
			return p.fail(k, "is missing")
		}
	}

	var rule Rule
	switch alg {
	case algTokenBucket, algGCRA, algLeakyBucket:
		var rs string
		var capacity int64
		if err := p.str("rate", &rs); err != nil {
			return err
		}
		r, why := parseRate(rs)
		if why != "" {
			return p.fail("rate", strconv.Quote(rs)+" "+why)
		}
		if err := p.integer(own[1], &capacity); err != nil {
			return err
		}
		switch alg {
		case algTokenBucket:
			rule = TokenBucket{Rate: r, Burst: capacity, Name: name}
		case algGCRA:
			rule = GCRA{Rate: r, Burst: capacity, Name: name}
		default:
			rule = LeakyBucket{Rate: r, Capacity: capacity, Name: name}
		}
	default:
		var limit int64
		var ws string
		if err := p.integer("limit", &limit); err != nil {
			return err
		}
		if err := p.str("window", &ws); err != nil {
			return err
		}
		w, err := time.ParseDuration(ws)
		if err != nil {
			return p.fail("window", fmt.Sprintf("%q is not a duration such as \"60s\" or \"1h30m\"", ws))
		}
		switch alg {
		case algFixedWindow:
			rule = FixedWindow{Limit: limit, Window: w, Name: name}
		case algSlidingLog:
			rule = SlidingLog{Limit: limit, Window: w, Name: name}
		default:
			rule = SlidingCounter{Limit: limit, Window: w, Name: name}
		}
	}
	if _, err := rule.bind(); err != nil {
		return p.fromBind(err)
	}
	*s = RuleSpec{Rule: rule, Shadow: shadow}
	return nil
}

// isRuleField reports whether k is a field of some algorithm.
func isRuleField(k string) bool {
	switch k {
	case "rate", "burst", "capacity", "limit", "window":
		return true
	}
	return false
}

// readObject reads a JSON object into its fields, rejecting anything else
// and any key that appears twice.
func readObject(data []byte) (map[string]json.RawMessage, error) {
	notObject := &RuleError{Rule: "rule", Field: "JSON", Reason: "must be an object"}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, notObject
	}
	fields := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notObject
		}
		k, ok := tok.(string)
		if !ok {
			return nil, notObject
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, notObject
		}
		if _, dup := fields[k]; dup {
			return nil, &RuleError{Rule: "rule", Field: k, Reason: "appears more than once"}
		}
		fields[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, notObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, notObject
	}
	return fields, nil
}

// specParser reads the fields of one rule object, naming the rule in its
// errors.
type specParser struct {
	fields map[string]json.RawMessage
	label  string // `rule "name"`, `sliding_log rule` or `rule`
}

func (p *specParser) has(k string) bool { _, ok := p.fields[k]; return ok }

func (p *specParser) fail(field, reason string) error {
	return &RuleError{Rule: p.label, Field: field, Reason: reason}
}

// str reads field k as a JSON string.
func (p *specParser) str(k string, out *string) error {
	raw := bytes.TrimSpace(p.fields[k])
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, out) != nil {
		return p.fail(k, "must be a JSON string")
	}
	return nil
}

// integer reads field k as a JSON integer: digits only, no fraction or
// exponent, within int64.
func (p *specParser) integer(k string, out *int64) error {
	raw := string(bytes.TrimSpace(p.fields[k]))
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || (len(raw) > 0 && raw[0] == '+') {
		return p.fail(k, "must be a whole number of units, as a JSON integer")
	}
	*out = n
	return nil
}

// fromBind renames a constructor's error after the JSON field it concerns:
// "Rate.Count" and "Rate.Per" are "rate", "Burst" is "burst", and so on.
func (p *specParser) fromBind(err error) error {
	re, ok := err.(*RuleError)
	if !ok {
		return err
	}
	field, part, _ := strings.Cut(re.Field, ".")
	reason := re.Reason
	switch part {
	case "Count":
		reason = "count " + reason
	case "Per":
		reason = "period " + reason
	}
	reason = strings.ReplaceAll(reason, " at Rate", " at the rate")
	return p.fail(strings.ToLower(field), reason)
}

// ParseRate reads a rate string: a count of units, a slash and a period.
// The period is a unit alone ("s", "min", "h", "m", "ms", "us", "ns",
// meaning one of it) or a duration as [time.ParseDuration] reads it, with
// "min" also read as minutes: "10/s", "100/min", "5000/h", "7/3s",
// "1/24h", "3/250ms", "2/1h30m". The count is a whole number, without a
// sign.
//
// ParseRate is the inverse of [Rate.String]: for every rate the
// constructors accept, ParseRate(r.String()) returns r. Rates the
// constructors would reject (a zero count, a count above 1e15, a period
// longer than [MaxTime]) are errors matching [ErrInvalidRule].
func ParseRate(s string) (Rate, error) {
	r, why := parseRate(s)
	if why != "" {
		return Rate{}, &RuleError{Rule: "Rate", Field: strconv.Quote(s), Reason: why}
	}
	return r, nil
}

// parseRate is ParseRate with the reason for a failure, worded to follow
// the quoted rate string.
func parseRate(s string) (Rate, string) {
	count, period, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, `is not a rate such as "10/s" or "100/min"`
	}
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || count[0] == '+' || count[0] == '-' {
		return Rate{}, "has a count that is not a whole number without a sign"
	}
	per, ok := parsePeriod(period)
	if !ok {
		return Rate{}, `has a period that is neither a unit ("s", "min", "h") nor a duration ("3s")`
	}
	r := Rate{Count: n, Per: per}
	if _, err := r.compile("Rate", "Rate"); err != nil {
		re := err.(*RuleError)
		what := "count"
		if strings.HasSuffix(re.Field, ".Per") {
			what = "period"
		}
		return Rate{}, "has a " + what + " that " + re.Reason
	}
	return r, ""
}

// parsePeriod reads the period of a rate string.
func parsePeriod(s string) (time.Duration, bool) {
	switch s {
	case "ns":
		return time.Nanosecond, true
	case "us", "µs", "μs":
		return time.Microsecond, true
	case "ms":
		return time.Millisecond, true
	case "s":
		return time.Second, true
	case "m", "min":
		return time.Minute, true
	case "h":
		return time.Hour, true
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false // no sign, no bare "."
	}
	if strings.HasSuffix(s, "min") {
		s = strings.TrimSuffix(s, "in") // "2min" is "2m"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, false
	}
	return d, true
}
