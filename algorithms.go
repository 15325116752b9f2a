package ratelimit

import (
	"strings"
	"time"
)

// The algorithms, each described once: how its rule is named and laid out
// in JSON, how it is built from the fields read, and how it is written back.
// Everything that handles rules as data ([RuleSpec]) reads this table rather
// than switching on the rule's type. Each rule's bind method, beside its
// algorithm, compiles it and binds its state type (see bindRule).
var algorithms = [...]algorithmRow{
	newRow("token_bucket", rateFields("burst"),
		func(v ruleValues) TokenBucket { return TokenBucket{Rate: v.rate, Burst: v.count, Name: v.name} },
		func(r TokenBucket) ruleValues { return ruleValues{name: r.Name, rate: r.Rate, count: r.Burst} }),
	newRow("gcra", rateFields("burst"),
		func(v ruleValues) GCRA { return GCRA{Rate: v.rate, Burst: v.count, Name: v.name} },
		func(r GCRA) ruleValues { return ruleValues{name: r.Name, rate: r.Rate, count: r.Burst} }),
	newRow("leaky_bucket", append(rateFields("capacity"), ruleField{"delay", delayField, true}),
		func(v ruleValues) LeakyBucket {
			return LeakyBucket{Rate: v.rate, Capacity: v.count, Delay: v.delay, Name: v.name}
		},
		func(r LeakyBucket) ruleValues {
			return ruleValues{name: r.Name, rate: r.Rate, count: r.Capacity, delay: r.Delay}
		}),
	newRow("fixed_window", windowFields,
		func(v ruleValues) FixedWindow { return FixedWindow{Limit: v.count, Window: v.window, Name: v.name} },
		func(r FixedWindow) ruleValues { return ruleValues{name: r.Name, count: r.Limit, window: r.Window} }),
	newRow("sliding_log", windowFields,
		func(v ruleValues) SlidingLog { return SlidingLog{Limit: v.count, Window: v.window, Name: v.name} },
		func(r SlidingLog) ruleValues { return ruleValues{name: r.Name, count: r.Limit, window: r.Window} }),
	newRow("sliding_counter", append(windowFields[:2:2], ruleField{"count_refused", refusedField, true}),
		func(v ruleValues) SlidingCounter {
			return SlidingCounter{Limit: v.count, Window: v.window, CountRefused: v.refused, Name: v.name}
		},
		func(r SlidingCounter) ruleValues {
			return ruleValues{name: r.Name, count: r.Limit, window: r.Window, refused: r.CountRefused}
		}),
	newRow("sub_window", append(windowFields[:2:2], ruleField{"buckets", bucketsField, false}, ruleField{"count_refused", refusedField, true}),
		func(v ruleValues) SubWindow {
			return SubWindow{Limit: v.count, Window: v.window, Buckets: v.buckets, CountRefused: v.refused, Name: v.name}
		},
		func(r SubWindow) ruleValues {
			return ruleValues{name: r.Name, count: r.Limit, window: r.Window, buckets: r.Buckets, refused: r.CountRefused}
		}),
}

// fieldKind is how a rule field is written in JSON and which of a rule's
// values it carries.
type fieldKind int

const (
	rateField    fieldKind = iota // a rate string read by ParseRate: ruleValues.rate
	countField                    // a whole number of units, a JSON integer: ruleValues.count
	windowField                   // a duration string: ruleValues.window
	bucketsField                  // a JSON integer: ruleValues.buckets
	refusedField                  // a JSON boolean: ruleValues.refused
	delayField                    // a whole number of units, a JSON integer: ruleValues.delay
)

// ruleField is one JSON field of a rule, besides name, algorithm and mode.
type ruleField struct {
	name string
	kind fieldKind
	// optional fields may be left out, meaning their zero value, and are
	// written only when not zero.
	optional bool
}

// rateFields are the fields of a bucket: its rate, then its capacity under
// the given name.
func rateFields(capacity string) []ruleField {
	return []ruleField{{"rate", rateField, false}, {capacity, countField, false}}
}

// windowFields are the fields of a window rule.
var windowFields = []ruleField{{"limit", countField, false}, {"window", windowField, false}}

// ruleValues are a rule's settings as its JSON fields carry them.
type ruleValues struct {
	name    string
	rate    Rate
	count   int64 // Burst, Capacity or Limit
	window  time.Duration
	buckets int   // SubWindow's Buckets
	refused bool  // CountRefused
	delay   int64 // LeakyBucket's Delay
}

// algorithmRow describes one algorithm as data.
type algorithmRow struct {
	name   string      // as JSON's "algorithm" names it
	fields []ruleField // in the order they are written
	// build makes the rule from the values read.
	build func(ruleValues) Rule
	// values reports the settings of a rule of this algorithm, or false for
	// a rule of another one. Pointers are deref's business.
	values func(Rule) (ruleValues, bool)
	// deref returns the rule a pointer to this algorithm's rule points to
	// (nil for a nil pointer), the rule itself if it is this algorithm's, and
	// false for any other rule.
	deref func(Rule) (Rule, bool)
}

// newRow builds the row of the algorithm whose rule type is R.
func newRow[R Rule](name string, fields []ruleField, build func(ruleValues) R, values func(R) ruleValues) algorithmRow {
	return algorithmRow{
		name:   name,
		fields: fields,
		build:  func(v ruleValues) Rule { return build(v) },
		values: func(r Rule) (ruleValues, bool) {
			if v, ok := r.(R); ok {
				return values(v), true
			}
			return ruleValues{}, false
		},
		deref: func(r Rule) (Rule, bool) {
			switch p := any(r).(type) {
			case R:
				return p, true
			case *R:
				if p == nil {
					return nil, true
				}
				return *p, true
			}
			return nil, false
		},
	}
}

// algorithmNamed returns the row of the algorithm JSON names name.
func algorithmNamed(name string) *algorithmRow {
	for i := range algorithms {
		if algorithms[i].name == name {
			return &algorithms[i]
		}
	}
	return nil
}

// algorithmOf returns the row of rule's algorithm (rule a value, not a
// pointer) and its settings.
func algorithmOf(rule Rule) (*algorithmRow, ruleValues) {
	for i := range algorithms {
		if v, ok := algorithms[i].values(rule); ok {
			return &algorithms[i], v
		}
	}
	return nil, ruleValues{}
}

// deref returns the rule a pointer rule points to (nil for a nil pointer),
// and any other rule as it is.
func deref(r Rule) Rule {
	for i := range algorithms {
		if v, ok := algorithms[i].deref(r); ok {
			return v
		}
	}
	return r
}

// takes reports whether the algorithm has a field named k.
func (a *algorithmRow) takes(k string) bool {
	for _, f := range a.fields {
		if f.name == k {
			return true
		}
	}
	return false
}

// isRuleField reports whether k is a field of some algorithm.
func isRuleField(k string) bool {
	for i := range algorithms {
		if algorithms[i].takes(k) {
			return true
		}
	}
	return false
}

// algorithmNames lists the algorithms' JSON names, for error messages.
func algorithmNames() string {
	names := make([]string, len(algorithms))
	for i := range algorithms {
		names[i] = algorithms[i].name
	}
	return strings.Join(names, ", ")
}

// ruleBase is what every compiled rule keeps for the containers built
// around it: its capacity and its policy.
type ruleBase struct {
	capMilli int64 // the largest cost, in milli-units
	pol      policy
}

func (b *ruleBase) capacity() int64 { return b.capMilli }
func (b *ruleBase) policy() *policy { return &b.pol }

// bindRule binds a compiled algorithm A to its state type S, passing on a
// compile error. Each rule's bind method is one call to it:
//
//	func (r FixedWindow) bind() (binding, error) { return bindRule[fwState](r.compile()) }
func bindRule[S any, A algorithm[S]](a A, err error) (binding, error) {
	if err != nil {
		return nil, err
	}
	return bound[S, A]{a}, nil
}
