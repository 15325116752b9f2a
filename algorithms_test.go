package ratelimit_test

import (
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// testedAlgorithms lists every algorithm once for the suites that run over
// all of them: the model, property, fuzz, concurrency, store, wait, shadow,
// composition and benchmark suites range over this table. A new algorithm
// is one more row. The order is the fuzz targets' kind index.
var testedAlgorithms = []testedAlgorithm{
	{
		name: "TokenBucket", bucket: true,
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.TokenBucket{Rate: s.rate, Burst: s.capacity, Name: s.name}
		},
		model: func(s settings) refmodel.Model { return refmodel.NewBucket(s.rate, s.capacity) },
	},
	{
		name: "GCRA", bucket: true,
		rule:  func(s settings) ratelimit.Rule { return ratelimit.GCRA{Rate: s.rate, Burst: s.capacity, Name: s.name} },
		model: func(s settings) refmodel.Model { return refmodel.NewBucket(s.rate, s.capacity) },
	},
	{
		name: "LeakyBucket", bucket: true,
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.LeakyBucket{Rate: s.rate, Capacity: s.capacity, Name: s.name}
		},
		model: func(s settings) refmodel.Model { return refmodel.NewQueue(s.rate, s.capacity) },
	},
	{
		name: "SlidingLog", logState: true,
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.SlidingLog{Limit: s.capacity, Window: s.window, Name: s.name}
		},
		model: func(s settings) refmodel.Model { return refmodel.NewLog(s.capacity, s.window) },
	},
	{
		name: "FixedWindow",
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.FixedWindow{Limit: s.capacity, Window: s.window, Name: s.name}
		},
		model: func(s settings) refmodel.Model { return refmodel.NewFixedWindow(s.capacity, s.window) },
	},
	{
		name: "SlidingCounter",
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.SlidingCounter{Limit: s.capacity, Window: s.window, Name: s.name}
		},
		model: func(s settings) refmodel.Model { return refmodel.NewSlidingCounter(s.capacity, s.window) },
	},
	{
		// Buckets is one of the window's divisors up to 60, picked by the
		// window itself, so that the suites see many bucket counts.
		name: "SubWindow",
		rule: func(s settings) ratelimit.Rule {
			return ratelimit.SubWindow{Limit: s.capacity, Window: s.window, Buckets: subBuckets(s.window), Name: s.name}
		},
		model: func(s settings) refmodel.Model {
			return refmodel.NewSubWindow(s.capacity, s.window, subBuckets(s.window), false)
		},
	},
}

// subBuckets picks a SubWindow's Buckets for a window: a divisor of it from
// 1 to 60 (1 for a window that is not positive).
func subBuckets(w time.Duration) int {
	var ds []int
	for k := 1; k <= ratelimit.MaxSubWindowBuckets && w > 0; k++ {
		if w%time.Duration(k) == 0 {
			ds = append(ds, k)
		}
	}
	if len(ds) == 0 {
		return 1
	}
	return ds[int(w/7%time.Duration(len(ds)))]
}

// testedAlgorithm is one algorithm as the test suites see it.
type testedAlgorithm struct {
	name string // the rule type's name, and the subtests'
	// bucket is true for a rule of a Rate and a capacity (Burst or
	// Capacity), false for one of a Limit and a Window.
	bucket bool
	// logState is true when the per-key state grows with the admissions in
	// a window: benchmarks keep its window short.
	logState bool
	// rule builds the rule from its settings; model builds the reference
	// model of a valid rule.
	rule  func(settings) ratelimit.Rule
	model func(settings) refmodel.Model
}

// settings are a rule's numbers: a bucket uses rate and capacity, a window
// rule capacity (its Limit) and window.
type settings struct {
	rate     ratelimit.Rate
	capacity int64
	window   time.Duration
	name     string
}

// testedAlgorithmNamed returns the row of the named algorithm.
func testedAlgorithmNamed(name string) testedAlgorithm {
	for _, a := range testedAlgorithms {
		if a.name == name {
			return a
		}
	}
	panic("no tested algorithm " + name)
}

// scale is the time scale of a rule's traces: its period or its window.
func (a testedAlgorithm) scale(s settings) time.Duration {
	if a.bucket {
		return s.rate.Per
	}
	return s.window
}

// decisionWindow is the Window every Decision of a valid rule reports.
func (a testedAlgorithm) decisionWindow(s settings) time.Duration {
	if a.bucket {
		return bucketWindow(s.rate, s.capacity)
	}
	return s.window
}

// valid reports whether the constructors must accept the settings,
// computed independently of the library.
func (a testedAlgorithm) valid(s settings) bool {
	if s.capacity <= 0 || s.capacity > 1e15 {
		return false
	}
	if !a.bucket {
		return s.window > 0 && s.window < ratelimit.MaxTime
	}
	r := s.rate
	return r.Count > 0 && r.Count <= 1e15 && r.Per > 0 && r.Per < ratelimit.MaxTime && spanFits(r, s.capacity)
}

// draw is the algorithm's rule generator: the settings of a random valid
// rule, without a name.
func (a testedAlgorithm) draw(t *rapid.T) settings {
	if a.bucket {
		r, c := drawValidBucket(t)
		return settings{rate: r, capacity: c}
	}
	return settings{capacity: drawCapacity(t), window: drawWindow(t)}
}

// drawModelCase draws a rule for the model harness, now and then one the
// constructors must reject, with a name.
func (a testedAlgorithm) drawModelCase(t *rapid.T) modelCase {
	var s settings
	if a.bucket {
		s = settings{rate: drawRate(t), capacity: drawCapacity(t)}
	} else {
		s.capacity, s.window, _ = drawWindowRule(t)
	}
	s.name = drawName(t)
	mc := modelCase{rule: a.rule(s), scale: a.scale(s), valid: a.valid(s), name: s.name}
	if mc.valid {
		mc.model, mc.window = a.model(s), a.decisionWindow(s)
	}
	return mc
}

// TestModel checks every algorithm field by field against its reference
// model over random rules and random traces.
func TestModel(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { runModel(t, a.drawModelCase(t)) })
		})
	}
}

// spanFits reports whether capacity units at rate take at most MaxTime-1 ns,
// computed independently of the library with big rationals.
func spanFits(r ratelimit.Rate, capacity int64) bool {
	span := new(big.Rat).SetFrac(
		new(big.Int).Mul(big.NewInt(capacity), big.NewInt(int64(r.Per))),
		big.NewInt(r.Count))
	span.Sub(span, new(big.Rat).SetInt64(int64(ratelimit.MaxTime)-1))
	// The library keeps whole nanoseconds <= MaxTime-1 plus a fraction.
	return span.Cmp(new(big.Rat).SetInt64(1)) < 0
}

// bucketWindow is the Window a bucket rule reports: the time to earn the
// whole capacity, rounded up to the nanosecond.
func bucketWindow(r ratelimit.Rate, capacity int64) time.Duration {
	num := new(big.Int).Mul(big.NewInt(capacity), big.NewInt(int64(r.Per)))
	q, m := new(big.Int).DivMod(num, big.NewInt(r.Count), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return time.Duration(q.Int64())
}
