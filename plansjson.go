package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"unicode/utf8"
)

// GlobalKey is a [Layer] Key that puts every request on one key: a limit
// shared by all, such as a global cap. Rule-set documents write it as
// "key": "global".
func GlobalKey(string) string { return "*" }

// MarshalJSON and UnmarshalJSON read and write a [PlanSet] as one JSON
// document, strictly, as [RuleSpec] does:
//
//	{
//	  "default": "free",
//	  "on_move": "proportional",
//	  "plans": {
//	    "free": {"name": "free", "algorithm": "token_bucket", "rate": "10/s", "burst": 20},
//	    "pro": {"layers": [
//	      {"name": "pro", "algorithm": "gcra", "rate": "100/s", "burst": 200},
//	      {"name": "all", "algorithm": "gcra", "rate": "1000/s", "burst": 2000, "key": "global"}
//	    ]}
//	  }
//	}
//
// A plan is a rule object (see [RuleSpec]), or an object with "layers", a
// list of rule objects each with an optional "key": "request" (the
// default: the key checked) or "global" ([GlobalKey]). A rule object whose
// "mode" is "shadow" is a layer in shadow mode, and a plan of one such rule
// reads as a plan of one layer. "on_move" is a [Migration] by name:
// "proportional" (the default), "as_is", "additive" or "reset".
//
// Reading is strict: an unknown or repeated field, a wrong type, a default
// that names no plan, or a rule the constructors would reject is an error
// matching [ErrInvalidRule] that names the plan and the field, and nothing
// is read. Writing produces the canonical form, plans in name order, and
// reading it back gives an equal PlanSet. A set whose layers hold what a
// document cannot (a Key other than nil or GlobalKey, OnShadow, Options)
// cannot be written.
//
// MarshalJSON writes the set in its canonical form.
func (s PlanSet) MarshalJSON() ([]byte, error) {
	names := make([]string, 0, len(s.Plans))
	for name := range s.Plans {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range append(names, s.Default) {
		if !utf8.ValidString(name) {
			// JSON would replace the bytes, and the name read back would
			// differ from this one.
			return nil, &RuleError{Rule: "PlanSet", Field: strconv.Quote(name), Reason: "is not valid UTF-8"}
		}
	}
	var b bytes.Buffer
	b.WriteString(`{"default":`)
	writeJSONString(&b, s.Default)
	if s.OnMove != MigrateProportional {
		if !s.OnMove.valid() {
			return nil, &RuleError{Rule: "PlanSet", Field: "OnMove", Reason: fmt.Sprintf("%v is not a migration policy", s.OnMove)}
		}
		b.WriteString(`,"on_move":`)
		writeJSONString(&b, s.OnMove.String())
	}
	b.WriteString(`,"plans":{`)
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, name)
		b.WriteByte(':')
		plan, err := marshalPlan(s.Plans[name])
		if err != nil {
			return nil, planError(name, err)
		}
		b.Write(plan)
	}
	b.WriteString("}}")
	return b.Bytes(), nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}

// marshalPlan writes one plan: a rule object, or {"layers": [...]}.
func marshalPlan(p Plan) ([]byte, error) {
	if p.Rule != nil && len(p.Layers) == 0 {
		return RuleSpec{Rule: p.Rule}.MarshalJSON()
	}
	if p.Rule != nil || len(p.Layers) == 0 {
		return nil, &RuleError{Rule: "plan", Field: "Rule", Reason: "must be set, or Layers, but not both"}
	}
	var b bytes.Buffer
	b.WriteString(`{"layers":[`)
	for i, l := range p.Layers {
		field := func(f string) string { return fmt.Sprintf("Layers[%d].%s", i, f) }
		switch {
		case l.OnShadow != nil:
			return nil, &RuleError{Rule: "plan", Field: field("OnShadow"), Reason: "is a function, which a document cannot hold"}
		case len(l.Options) > 0:
			return nil, &RuleError{Rule: "plan", Field: field("Options"), Reason: "are functions, which a document cannot hold"}
		case l.Key != nil && !isGlobalKey(l.Key):
			return nil, &RuleError{Rule: "plan", Field: field("Key"), Reason: "is a function other than GlobalKey, which a document cannot hold"}
		}
		rule, err := RuleSpec{Rule: l.Rule, Shadow: l.Shadow}.MarshalJSON()
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		if l.Key != nil {
			rule = append(rule[:len(rule)-1], `,"key":"global"}`...)
		}
		b.Write(rule)
	}
	b.WriteString("]}")
	return b.Bytes(), nil
}

// isGlobalKey reports whether f is GlobalKey.
func isGlobalKey(f func(string) string) bool {
	return reflect.ValueOf(f).Pointer() == reflect.ValueOf(GlobalKey).Pointer()
}

// UnmarshalJSON reads a rule-set document and validates it whole, as
// [NewPlans] would. On an error s is left unchanged.
func (s *PlanSet) UnmarshalJSON(data []byte) error {
	fail := func(field, reason string) error { return &RuleError{Rule: "rule set", Field: field, Reason: reason} }
	fields, repeated, err := readObject(data)
	if err != nil {
		return fail("JSON", "must be an object")
	}
	if repeated != "" {
		return fail(repeated, "appears more than once")
	}
	for k := range fields {
		if k != "default" && k != "on_move" && k != "plans" {
			return fail(k, "is not a rule-set field (default, on_move, plans)")
		}
	}
	var set PlanSet
	if err := readString(fields, "default", &set.Default); err != nil {
		return fail("default", err.Error())
	}
	if raw, ok := fields["on_move"]; ok {
		var name string
		if json.Unmarshal(raw, &name) != nil {
			return fail("on_move", "must be a JSON string")
		}
		m, ok := migrationNamed(name)
		if !ok {
			return fail("on_move", strconv.Quote(name)+` is not one of "proportional", "as_is", "additive", "reset"`)
		}
		set.OnMove = m
	}
	raw, ok := fields["plans"]
	if !ok {
		return fail("plans", "is missing")
	}
	plans, repeated, err := readObject(raw)
	if err != nil {
		return fail("plans", "must be an object of plans by name")
	}
	if repeated != "" {
		return fail("plans", fmt.Sprintf("names plan %q more than once", repeated))
	}
	set.Plans = make(map[string]Plan, len(plans))
	for name, raw := range plans {
		p, err := unmarshalPlan(raw)
		if err != nil {
			return planError(name, err)
		}
		set.Plans[name] = p
	}
	if len(set.Plans) == 0 {
		return fail("plans", "is empty")
	}
	if _, ok := set.Plans[set.Default]; !ok {
		return fail("default", strconv.Quote(set.Default)+" is not one of the plans")
	}
	*s = set
	return nil
}

// readString reads fields[k], which must be present, as a JSON string.
func readString(fields map[string]json.RawMessage, k string, out *string) error {
	raw, ok := fields[k]
	if !ok {
		return fmt.Errorf("is missing")
	}
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, out) != nil {
		return fmt.Errorf("must be a JSON string")
	}
	return nil
}

// migrationNamed returns the policy whose String is name.
func migrationNamed(name string) (Migration, bool) {
	for m := MigrateProportional; m <= MigrateReset; m++ {
		if m.String() == name {
			return m, true
		}
	}
	return 0, false
}

// unmarshalPlan reads one plan.
func unmarshalPlan(data []byte) (Plan, error) {
	fields, repeated, err := readObject(data)
	if err != nil {
		return Plan{}, err
	}
	if repeated != "" {
		return Plan{}, &RuleError{Rule: "plan", Field: repeated, Reason: "appears more than once"}
	}
	raw, layered := fields["layers"]
	if !layered {
		var spec RuleSpec
		if err := spec.UnmarshalJSON(data); err != nil {
			return Plan{}, err
		}
		if spec.Shadow {
			return Plan{Layers: []Layer{{Rule: spec.Rule, Shadow: true}}}, nil
		}
		return Plan{Rule: spec.Rule}, nil
	}
	if len(fields) > 1 {
		for k := range fields {
			if k != "layers" {
				return Plan{}, &RuleError{Rule: "plan", Field: k, Reason: "is not a field of a plan of layers"}
			}
		}
	}
	var raws []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &raws) != nil || len(raws) == 0 {
		return Plan{}, &RuleError{Rule: "plan", Field: "layers", Reason: "must be a non-empty list of rule objects"}
	}
	var p Plan
	for i, raw := range raws {
		l, err := unmarshalLayer(raw)
		if err != nil {
			if re, ok := err.(*RuleError); ok {
				return Plan{}, &RuleError{Rule: fmt.Sprintf("layer %d, %s", i, re.Rule), Field: re.Field, Reason: re.Reason}
			}
			return Plan{}, err
		}
		p.Layers = append(p.Layers, l)
	}
	return p, nil
}

// unmarshalLayer reads a rule object with an optional "key".
func unmarshalLayer(data []byte) (Layer, error) {
	fields, repeated, err := readObject(data)
	if err != nil {
		return Layer{}, err
	}
	if repeated != "" {
		return Layer{}, &RuleError{Rule: "layer", Field: repeated, Reason: "appears more than once"}
	}
	var l Layer
	if raw, ok := fields["key"]; ok {
		var key string
		if json.Unmarshal(raw, &key) != nil || (key != "request" && key != "global") {
			return Layer{}, &RuleError{Rule: "layer", Field: "key", Reason: `must be "request" or "global"`}
		}
		if key == "global" {
			l.Key = GlobalKey
		}
		delete(fields, "key")
		if data, err = json.Marshal(fields); err != nil {
			return Layer{}, err
		}
	}
	var spec RuleSpec
	if err := spec.UnmarshalJSON(data); err != nil {
		return Layer{}, err
	}
	l.Rule, l.Shadow = spec.Rule, spec.Shadow
	return l, nil
}

// planError names the plan in a rule error.
func planError(name string, err error) error {
	if re, ok := err.(*RuleError); ok {
		return &RuleError{Rule: fmt.Sprintf("plan %q, %s", name, re.Rule), Field: re.Field, Reason: re.Reason}
	}
	return fmt.Errorf("ratelimit: plan %q: %w", name, err)
}
