package ratelimitprom

import (
	"fmt"
	"sort"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratekit/ratelimit"
)

// Collector reads the stores of limiters when Prometheus scrapes it: keys
// held and their bound, evictions (lossy ones apart), and each store's
// rule, its limit and window, so that utilisation can be alerted on. It
// starts no goroutine: each scrape reads [ratelimit.StoreStats] anew,
// taking each shard's lock in turn for a moment. Its metrics, each with
// the labels store, plan, layer and policy:
//
//	ratelimit_store_keys                     keys held now
//	ratelimit_store_max_keys                 the bound on keys held
//	ratelimit_store_evictions_total          keys dropped to make room
//	ratelimit_store_lossy_evictions_total    of those, keys partly spent, which start again fresh
//	ratelimit_policy_limit                   the rule's capacity, in units (Decision.Limit)
//	ratelimit_policy_window_seconds          the span the limit is a quota for (Decision.Window)
//
// A limiter whose keys live outside the process (redisstore's Store,
// Lockout, InFlight, Leased, Composite and Plans) is added with
// [Collector.AddBackend]: its keys are
// the backend's, so it reports its rule (ratelimit_policy_limit and
// ratelimit_policy_window_seconds) and the calls its backend did not
// decide (each call counted on one entry of the limiter: see
// [ratelimit.BackendStats]):
//
//	ratelimit_backend_degraded_total           calls the backend did not decide, answered by the failure policy
//	ratelimit_backend_circuit_refusals_total   of those, calls the open circuit kept from the backend
//	ratelimit_backend_invalid_states_total     calls refused on a corrupted stored state
//	ratelimit_backend_mismatches_total         replies that disagreed with the rule's Machine (should stay 0)
//	ratelimit_backend_local_denials_total      refusals answered without a round trip (deny cache)
//
// store is the name given to Add; plan is a [ratelimit.Plans]' plan name,
// or a backend entry's Plan ("" otherwise); layer is the index of a
// [ratelimit.Composite]'s or a plan's layer, or a backend entry's Layer
// ("0" for a [ratelimit.Store]); policy is the rule's Name (a plan's name
// for an unnamed rule of a Plans, in process or in Redis).
//
// A Collector is safe for concurrent use; limiters may be added after it
// is registered. The zero Collector is ready to use.
type Collector struct {
	mu      sync.Mutex
	sources []source
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
// scrape.
type Backend interface {
	BackendStats() []ratelimit.BackendStats
}

// layerStats is one store's stats, with its plan and layer.
type layerStats struct {
	plan  string
	layer int
	st    ratelimit.StoreStats
}

// NewCollector returns a Collector with nothing added.
func NewCollector() *Collector { return &Collector{} }

var (
	labels   = []string{"store", "plan", "layer", "policy"}
	keysDesc = prometheus.NewDesc("ratelimit_store_keys",
		"Keys a rate limiter's store holds now.", labels, nil)
	maxKeysDesc = prometheus.NewDesc("ratelimit_store_max_keys",
		"The bound on the keys a rate limiter's store holds.", labels, nil)
	evictionsDesc = prometheus.NewDesc("ratelimit_store_evictions_total",
		"Keys a rate limiter's store dropped to make room.", labels, nil)
	lossyDesc = prometheus.NewDesc("ratelimit_store_lossy_evictions_total",
		"Keys a rate limiter's store dropped while partly spent: they start again with a fresh allowance.", labels, nil)
	limitDesc = prometheus.NewDesc("ratelimit_policy_limit",
		"A rate limiter's rule's capacity in units: burst, capacity or limit per window.", labels, nil)
	windowDesc = prometheus.NewDesc("ratelimit_policy_window_seconds",
		"The time span a rate limiter's rule's limit is a quota for.", labels, nil)
	failuresDesc = prometheus.NewDesc("ratelimit_backend_degraded_total",
		"Calls a rate limiter's backend did not decide, answered by its failure policy.", labels, nil)
	circuitDesc = prometheus.NewDesc("ratelimit_backend_circuit_refusals_total",
		"Calls a rate limiter's open circuit kept from its backend.", labels, nil)
	invalidDesc = prometheus.NewDesc("ratelimit_backend_invalid_states_total",
		"Calls a rate limiter refused because a key's stored state was corrupted.", labels, nil)
	mismatchDesc = prometheus.NewDesc("ratelimit_backend_mismatches_total",
		"Backend replies that disagreed with the rule's decision; should stay zero.", labels, nil)
	localDesc = prometheus.NewDesc("ratelimit_backend_local_denials_total",
		"Refusals a rate limiter answered without a round trip to its backend.", labels, nil)
)

// AddStore adds a store under name. Names must be unique within the
// Collector.
func (c *Collector) AddStore(name string, s *ratelimit.Store) error {
	return c.add(name, func() []layerStats {
		return []layerStats{{st: s.Stats()}}
	})
}

// AddComposite adds a composite's layer stores under name, one series per
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

// AddPlans adds a rule set's stores under name, one series per plan and
// layer, as the rule set stands at each scrape.
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
// name, one series per entry of its BackendStats, labelled plan and layer
// by the entry's Plan and Layer. Names must be unique within the
// Collector.
func (c *Collector) AddBackend(name string, b Backend) error {
	if b == nil {
		return fmt.Errorf("ratelimitprom: AddBackend(%q) given a nil limiter", name)
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
			return fmt.Errorf("ratelimitprom: a store named %q was added already", src.name)
		}
	}
	c.sources = append(c.sources, src)
	return nil
}

// Describe implements [prometheus.Collector].
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{keysDesc, maxKeysDesc, evictionsDesc, lossyDesc, limitDesc, windowDesc,
		failuresDesc, circuitDesc, invalidDesc, mismatchDesc, localDesc} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector].
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := append([]source(nil), c.sources...)
	c.mu.Unlock()
	for _, s := range sources {
		if s.backend != nil {
			collectBackend(ch, s.name, s.backend.BackendStats())
			continue
		}
		for _, l := range s.stats() {
			lv := []string{s.name, l.plan, strconv.Itoa(l.layer), l.st.Policy}
			st := l.st
			ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(st.Keys), lv...)
			ch <- prometheus.MustNewConstMetric(maxKeysDesc, prometheus.GaugeValue, float64(st.MaxKeys), lv...)
			ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(st.Evictions), lv...)
			ch <- prometheus.MustNewConstMetric(lossyDesc, prometheus.CounterValue, float64(st.LossyEvictions), lv...)
			ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(st.Limit), lv...)
			ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, st.Window.Seconds(), lv...)
		}
	}
}

// collectBackend sends a backend limiter's series.
func collectBackend(ch chan<- prometheus.Metric, name string, stats []ratelimit.BackendStats) {
	for _, st := range stats {
		lv := []string{name, st.Plan, strconv.Itoa(st.Layer), st.Policy}
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(st.Limit), lv...)
		ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, st.Window.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(st.Failures), lv...)
		ch <- prometheus.MustNewConstMetric(circuitDesc, prometheus.CounterValue, float64(st.CircuitRefusals), lv...)
		ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(st.InvalidStates), lv...)
		ch <- prometheus.MustNewConstMetric(mismatchDesc, prometheus.CounterValue, float64(st.Mismatches), lv...)
		ch <- prometheus.MustNewConstMetric(localDesc, prometheus.CounterValue, float64(st.LocalDenials), lv...)
	}
}

var _ prometheus.Collector = (*Collector)(nil)
