// Package results reads the output of the peer benchmarks (the Go benchmark
// format, one pass after another, each pass headed by a "pass: N"
// configuration line) and summarises it: medians with benchstat's
// confidence intervals, and ratios taken within each pass.
package results

import (
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// Key names one benchmark: its group (Single or Keyed), its scenario
// (allowed, denied, parallel, insert, serial) and its subject.
type Key struct {
	Group, Scenario, Subject string
}

func (k Key) String() string { return k.Group + "/" + k.Scenario + "/" + k.Subject }

// Ours reports whether the subject is one of this library's rules.
func (k Key) Ours() bool { return strings.HasPrefix(k.Subject, "ratelimit.") }

// Floor reports whether the subject is a reference point, not a limiter.
func (k Key) Floor() bool { return strings.HasPrefix(k.Subject, "floor-") }

// Peer reports whether the subject is another library.
func (k Key) Peer() bool { return !k.Ours() && !k.Floor() }

// Set is every measurement of a run.
type Set struct {
	// Passes lists the passes in the order they were read.
	Passes []string
	// Keys lists the benchmarks: floors, then this library's, then the
	// others, each group by subject name.
	Keys []Key
	// Config holds the values each configuration key took, in order,
	// without repeats (goos, cpu, load, ...).
	Config map[string][]string

	vals map[Key]map[string]map[string]float64 // key, unit, pass
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// ReadFile parses the benchmark output in the file at path, as Read does.
func ReadFile(path string) (*Set, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, path)
}

// Read parses benchmark output. Results outside any "pass:" line count as
// pass "1".
func Read(r io.Reader, name string) (*Set, error) {
	s := &Set{Config: map[string][]string{}, vals: map[Key]map[string]map[string]float64{}}
	rd := benchfmt.NewReader(r, name)
	for rd.Scan() {
		res, ok := rd.Result().(*benchfmt.Result)
		if !ok {
			if e, isErr := rd.Result().(*benchfmt.SyntaxError); isErr {
				return nil, e
			}
			continue
		}
		for _, c := range res.Config {
			v := string(c.Value)
			if !slices.Contains(s.Config[c.Key], v) {
				s.Config[c.Key] = append(s.Config[c.Key], v)
			}
		}
		pass := res.GetConfig("pass")
		if pass == "" {
			pass = "1"
		}
		if !slices.Contains(s.Passes, pass) {
			s.Passes = append(s.Passes, pass)
		}
		full := procsSuffix.ReplaceAllString(string(res.Name.Full()), "")
		parts := strings.SplitN(full, "/", 3)
		if len(parts) != 3 {
			continue // not one of ours
		}
		k := Key{Group: parts[0], Scenario: parts[1], Subject: parts[2]}
		units, seen := s.vals[k]
		if !seen {
			units = map[string]map[string]float64{}
			s.vals[k] = units
			s.Keys = append(s.Keys, k)
		}
		for _, v := range res.Values {
			unit, val := v.Unit, v.Value
			if v.OrigUnit != "" {
				unit, val = v.OrigUnit, v.OrigValue
			}
			if units[unit] == nil {
				units[unit] = map[string]float64{}
			}
			units[unit][pass] = val
		}
	}
	if err := rd.Err(); err != nil {
		return nil, err
	}
	if len(s.Keys) == 0 {
		return nil, fmt.Errorf("%s: no benchmark results", name)
	}
	// Passes may run the subjects in different orders: list them in one
	// that does not depend on it, floors first, then this library's rules,
	// then the other libraries, each by name.
	rank := func(k Key) int {
		switch {
		case k.Floor():
			return 0
		case k.Ours():
			return 1
		}
		return 2
	}
	slices.SortStableFunc(s.Keys, func(a, b Key) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a.Subject, b.Subject)
	})
	return s, nil
}

// Values returns k's values in unit, one per pass that has one.
func (s *Set) Values(k Key, unit string) []float64 {
	var out []float64
	for _, p := range s.Passes {
		if v, ok := s.vals[k][unit][p]; ok {
			out = append(out, v)
		}
	}
	return out
}

// Value returns k's value in unit in pass p, or NaN.
func (s *Set) Value(k Key, unit, p string) float64 {
	if v, ok := s.vals[k][unit][p]; ok {
		return v
	}
	return math.NaN()
}

// Has reports whether k was measured.
func (s *Set) Has(k Key) bool { return s.vals[k] != nil }

// Summary returns the median of k's values in unit with benchstat's 95%
// confidence interval; ok is false when there are none.
func (s *Set) Summary(k Key, unit string) (sum benchmath.Summary, ok bool) {
	vs := s.Values(k, unit)
	if len(vs) == 0 {
		return sum, false
	}
	return benchmath.AssumeNothing.Summary(benchmath.NewSample(vs, &benchmath.DefaultThresholds), 0.95), true
}

// Median returns the median of k's values in unit, or NaN.
func (s *Set) Median(k Key, unit string) float64 {
	sum, ok := s.Summary(k, unit)
	if !ok {
		return math.NaN()
	}
	return sum.Center
}

// Max returns the largest of k's values in unit, or NaN.
func (s *Set) Max(k Key, unit string) float64 {
	vs := s.Values(k, unit)
	if len(vs) == 0 {
		return math.NaN()
	}
	return slices.Max(vs)
}

// Min returns the smallest of k's values in unit, or NaN.
func (s *Set) Min(k Key, unit string) float64 {
	vs := s.Values(k, unit)
	if len(vs) == 0 {
		return math.NaN()
	}
	return slices.Min(vs)
}

// Stat summarises a ratio taken in each pass.
type Stat struct {
	Median, Min, Max float64
	N                int // passes with both sides measured
}

// Valid reports whether any pass measured the ratio.
func (r Stat) Valid() bool { return r.N > 0 }

func statOf(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	sort.Float64s(xs)
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return Stat{Median: m, Min: xs[0], Max: xs[len(xs)-1], N: len(xs)}
}

// Ratio returns a/b in unit, taken in each pass, summarised over passes.
func (s *Set) Ratio(a, b Key, unit string) Stat {
	var xs []float64
	for _, p := range s.Passes {
		va, okA := s.vals[a][unit][p]
		vb, okB := s.vals[b][unit][p]
		if okA && okB && vb > 0 {
			xs = append(xs, va/vb)
		}
	}
	return statOf(xs)
}

// RatioToBest returns a divided by the smallest of others in unit, taken
// in each pass, and the key that was smallest in most passes.
func (s *Set) RatioToBest(a Key, others []Key, unit string) (Stat, Key) {
	var xs []float64
	wins := map[Key]int{}
	for _, p := range s.Passes {
		va, ok := s.vals[a][unit][p]
		if !ok {
			continue
		}
		best, bestKey, found := math.Inf(1), Key{}, false
		for _, o := range others {
			if v, ok := s.vals[o][unit][p]; ok && v < best {
				best, bestKey, found = v, o, true
			}
		}
		if found && best > 0 {
			xs = append(xs, va/best)
			wins[bestKey]++
		}
	}
	var top Key
	for _, o := range others {
		if wins[o] > wins[top] {
			top = o
		}
	}
	return statOf(xs), top
}

// Select returns the keys of group and scenario, in order, that pass keep.
func (s *Set) Select(group, scenario string, keep func(Key) bool) []Key {
	var out []Key
	for _, k := range s.Keys {
		if k.Group == group && k.Scenario == scenario && (keep == nil || keep(k)) {
			out = append(out, k)
		}
	}
	return out
}

// Subjects returns the subjects of group in the order of Keys.
func (s *Set) Subjects(group string) []string {
	var out []string
	for _, k := range s.Keys {
		if k.Group == group && !slices.Contains(out, k.Subject) {
			out = append(out, k.Subject)
		}
	}
	return out
}
