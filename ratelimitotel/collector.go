package ratelimitotel

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratekit/ratelimit"
)

// Collector reads the stores of limiters when the SDK collects: keys held
// and their bound, evictions (lossy ones apart), and each store's rule,
// its limit and window, so that utilisation can be alerted on. It starts no
// goroutine: one callback reads [ratelimit.StoreStats] anew at each
// collection, taking each shard's lock in turn for a moment. Its
// observable instruments, each with the attributes store, plan, layer and
// policy:
//
//	ratelimit.store.keys              gauge {key}: keys held now
//	ratelimit.store.max_keys          gauge {key}: the bound on keys held
//	ratelimit.store.evictions         counter {key}: keys dropped to make room
//	ratelimit.store.lossy_evictions   counter {key}: of those, keys partly spent, which start again fresh
//	ratelimit.policy.limit            gauge {unit}: the rule's capacity (Decision.Limit)
//	ratelimit.policy.window           gauge, s: the span the limit is a quota for (Decision.Window)
//
// A limiter whose keys live outside the process (redisstore's Store,
// Lockout, InFlight, Leased, Composite and Plans) is added with
// [Collector.AddBackend]: its keys are
// the backend's, so it reports its rule (ratelimit.policy.limit and
// ratelimit.policy.window) and the calls its backend did not decide (each
// call counted on one entry of the limiter: see [ratelimit.BackendStats]):
//
//	ratelimit.backend.degraded           counter {call}: calls the backend did not decide, answered by the failure policy
//	ratelimit.backend.circuit_refusals   counter {call}: of those, calls the open circuit kept from the backend
//	ratelimit.backend.invalid_states     counter {call}: calls refused on a corrupted stored state
//	ratelimit.backend.mismatches         counter {call}: replies that disagreed with the rule's Machine (should stay 0)
//	ratelimit.backend.local_denials      counter {call}: refusals answered without a round trip (deny cache)
//
// store is the name given to Add; plan is a [ratelimit.Plans]' plan name,
// or a backend entry's Plan ("" otherwise); layer is the index of a
// [ratelimit.Composite]'s or a plan's layer, or a backend entry's Layer (0
// for a [ratelimit.Store]); policy is the rule's Name (a plan's name for
// an unnamed rule of a Plans, in process or in Redis).
//
// A Collector is safe for concurrent use; limiters may be added at any
// time. The zero Collector is not usable; build one with [NewCollector].
type Collector struct {
	mu      sync.Mutex
	sources []source
	reg     metric.Registration
}

// source is a limiter added, with its name: stats for an in-process one,
// backend for one whose keys live elsewhere.
type source struct {
	name    string
	stats   func() []layerStats
	backend Backend
}

// Backend is a limiter whose keys live outside the process, such as
// redisstore's Store, Lockout, InFlight, Leased, Composite and Plans:
// BackendStats returns its rules and counters, one entry per layer (a
// Plans': per plan and layer of the rule set in force), read at each
// collection.
type Backend interface {
	BackendStats() []ratelimit.BackendStats
}

// layerStats is one store's stats, with its plan and layer.
type layerStats struct {
	plan  string
	layer int
	st    ratelimit.StoreStats
}

// NewCollector makes the Collector's instruments with mp's meter named
// [ScopeName], and registers its callback.
func NewCollector(mp metric.MeterProvider) (*Collector, error) {
	m := mp.Meter(ScopeName)
	var err, e error
	keys, e := m.Int64ObservableGauge("ratelimit.store.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys a rate limiter's store holds now."))
	err = first(err, e)
	maxKeys, e := m.Int64ObservableGauge("ratelimit.store.max_keys", metric.WithUnit("{key}"),
		metric.WithDescription("The bound on the keys a rate limiter's store holds."))
	err = first(err, e)
	evictions, e := m.Int64ObservableCounter("ratelimit.store.evictions", metric.WithUnit("{key}"),
		metric.WithDescription("Keys a rate limiter's store dropped to make room."))
	err = first(err, e)
	lossy, e := m.Int64ObservableCounter("ratelimit.store.lossy_evictions", metric.WithUnit("{key}"),
		metric.WithDescription("Keys a rate limiter's store dropped while partly spent: they start again with a fresh allowance."))
	err = first(err, e)
	limit, e := m.Int64ObservableGauge("ratelimit.policy.limit", metric.WithUnit("{unit}"),
		metric.WithDescription("A rate limiter's rule's capacity in units: burst, capacity or limit per window."))
	err = first(err, e)
	window, e := m.Float64ObservableGauge("ratelimit.policy.window", metric.WithUnit("s"),
		metric.WithDescription("The time span a rate limiter's rule's limit is a quota for."))
	err = first(err, e)
	counter := func(name, desc string) metric.Int64ObservableCounter {
		ctr, e := m.Int64ObservableCounter(name, metric.WithUnit("{call}"), metric.WithDescription(desc))
		err = first(err, e)
		return ctr
	}
	degraded := counter("ratelimit.backend.degraded", "Calls a rate limiter's backend did not decide, answered by its failure policy.")
	circuit := counter("ratelimit.backend.circuit_refusals", "Calls a rate limiter's open circuit kept from its backend.")
	invalid := counter("ratelimit.backend.invalid_states", "Calls a rate limiter refused because a key's stored state was corrupted.")
	mismatches := counter("ratelimit.backend.mismatches", "Backend replies that disagreed with the rule's decision; should stay zero.")
	local := counter("ratelimit.backend.local_denials", "Refusals a rate limiter answered without a round trip to its backend.")
	if err != nil {
		return nil, err
	}
	c := &Collector{}
	c.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range c.snapshot() {
			if s.backend != nil {
				for _, st := range s.backend.BackendStats() {
					at := metric.WithAttributeSet(attribute.NewSet(
						attribute.String("store", s.name), attribute.String("plan", st.Plan),
						attribute.Int("layer", st.Layer), attribute.String("policy", st.Policy)))
					o.ObserveInt64(limit, st.Limit, at)
					o.ObserveFloat64(window, st.Window.Seconds(), at)
					o.ObserveInt64(degraded, int64(st.Failures), at)
					o.ObserveInt64(circuit, int64(st.CircuitRefusals), at)
					o.ObserveInt64(invalid, int64(st.InvalidStates), at)
					o.ObserveInt64(mismatches, int64(st.Mismatches), at)
					o.ObserveInt64(local, int64(st.LocalDenials), at)
				}
				continue
			}
			for _, l := range s.stats() {
				st := l.st
				at := metric.WithAttributeSet(attribute.NewSet(
					attribute.String("store", s.name), attribute.String("plan", l.plan),
					attribute.Int("layer", l.layer), attribute.String("policy", st.Policy)))
				o.ObserveInt64(keys, int64(st.Keys), at)
				o.ObserveInt64(maxKeys, int64(st.MaxKeys), at)
				o.ObserveInt64(evictions, int64(st.Evictions), at)
				o.ObserveInt64(lossy, int64(st.LossyEvictions), at)
				o.ObserveInt64(limit, st.Limit, at)
				o.ObserveFloat64(window, st.Window.Seconds(), at)
			}
		}
		return nil
	}, keys, maxKeys, evictions, lossy, limit, window, degraded, circuit, invalid, mismatches, local)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Unregister stops the Collector's callback: its instruments report
// nothing more.
func (c *Collector) Unregister() error { return c.reg.Unregister() }

// AddStore adds a store under name. Names must be unique within the
// Collector.
func (c *Collector) AddStore(name string, s *ratelimit.Store) error {
	return c.add(name, func() []layerStats {
		return []layerStats{{st: s.Stats()}}
	})
}

// AddComposite adds a composite's layer stores under name, one stream per
// layer.
func (c *Collector) AddComposite(name string, comp *ratelimit.Composite) error {
	return c.add(name, func() []layerStats {
		var out []layerStats
		for i, st := range comp.Stats() {
			out = append(out, layerStats{layer: i, st: st})
		}
		return out
	})
}

// AddPlans adds a rule set's stores under name, one stream per plan and
// layer, as the rule set stands at each collection.
func (c *Collector) AddPlans(name string, p *ratelimit.Plans) error {
	return c.add(name, func() []layerStats {
		stats := p.Stats()
		plans := make([]string, 0, len(stats))
		for plan := range stats {
			plans = append(plans, plan)
		}
		sort.Strings(plans)
		var out []layerStats
		for _, plan := range plans {
			for i, st := range stats[plan] {
				out = append(out, layerStats{plan: plan, layer: i, st: st})
			}
		}
		return out
	})
}

// AddBackend adds a limiter whose keys live outside the process under
// name, one stream per entry of its BackendStats, with the attributes plan
// and layer of the entry's Plan and Layer. Names must be unique within the
// Collector.
func (c *Collector) AddBackend(name string, b Backend) error {
	if b == nil {
		return fmt.Errorf("ratelimitotel: AddBackend(%q) given a nil limiter", name)
	}
	return c.addSource(source{name: name, backend: b})
}

func (c *Collector) add(name string, stats func() []layerStats) error {
	return c.addSource(source{name: name, stats: stats})
}

func (c *Collector) addSource(src source) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sources {
		if s.name == src.name {
			return fmt.Errorf("ratelimitotel: a store named %q was added already", src.name)
		}
	}
	c.sources = append(c.sources, src)
	return nil
}

func (c *Collector) snapshot() []source {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]source(nil), c.sources...)
}
