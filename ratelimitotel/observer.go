// Package ratelimitotel exports what the limiters of package ratelimit do
// as OpenTelemetry metrics: an [Observer] that records decisions, waits,
// evictions and backend failures as they happen, and a [Collector] whose
// observable instruments read the stores' sizes, evictions and rules when
// the SDK collects. They are the instruments of package ratelimitprom,
// named in OpenTelemetry's way.
//
//	obs, _ := ratelimitotel.NewObserver(provider)
//	store, _ := ratelimit.NewStore(rule, ratelimit.WithObserver(obs))
//	col, _ := ratelimitotel.NewCollector(provider)
//	col.AddStore("api", store)
//
// Attributes are the rules' policies (their Name, a plan's name for an
// unnamed rule of a Plans), outcomes, a load shedder's priority classes,
// and the names given to the Collector: never keys. Nothing here starts a
// goroutine.
package ratelimitotel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratekit/ratelimit"
)

// ScopeName is the instrumentation scope of the instruments: the name of
// the meter they are made with.
const ScopeName = "github.com/ratekit/ratelimit/ratelimitotel"

// WaitBuckets are the explicit bucket boundaries, in seconds, of the
// wait-time histogram: from 1 ms to about a minute, each four times the
// last.
var WaitBuckets = []float64{0.001, 0.004, 0.016, 0.064, 0.256, 1.024, 4.096, 16.384, 65.536}

// Observer is a [ratelimit.Observer] that records what limiters do. Give it
// to limiters with [ratelimit.WithObserver]. One Observer may serve any
// number of limiters, from any goroutines. Its instruments:
//
//	ratelimit.decisions          counter {request}: requests decided, by policy and outcome (allowed, refused, shadow_refused)
//	ratelimit.cost               counter {unit}: their cost in units (a plain request costs 1), by policy and outcome
//	ratelimit.wait.duration      histogram, s: the time each Wait waited, by policy and result (admitted, abandoned)
//	ratelimit.waits.in_flight    up-down counter {wait}: Waits under way, by policy
//	ratelimit.evictions          counter {key}: keys dropped to make room, by policy and lossy (a bool: partly spent)
//	ratelimit.backend.failures   counter {error}: errors of a backend (a store outside the process), by policy
//	ratelimit.shed               counter {request}: a load shedder's decisions by policy, priority class and outcome (allowed, refused)
//
// A load shedder ([ratelimit.WorkerShedder], [ratelimit.FleetShedder]) is
// counted in ratelimit.decisions under its Name, and by class in
// ratelimit.shed: the Observer is a [ratelimit.ShedObserver]. A shedder's
// classes are as few as its configuration names; past [MaxShedClasses]
// class names for one policy, the others are counted as class "other", so
// that the attribute stays bounded whoever calls Shed.
//
// The zero Observer is not usable; build one with [NewObserver].
type Observer struct {
	decisions metric.Int64Counter
	cost      metric.Float64Counter
	wait      metric.Float64Histogram
	inFlight  metric.Int64UpDownCounter
	evictions metric.Int64Counter
	failures  metric.Int64Counter
	shed      metric.Int64Counter

	// byPolicy caches each policy's attribute sets, so that Decided, called
	// on every request, builds none: a copy-on-write map, read without a
	// lock.
	byPolicy atomic.Pointer[map[string]*policyAttrs]
	// byClass caches the attribute sets of each policy and class, by
	// outcome, in the same way; classes counts each policy's class names.
	byClass atomic.Pointer[map[shedKey]*[3][]metric.AddOption]
	classes map[string]int
	mu      sync.Mutex // serialises additions to byPolicy, byClass and classes
}

// MaxShedClasses is how many class names of one policy ratelimit.shed
// records as they are: as many as a shedder may have classes.
const MaxShedClasses = 64

// shedKey is a policy and a class of ratelimit.shed.
type shedKey struct{ policy, class string }

// policyAttrs are one policy's measurement options, by outcome.
type policyAttrs struct {
	outcome [3][]metric.AddOption
	policy  metric.MeasurementOption
}

// outcomes are the outcomes, indexed by their value.
var outcomes = [3]ratelimit.Outcome{ratelimit.OutcomeAllowed, ratelimit.OutcomeRefused, ratelimit.OutcomeShadowRefused}

// NewObserver makes the Observer's instruments with mp's meter named
// [ScopeName].
func NewObserver(mp metric.MeterProvider) (*Observer, error) {
	m := mp.Meter(ScopeName)
	o := &Observer{}
	var err, e error
	o.decisions, e = m.Int64Counter("ratelimit.decisions", metric.WithUnit("{request}"),
		metric.WithDescription("Requests decided by a rate limiter, by policy and outcome (allowed, refused, shadow_refused)."))
	err = first(err, e)
	o.cost, e = m.Float64Counter("ratelimit.cost", metric.WithUnit("{unit}"),
		metric.WithDescription("Cost of the requests decided, in units (a plain request costs 1), by policy and outcome."))
	err = first(err, e)
	o.wait, e = m.Float64Histogram("ratelimit.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time each Wait waited on its limiter's clock, by policy and result (admitted, abandoned)."),
		metric.WithExplicitBucketBoundaries(WaitBuckets...))
	err = first(err, e)
	o.inFlight, e = m.Int64UpDownCounter("ratelimit.waits.in_flight", metric.WithUnit("{wait}"),
		metric.WithDescription("Waits under way, by policy."))
	err = first(err, e)
	o.evictions, e = m.Int64Counter("ratelimit.evictions", metric.WithUnit("{key}"),
		metric.WithDescription("Keys a store dropped to make room, by policy; lossy for keys partly spent, which start again fresh."))
	err = first(err, e)
	o.failures, e = m.Int64Counter("ratelimit.backend.failures", metric.WithUnit("{error}"),
		metric.WithDescription("Errors of a rate limiter's backend, by policy."))
	err = first(err, e)
	o.shed, e = m.Int64Counter("ratelimit.shed", metric.WithUnit("{request}"),
		metric.WithDescription("Decisions of a load shedder, by policy, priority class and outcome (allowed, refused)."))
	err = first(err, e)
	if err != nil {
		return nil, err
	}
	o.byPolicy.Store(&map[string]*policyAttrs{})
	o.byClass.Store(&map[shedKey]*[3][]metric.AddOption{})
	o.classes = map[string]int{}
	return o, nil
}

func first(err, e error) error {
	if err != nil {
		return err
	}
	return e
}

// attrs returns policy's measurement options, making them on its first
// decision.
func (o *Observer) attrs(policy string) *policyAttrs {
	if pa, ok := (*o.byPolicy.Load())[policy]; ok {
		return pa
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byPolicy.Load()
	if pa, ok := old[policy]; ok {
		return pa
	}
	pa := &policyAttrs{policy: metric.WithAttributeSet(attribute.NewSet(attribute.String("policy", policy)))}
	for i, oc := range outcomes {
		pa.outcome[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("policy", policy), attribute.String("outcome", oc.String())))}
	}
	m := make(map[string]*policyAttrs, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[policy] = pa
	o.byPolicy.Store(&m)
	return pa
}

// Decided implements [ratelimit.Observer].
func (o *Observer) Decided(d ratelimit.Decision, cost ratelimit.Units, oc ratelimit.Outcome) {
	if int(oc) >= len(outcomes) {
		return
	}
	opts := o.attrs(d.Policy).outcome[oc]
	ctx := context.Background()
	o.decisions.Add(ctx, 1, opts...)
	o.cost.Add(ctx, float64(cost)/float64(ratelimit.Unit), opts...)
}

// Waited implements [ratelimit.Observer].
func (o *Observer) Waited(policy string, e ratelimit.WaitEvent, waited time.Duration) {
	ctx := context.Background()
	pa := o.attrs(policy)
	if e == ratelimit.WaitStarted {
		o.inFlight.Add(ctx, 1, pa.policy)
		return
	}
	o.inFlight.Add(ctx, -1, pa.policy)
	o.wait.Record(ctx, waited.Seconds(), metric.WithAttributes(
		attribute.String("policy", policy), attribute.String("result", e.String())))
}

// Evicted implements [ratelimit.Observer].
func (o *Observer) Evicted(policy string, n uint64, lossy bool) {
	o.evictions.Add(context.Background(), int64(n), metric.WithAttributes(
		attribute.String("policy", policy), attribute.Bool("lossy", lossy)))
}

// Failed implements [ratelimit.Observer].
func (o *Observer) Failed(policy string, _ error) {
	o.failures.Add(context.Background(), 1, o.attrs(policy).policy)
}

// Shed implements [ratelimit.ShedObserver].
func (o *Observer) Shed(policy, class string, oc ratelimit.Outcome) {
	if int(oc) >= len(outcomes) {
		return
	}
	o.shed.Add(context.Background(), 1, o.shedAttrs(policy, class)[oc]...)
}

// shedAttrs returns the measurement options of policy and class, making
// them on their first decision; past MaxShedClasses classes of policy,
// those of class "other".
func (o *Observer) shedAttrs(policy, class string) *[3][]metric.AddOption {
	k := shedKey{policy, class}
	if a, ok := (*o.byClass.Load())[k]; ok {
		return a
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byClass.Load()
	if a, ok := old[k]; ok {
		return a
	}
	if o.classes[policy] >= MaxShedClasses {
		k.class = "other"
		if a, ok := old[k]; ok {
			return a
		}
	} else {
		o.classes[policy]++
	}
	a := new([3][]metric.AddOption)
	for i, oc := range outcomes {
		a[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("policy", policy),
			attribute.String("class", k.class), attribute.String("outcome", oc.String())))}
	}
	m := make(map[shedKey]*[3][]metric.AddOption, len(old)+1)
	for kk, v := range old {
		m[kk] = v
	}
	m[k] = a
	o.byClass.Store(&m)
	return a
}

var _ ratelimit.ShedObserver = (*Observer)(nil)
