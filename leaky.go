package ratelimit

// LeakyBucket is the leaky bucket as a queue, the way NGINX's limit_req and
// traffic shapers use it: admitted requests leave at Rate, one after another,
// and at most Capacity units may be waiting or leaving at once. A request of
// cost c is admitted iff the queued work plus c fits in Capacity; it goes on
// when the work queued before it has drained, and [Decision].Delay says how
// long that is. An admitted request must wait out its Delay before it
// proceeds; that is what makes this a shaper rather than a meter.
//
// NGINX's "rate=r burst=b" is LeakyBucket{Rate: r, Capacity: b+1}.
// Capacity is in whole units, from 1 to 1e15; Capacity/Rate, the time to
// drain a full queue, must be less than [MaxTime].
type LeakyBucket struct {
	Rate     Rate
	Capacity int64
	Name     string // optional: reported as Decision.Policy
}

// leakyAlgo is a compiled LeakyBucket rule. Its state is the instant the
// queue's admitted work has all gone out.
type leakyAlgo struct{ meter }

func (r LeakyBucket) compile() (*leakyAlgo, error) {
	m, err := newMeter("LeakyBucket", r.Name, "Rate", "Capacity", r.Rate, r.Capacity)
	if err != nil {
		return nil, err
	}
	return &leakyAlgo{m}, nil
}

func (r LeakyBucket) bind() (binding, error) { return bindRule[vtime](r.compile()) }

func (a *leakyAlgo) step(s *vtime, now, cost int64, commit bool) Decision {
	var d Decision
	wn, wf := a.schedule(&d, s, now, cost, commit)
	if d.Allowed {
		d.Delay = ceilNs(wn, wf)
	}
	return d
}
