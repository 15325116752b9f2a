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
// unnamed rule of a Plans), outcomes, and the names given to the
// Collector: never keys. Nothing here starts a goroutine.
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
//
// The zero Observer is not usable; build one with [NewObserver].
type Observer struct {
	decisions metric.Int64Counter
	cost      metric.Float64Counter
	wait      metric.Float64Histogram
	inFlight  metric.Int64UpDownCounter
	evictions metric.Int64Counter
	failures  metric.Int64Counter

	// byPolicy caches each policy's attribute sets, so that Decided, called
	// on every request, builds none: a copy-on-write map, read without a
	// lock.
	byPolicy atomic.Pointer[map[string]*policyAttrs]
	mu       sync.Mutex // serialises additions to byPolicy
}

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
	if err != nil {
		return nil, err
	}
	o.byPolicy.Store(&map[string]*policyAttrs{})
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

var _ ratelimit.Observer = (*Observer)(nil)
