package ratelimit

// LeakyBucket is the leaky bucket as a queue, the way NGINX's limit_req and
// traffic shapers use it: admitted requests leave at Rate, one after another,
// and at most Capacity units may be waiting or leaving at once (a request
// settled at more than it was charged may push that to twice Capacity: see
// [Store.Settle]). A request of cost c is admitted iff the queued work plus
// c fits in Capacity; it goes on when the work queued before it has
// drained, and [Decision].Delay says how long that is. An admitted request must wait out its Delay before it
// proceeds; that is what makes this a shaper rather than a meter.
//
// Delay makes the limiting two-stage, as NGINX's delay= does: an admitted
// request goes on at once while the work queued ahead of it is at most
// Delay units, and otherwise waits only for the part beyond Delay to drain.
// Its Delay is max(0, free - now - Delay/Rate), where free is when the
// queued work would all have gone out; admission, Remaining, RetryAfter and
// ResetAfter are unchanged, since a request that goes on early still takes
// its place in the queue (it still moves free on by cost/Rate). So a burst
// on an empty queue has its first requests go on at once, the next ones
// paced at Rate, and the rest refused. Delay is in whole units, from 0 (every
// request waits its turn, the plain queue) to Capacity (none waits: a
// meter like [GCRA] with Burst Capacity, which also reports Delay 0).
//
// NGINX's "rate=r burst=b" is LeakyBucket{Rate: r, Capacity: b+1}; adding
// "delay=d" is Delay: d, and "nodelay" is Delay: b (Capacity-1), for
// requests of cost Unit. NGINX counts the excess ahead of a request, its
// own place not included, so "burst=12 delay=8" at 5r/s lets 9 requests
// of a burst on an empty queue go on at once (the one that finds it empty
// and 8 in excess), delays the next 4 by 200, 400, 600 and 800 ms, and
// refuses the rest.
//
// Capacity is in whole units, from 1 to 1e15; Capacity/Rate, the time to
// drain a full queue, must be less than [MaxTime].
//
// The instant the queue is empty moves as [GCRA]'s theoretical arrival
// time does, so the single-key limiter is lock-free wherever GCRA's is, and
// elsewhere holds its mutex as briefly as GCRA's does.
type LeakyBucket struct {
	Rate     Rate
	Capacity int64
	Delay    int64  // units queued ahead that a request need not wait for; 0 to Capacity
	Name     string // optional: reported as Decision.Policy
}

// leakyAlgo is a compiled LeakyBucket rule. Its state is the instant the
// queue's admitted work has all gone out.
type leakyAlgo struct {
	meter
	delayNs, delayFrac uint64 // Delay's span at the rule's rate
}

func (r LeakyBucket) compile() (*leakyAlgo, error) {
	m, err := newMeter("LeakyBucket", r.Name, "Rate", "Capacity", r.Rate, r.Capacity)
	if err != nil {
		return nil, err
	}
	if r.Delay < 0 || r.Delay > r.Capacity {
		return nil, &RuleError{Rule: "LeakyBucket", Field: "Delay", Reason: "must be from 0 to Capacity"}
	}
	dn, df, _ := m.span(uint64(r.Delay) * uint64(Unit)) // <= the capacity's span: fits
	return &leakyAlgo{meter: m, delayNs: dn, delayFrac: df}, nil
}

func (r LeakyBucket) bind() (binding, error) {
	a, err := r.compile()
	if err != nil {
		return nil, err
	}
	return leakyBinding{bound[vtime, *leakyAlgo]{a}}, nil
}

// leakyBinding builds GCRA's single-key limiter, lock-free where the pace
// fits its word: the queue's end is a schedule like GCRA's TAT (see
// atomicGCRA).
type leakyBinding struct{ bound[vtime, *leakyAlgo] }

func (b leakyBinding) newLimiter(o *options) Limiter {
	return newAtomicMeter(&gcraAlgo{b.alg.meter}, b.alg, o)
}

func (a *leakyAlgo) step(s *vtime, now, cost int64, m stepMode) Decision {
	var d Decision
	a.decide(&d, s, now, cost, m.commits())
	return d
}

// decide is step writing the Decision into *d, as meter.schedule does.
func (a *leakyAlgo) decide(d *Decision, s *vtime, now, cost int64, commit bool) {
	wn, wf := a.schedule(d, s, now, cost, commit)
	a.delay(d, wn, wf)
}

// delay sets the Delay of *d, an admitted request's Decision, for a queue
// of wn+wf/n ahead of it; it leaves a refusal's as it is.
func (a *leakyAlgo) delay(d *Decision, wn, wf uint64) {
	if d.Allowed && (wn > a.delayNs || (wn == a.delayNs && wf > a.delayFrac)) {
		// The queued work beyond Delay's span: wn+wf/n - (delayNs+delayFrac/n).
		if wf < a.delayFrac {
			wn, wf = wn-1, wf+a.n
		}
		d.Delay = ceilNs(wn-a.delayNs, wf-a.delayFrac)
	}
}

func (a *leakyAlgo) params() Params {
	p := a.meter.params()
	p.DelayNanos, p.DelayFrac = a.delayNs, a.delayFrac
	return p
}
