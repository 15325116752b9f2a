package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// RuleSpec is a rule as data: one of the seven rules and its mode, read from
// and written to JSON with [encoding/json]. Each spec is one JSON object:
//
//	{"name":"free-global","algorithm":"token_bucket","rate":"10/s","burst":20}
//	{"name":"login-per-ip","algorithm":"sliding_log","limit":5,"window":"60s","mode":"shadow"}
//
// The fields are:
//
//   - "algorithm" (required): "token_bucket", "gcra", "leaky_bucket",
//     "fixed_window", "sliding_log", "sliding_counter" or "sub_window".
//   - "name": the rule's Name, reported as [Decision].Policy.
//   - "rate" (the three buckets): a rate string read by [ParseRate], such as
//     "10/s", "100/min", "5000/h" or "7/3s".
//   - "burst" (token_bucket, gcra), "capacity" (leaky_bucket), "limit" (the
//     window rules): a whole number of units, as a JSON integer.
//   - "window" (the window rules): a duration, read as the period of a
//     [ParseRate] rate is, such as "60s", "1m", "1h30m" or "1min30s": a
//     whole number of nanoseconds, less than [MaxTime].
//   - "delay" (leaky_bucket): its Delay, a whole number of units as a JSON
//     integer; optional, 0 when left out.
//   - "buckets" (sub_window): its Buckets, a JSON integer from 1 to 60.
//   - "count_refused" (sliding_counter, sub_window): true for CountRefused;
//     optional, false when left out.
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

// MarshalJSON writes the spec in its canonical form. A nil Rule, or one the
// constructors would reject, is an error: what is written can always be
// read back.
func (s RuleSpec) MarshalJSON() ([]byte, error) {
	rule := deref(s.Rule)
	if rule == nil {
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule", Reason: "is nil"}
	}
	alg, v := algorithmOf(rule)
	if alg == nil {
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule", Reason: fmt.Sprintf("is a %T, not one of this package's rules", s.Rule)}
	}
	if !utf8.ValidString(v.name) {
		// JSON would replace the invalid bytes, and the name read back
		// would differ from this one.
		return nil, &RuleError{Rule: "RuleSpec", Field: "Rule.Name", Reason: "is not valid UTF-8"}
	}
	if _, err := s.Rule.bind(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteByte('{')
	if v.name != "" {
		writeMember(&b, "name", v.name)
	}
	writeMember(&b, "algorithm", alg.name)
	for _, f := range alg.fields {
		switch f.kind {
		case rateField:
			writeMember(&b, f.name, v.rate.String())
		case countField:
			writeMember(&b, f.name, v.count)
		case windowField:
			writeMember(&b, f.name, shortDuration(v.window))
		case bucketsField:
			writeMember(&b, f.name, v.buckets)
		case refusedField:
			if v.refused {
				writeMember(&b, f.name, true)
			}
		case delayField:
			if v.delay != 0 {
				writeMember(&b, f.name, v.delay)
			}
		}
	}
	if s.Shadow {
		writeMember(&b, "mode", "shadow")
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// writeMember appends "key":value to an object being written, after a comma
// unless it is the first member.
func writeMember(b *bytes.Buffer, key string, value any) {
	if b.Len() > 1 {
		b.WriteByte(',')
	}
	k, _ := json.Marshal(key)
	v, _ := json.Marshal(value) // strings and integers: cannot fail
	b.Write(k)
	b.WriteByte(':')
	b.Write(v)
}

// UnmarshalJSON reads one rule object (see [RuleSpec]) and validates the
// rule. On an error s is left unchanged.
func (s *RuleSpec) UnmarshalJSON(data []byte) error {
	fields, repeated, err := readObject(data)
	if err != nil {
		return err
	}
	p := specParser{fields: fields, label: "rule"}
	var name, algName, mode string
	// A repeated name leaves the rule without one it can be called by.
	if p.has("name") && repeated != "name" {
		if err := p.str("name", &name); err != nil {
			return err
		}
		p.label = "rule " + strconv.Quote(name)
	}
	if repeated != "" {
		return p.fail(repeated, "appears more than once")
	}
	// An unnamed rule is called by its algorithm, when that reads.
	alg := (*algorithmRow)(nil)
	if p.has("algorithm") && p.str("algorithm", &algName) == nil {
		alg = algorithmNamed(algName)
		if alg != nil && name == "" {
			p.label = alg.name + " rule"
		}
	}
	// Every check below goes through the fields in a fixed order, so that
	// the same input always gives the same error. Fields no algorithm
	// takes come first: a misspelt field must be named as such, not
	// reported as a missing one.
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "name" && k != "algorithm" && k != "mode" && !isRuleField(k) {
			return p.fail(k, "is not a rule field")
		}
	}
	if !p.has("algorithm") {
		return p.fail("algorithm", "is missing")
	}
	if err := p.str("algorithm", &algName); err != nil {
		return err
	}
	if alg == nil {
		return p.fail("algorithm", fmt.Sprintf("%q is not one of %s", algName, algorithmNames()))
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
	for _, k := range keys {
		if k != "name" && k != "algorithm" && k != "mode" && !alg.takes(k) {
			return p.fail(k, "is not a field of "+alg.name)
		}
	}
	for _, f := range alg.fields {
		if !p.has(f.name) && !f.optional {
			return p.fail(f.name, "is missing")
		}
	}

	v := ruleValues{name: name}
	for _, f := range alg.fields {
		if !p.has(f.name) {
			continue // optional: its zero value
		}
		var err error
		switch f.kind {
		case rateField:
			err = p.rate(f.name, &v.rate)
		case countField:
			err = p.integer(f.name, &v.count)
		case windowField:
			err = p.window(f.name, &v.window)
		case bucketsField:
			var n int64
			if err = p.integer(f.name, &n); err == nil {
				if n < 1 || n > MaxSubWindowBuckets {
					err = p.fail(f.name, "must be from 1 to 60")
				}
				v.buckets = int(n)
			}
		case refusedField:
			err = p.boolean(f.name, &v.refused)
		case delayField:
			err = p.integer(f.name, &v.delay)
		}
		if err != nil {
			return err
		}
	}
	rule := alg.build(v)
	if _, err := rule.bind(); err != nil {
		return p.fromBind(err)
	}
	*s = RuleSpec{Rule: rule, Shadow: shadow}
	return nil
}

// readObject reads a JSON object into its fields, rejecting anything else.
// A key that appears more than once keeps its first value and is returned
// as repeated (the first such key), for the caller to report with the
// rule's name.
func readObject(data []byte) (fields map[string]json.RawMessage, repeated string, err error) {
	notObject := &RuleError{Rule: "rule", Field: "JSON", Reason: "must be an object"}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, "", notObject
	}
	fields = make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, "", notObject
		}
		k, ok := tok.(string)
		if !ok {
			return nil, "", notObject
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, "", notObject
		}
		if _, dup := fields[k]; dup {
			if repeated == "" {
				repeated = k
			}
			continue
		}
		fields[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, "", notObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "", notObject
	}
	return fields, repeated, nil
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

// boolean reads field k as a JSON true or false.
func (p *specParser) boolean(k string, out *bool) error {
	switch string(bytes.TrimSpace(p.fields[k])) {
	case "true":
		*out = true
	case "false":
		*out = false
	default:
		return p.fail(k, "must be true or false")
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

// rate reads field k as a rate string.
func (p *specParser) rate(k string, out *Rate) error {
	var s string
	if err := p.str(k, &s); err != nil {
		return err
	}
	r, why := parseRate(s)
	if why != "" {
		return p.fail(k, strconv.Quote(s)+" "+why)
	}
	*out = r
	return nil
}

// window reads field k as a duration string (see parseDuration).
func (p *specParser) window(k string, out *time.Duration) error {
	var s string
	if err := p.str(k, &s); err != nil {
		return err
	}
	d, bad := parseDuration(s)
	switch bad {
	case durationOK:
		*out = d
		return nil
	case durationFraction:
		return p.fail(k, strconv.Quote(s)+" is not a whole number of nanoseconds")
	case durationTooLong:
		return p.fail(k, "must be less than MaxTime")
	}
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		if _, bad := parseDuration(rest); bad != durationSyntax {
			return p.fail(k, "must be positive")
		}
	}
	return p.fail(k, fmt.Sprintf("%q is not a duration such as \"60s\" or \"1h30m\"", s))
}

// ParseRate reads a rate string: a count of units, a slash and a period.
// The period is a unit alone ("s", "min", "h", "m", "ms", "us", "ns",
// meaning one of it) or a duration: a sequence of decimal numbers, each
// with a unit, such as "3s", "250ms", "1h30min" or "1.5s". The units are
// "ns", "us" (or "µs"), "ms", "s", "m" or "min" (minutes) and "h". A
// fraction is read exactly and must come to a whole number of nanoseconds:
// "1.5s" is 1500ms, "1.5ns" is an error. The count is a whole number,
// without a sign. Examples: "10/s", "100/min", "5000/h", "7/3s", "1/24h",
// "3/250ms", "2/1h30m".
//
// ParseRate is the inverse of [Rate.String]: for every rate the
// constructors accept, ParseRate(r.String()) returns r. Rates the
// constructors would reject (a zero count, a count above 1e15, a period
// of [MaxTime] or longer) are errors matching [ErrInvalidRule].
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
	per, bad := time.Duration(0), durationOK
	if u, ok := durationUnit(period); ok && len(u.name) == len(period) {
		per = u.d // a unit alone: one of it
	} else {
		per, bad = parseDuration(period)
	}
	switch bad {
	case durationSyntax:
		return Rate{}, `has a period that is neither a unit ("s", "min", "h") nor a duration ("3s")`
	case durationFraction:
		return Rate{}, "has a period that is not a whole number of nanoseconds"
	case durationTooLong:
		return Rate{}, "has a period that must be less than MaxTime"
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

// durationProblem is what parseDuration found wrong with a duration.
type durationProblem int

const (
	durationOK       durationProblem = iota
	durationSyntax                   // not a duration at all
	durationFraction                 // a fraction of a nanosecond
	durationTooLong                  // longer than MaxTime
)

// durationUnits are the units a duration is written in; where one name is
// a prefix of another, the longer comes first.
var durationUnits = [...]durationUnitName{
	{"ns", time.Nanosecond},
	{"us", time.Microsecond},
	{"µs", time.Microsecond}, // U+00B5 micro sign
	{"μs", time.Microsecond}, // U+03BC Greek mu
	{"ms", time.Millisecond},
	{"min", time.Minute},
	{"m", time.Minute},
	{"s", time.Second},
	{"h", time.Hour},
}

// durationUnit returns the unit s starts with.
func durationUnit(s string) (durationUnitName, bool) {
	for _, u := range durationUnits {
		if strings.HasPrefix(s, u.name) {
			return u, true
		}
	}
	return durationUnitName{}, false
}

// durationUnitName is a unit a duration is written in, and its length.
type durationUnitName struct {
	name string
	d    time.Duration
}

// parseDuration is the one reader of durations, for a rate's period and a
// rule's window: one or more pieces, each a decimal number (digits,
// optionally a point and more digits) and a unit, with no sign and no
// spaces, such as "60s", "1h30min", "1m30s" or "1.5s". Fractions are read
// exactly, as integers: the total must be a whole number of nanoseconds
// (durationFraction otherwise) and at most MaxTime (durationTooLong
// otherwise).
func parseDuration(s string) (time.Duration, durationProblem) {
	if s == "" {
		return 0, durationSyntax
	}
	var total uint64 // <= MaxTime
	for s != "" {
		// The whole part.
		i := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, durationSyntax
		}
		whole, long := decimal(s[:i])
		s = s[i:]
		// The fraction, without its trailing zeros.
		frac := ""
		if s != "" && s[0] == '.' {
			i = 1
			for i < len(s) && '0' <= s[i] && s[i] <= '9' {
				i++
			}
			if i == 1 {
				return 0, durationSyntax
			}
			frac = strings.TrimRight(s[1:i], "0")
			s = s[i:]
		}
		u, ok := durationUnit(s)
		if !ok {
			return 0, durationSyntax
		}
		s = s[len(u.name):]
		if long {
			// Check the rest for syntax before calling the whole too long.
			if _, bad := parseDuration(s); s != "" && bad == durationSyntax {
				return 0, durationSyntax
			}
			return 0, durationTooLong
		}
		// whole*unit + frac*unit/10^len(frac), exactly.
		hi, ns := bits.Mul64(whole, uint64(u.d))
		if hi != 0 || ns > uint64(MaxTime) {
			return 0, tooLong(s)
		}
		if frac != "" {
			// frac has no trailing zero, so it lacks either 2 or 5 as a
			// factor, and 10^len(frac) can divide unit*frac only if the unit
			// supplies that factor len(frac) times: no unit has more than
			// 2^13, so more than 19 digits can never come to whole
			// nanoseconds.
			if len(frac) > 19 {
				return 0, fractionUnlessSyntax(s)
			}
			f, _ := strconv.ParseUint(frac, 10, 64) // < 10^19: fits
			hi, lo := bits.Mul64(f, uint64(u.d))
			q, r := bits.Div64(hi, lo, pow10(len(frac))) // f < 10^len: hi < 10^len
			if r != 0 {
				return 0, fractionUnlessSyntax(s)
			}
			ns += q // both <= MaxTime: no overflow
		}
		total += ns
		if total > uint64(MaxTime) {
			return 0, tooLong(s)
		}
	}
	return time.Duration(total), durationOK
}

// tooLong and fractionUnlessSyntax report a problem found in a piece of a
// duration, unless the rest, s, is not a duration at all.
func tooLong(s string) durationProblem {
	if _, bad := parseDuration(s); s != "" && bad == durationSyntax {
		return durationSyntax
	}
	return durationTooLong
}

func fractionUnlessSyntax(s string) durationProblem {
	if _, bad := parseDuration(s); s != "" && bad == durationSyntax {
		return durationSyntax
	}
	return durationFraction
}

// decimal reads a string of ASCII digits; long is true when its value is
// above MaxTime (it is then not returned).
func decimal(digits string) (v uint64, long bool) {
	for i := 0; i < len(digits); i++ {
		v = v*10 + uint64(digits[i]-'0')
		if v > uint64(MaxTime) {
			return 0, true
		}
	}
	return v, false
}

// pow10 returns 10^k for k <= 19.
func pow10(k int) uint64 {
	p := uint64(1)
	for range k {
		p *= 10
	}
	return p
}
