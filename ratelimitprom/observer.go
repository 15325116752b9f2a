// Package ratelimitprom exports what the limiters of package ratelimit do
// as Prometheus metrics: an [Observer] that counts decisions, waits,
// evictions and backend failures as they happen, and a [Collector] that
// reads the stores' sizes, evictions and rules when Prometheus scrapes.
//
//	obs := ratelimitprom.NewObserver()
//	store, _ := ratelimit.NewStore(rule, ratelimit.WithObserver(obs))
//	col := ratelimitprom.NewCollector()
//	col.AddStore("api", store)
//	prometheus.MustRegister(obs, col)
//
// Labels are the rules' policies (their Name, a plan's name for an unnamed
// rule of a Plans), outcomes, and the names given to the Collector: never
// keys, so the number of series is bounded by the configuration, not by
// the traffic. Nothing here starts a goroutine.
package ratelimitprom

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratekit/ratelimit"
)

// WaitBuckets are the upper bounds, in seconds, of the wait-time
// histogram: from 1 ms to about a minute, each four times the last.
var WaitBuckets = prometheus.ExponentialBuckets(0.001, 4, 9)

// Observer is a [ratelimit.Observer] that counts what limiters do. Give it
// to limiters with [ratelimit.WithObserver] and register it with a
// Prometheus registry (it is a [prometheus.Collector]). One Observer may
// serve any number of limiters, from any goroutines. Its metrics:
//
//	ratelimit_decisions_total{policy,outcome}      requests decided; outcome is allowed, refused or shadow_refused
//	ratelimit_cost_units_total{policy,outcome}     their cost, in units (a plain request costs 1)
//	ratelimit_wait_seconds{policy,result}          a histogram of the time each Wait waited; result is admitted or abandoned
//	ratelimit_waits_in_flight{policy}              Waits under way
//	ratelimit_evictions_total{policy,lossy}        keys dropped to make room; lossy="true" for partly spent ones
//	ratelimit_backend_failures_total{policy}       errors of a backend (a store outside the process)
//	ratelimit_shed_total{policy,class,outcome}     a load shedder's decisions by priority class; outcome is allowed or refused
//
// A load shedder ([ratelimit.WorkerShedder], [ratelimit.FleetShedder]) is
// counted in ratelimit_decisions_total under its Name, and by class in
// ratelimit_shed_total: the Observer is a [ratelimit.ShedObserver]. A
// shedder's classes are as few as its configuration names; past
// [MaxShedClasses] class names for one policy, the others are counted as
// class "other", so that the label stays bounded whoever calls Shed.
//
// The zero Observer is not usable; build one with [NewObserver].
type Observer struct {
	decisions *prometheus.CounterVec
	cost      *prometheus.CounterVec
	wait      *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
	evictions *prometheus.CounterVec
	failures  *prometheus.CounterVec
	shed      *prometheus.CounterVec

	// byPolicy caches each policy's decision counters, so that Decided,
	// called on every request, looks up a map instead of hashing label
	// values: a copy-on-write map, read without a lock.
	byPolicy atomic.Pointer[map[string]*policyCounters]
	// byClass holds the first MaxShedClasses class names of each policy,
	// in the same way; classes counts them. A series is made on its first
	// decision, as a CounterVec makes it.
	byClass atomic.Pointer[map[shedKey]string]
	classes map[string]int
	mu      sync.Mutex // serialises additions to byPolicy, byClass and classes
}

// MaxShedClasses is how many class names of one policy
// ratelimit_shed_total labels as they are: as many as a shedder may have
// classes.
const MaxShedClasses = 64

// shedKey is a policy and a class of ratelimit_shed_total.
type shedKey struct{ policy, class string }

// policyCounters are one policy's counters, by outcome.
type policyCounters struct {
	decisions [3]prometheus.Counter
	cost      [3]prometheus.Counter
}

// outcomes are the outcomes, indexed by their value.
var outcomes = [3]ratelimit.Outcome{ratelimit.OutcomeAllowed, ratelimit.OutcomeRefused, ratelimit.OutcomeShadowRefused}

// NewObserver returns an Observer with its metrics at zero.
func NewObserver() *Observer {
	o := &Observer{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Requests decided by a rate limiter, by policy and outcome (allowed, refused, shadow_refused).",
		}, []string{"policy", "outcome"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_cost_units_total",
			Help: "Cost of the requests decided, in units (a plain request costs 1), by policy and outcome.",
		}, []string{"policy", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_wait_seconds",
			Help:    "Time each Wait waited on its limiter's clock, by policy and result (admitted, abandoned).",
			Buckets: WaitBuckets,
		}, []string{"policy", "result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_waits_in_flight",
			Help: "Waits under way, by policy.",
		}, []string{"policy"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_evictions_total",
			Help: "Keys a store dropped to make room, by policy; lossy=\"true\" for keys partly spent, which start again fresh.",
		}, []string{"policy", "lossy"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_backend_failures_total",
			Help: "Errors of a rate limiter's backend, by policy.",
		}, []string{"policy"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_shed_total",
			Help: "Decisions of a load shedder, by policy, priority class and outcome (allowed, refused).",
		}, []string{"policy", "class", "outcome"}),
	}
	o.byPolicy.Store(&map[string]*policyCounters{})
	o.byClass.Store(&map[shedKey]string{})
	o.classes = map[string]int{}
	return o
}

// counters returns policy's counters, making them on its first decision.
func (o *Observer) counters(policy string) *policyCounters {
	if pc, ok := (*o.byPolicy.Load())[policy]; ok {
		return pc
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byPolicy.Load()
	if pc, ok := old[policy]; ok {
		return pc
	}
	pc := &policyCounters{}
	for i, oc := range outcomes {
		pc.decisions[i] = o.decisions.WithLabelValues(policy, oc.String())
		pc.cost[i] = o.cost.WithLabelValues(policy, oc.String())
	}
	m := make(map[string]*policyCounters, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[policy] = pc
	o.byPolicy.Store(&m)
	return pc
}

// Decided implements [ratelimit.Observer].
func (o *Observer) Decided(d ratelimit.Decision, cost ratelimit.Units, oc ratelimit.Outcome) {
	if int(oc) >= len(outcomes) {
		return
	}
	pc := o.counters(d.Policy)
	pc.decisions[oc].Inc()
	pc.cost[oc].Add(float64(cost) / float64(ratelimit.Unit))
}

// Waited implements [ratelimit.Observer].
func (o *Observer) Waited(policy string, e ratelimit.WaitEvent, waited time.Duration) {
	g := o.inFlight.WithLabelValues(policy)
	if e == ratelimit.WaitStarted {
		g.Inc()
		return
	}
	g.Dec()
	o.wait.WithLabelValues(policy, e.String()).Observe(waited.Seconds())
}

// Evicted implements [ratelimit.Observer].
func (o *Observer) Evicted(policy string, n uint64, lossy bool) {
	l := "false"
	if lossy {
		l = "true"
	}
	o.evictions.WithLabelValues(policy, l).Add(float64(n))
}

// Failed implements [ratelimit.Observer].
func (o *Observer) Failed(policy string, _ error) {
	o.failures.WithLabelValues(policy).Inc()
}

// Shed implements [ratelimit.ShedObserver].
func (o *Observer) Shed(policy, class string, oc ratelimit.Outcome) {
	o.shed.WithLabelValues(policy, o.classLabel(policy, class), oc.String()).Inc()
}

// classLabel returns the class label of policy and class: class for the
// first MaxShedClasses class names of policy, "other" past them.
func (o *Observer) classLabel(policy, class string) string {
	k := shedKey{policy, class}
	if l, ok := (*o.byClass.Load())[k]; ok {
		return l
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byClass.Load()
	if l, ok := old[k]; ok {
		return l
	}
	if o.classes[policy] >= MaxShedClasses {
		return "other" // not remembered, or the names past the cap would grow the map
	}
	o.classes[policy]++
	m := make(map[shedKey]string, len(old)+1)
	for kk, v := range old {
		m[kk] = v
	}
	m[k] = class
	o.byClass.Store(&m)
	return class
}

// Describe implements [prometheus.Collector].
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors() {
		c.Collect(ch)
	}
}

func (o *Observer) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.decisions, o.cost, o.wait, o.inFlight, o.evictions, o.failures, o.shed}
}

var _ ratelimit.ShedObserver = (*Observer)(nil)
