package ratelimit

import (
	"time"
)

// GCRA is the generic cell rate algorithm: a token bucket kept as one
// theoretical arrival time (TAT) instead of a token count and a timestamp.
// A request of cost c is admitted iff max(now, TAT) + c/Rate <= now +
// Burst/Rate, and then TAT moves to max(now, TAT) + c/Rate. Its decisions
// equal [TokenBucket]'s for every trace, weighted costs included.
//
// Rate is the sustained rate; Burst (in whole units, from 1 to 1e15) is the
// capacity, the most that can be spent at one instant. Burst/Rate, the time
// to earn a whole burst, must be less than [MaxTime]. The single-key
// limiter is lock-free when the time one milli-unit takes, in lowest terms,
// is a number of nanoseconds over a denominator of at most 256: every rate
// of whole nanoseconds per milli-unit (10/s, 100/min, 1e6/s) and most
// others (7 per 3 s, 7 per 3 h, 13 per 7 µs), but not 1,000,003/h. Such a
// limiter takes its mutex for good once its theoretical arrival time runs
// far past the instant it was built at: for whole nanoseconds only at the
// largest int64 nanosecond a settlement can reach, otherwise after 36 years
// for a denominator of 7, at least 417 days for any. At the other rates
// the limiter keeps its state under a mutex, held only to test and move the
// theoretical arrival time (the Decision is built after it is released);
// its decisions are the same.
type GCRA struct {
	Rate  Rate
	Burst int64
	Name  string // optional: reported as Decision.Policy
}

// vtime is an instant as whole nanoseconds plus frac/n of one, where n is the
// denominator of the rule's pace. The zero vtime is "long ago".
type vtime struct {
	t    int64
	frac uint64
}

// meter is the virtual-scheduling core shared by GCRA and the leaky bucket:
// a schedule time that moves on by cost/rate for every admitted request and
// may run at most the capacity's span ahead of now.
type meter struct {
	pace
	ruleBase
	tauNs    uint64 // the capacity's span: capMilli*p/n ns ...
	tauFrac  uint64 // ... plus tauFrac/n
	unitNs   uint64 // the span of one Unit, for the common cost
	unitFrac uint64
}

func newMeter(rule, name, rateField, capField string, r Rate, capacity int64) (meter, error) {
	pc, err := r.compile(rule, rateField)
	if err != nil {
		return meter{}, err
	}
	cm, err := capacityMilli(rule, capField, capacity)
	if err != nil {
		return meter{}, err
	}
	tn, tf, ok := pc.span(uint64(cm))
	if !ok {
		return meter{}, &RuleError{Rule: rule, Field: capField, Reason: "takes longer than MaxTime to refill at " + rateField}
	}
	un, uf, _ := pc.span(uint64(Unit)) // no longer than the capacity's span: cannot fail
	return meter{
		pace:     pc,
		ruleBase: ruleBase{capMilli: cm, pol: policy{name: name, limit: capacity, window: ceilNs(tn, tf)}},
		tauNs:    tn, tauFrac: tf,
		unitNs: un, unitFrac: uf,
	}, nil
}

// debt is how far s runs ahead of now (zero if behind).
func (m *meter) debt(s *vtime, now int64) (uint64, uint64) {
	if s.t < now {
		return 0, 0
	}
	return uint64(s.t - now), s.frac
}

// costSpan returns the time cost milli-units take at the rule's rate.
func (m *meter) costSpan(cost int64) (ns, frac uint64) {
	if cost == int64(Unit) {
		return m.unitNs, m.unitFrac
	}
	ns, frac, _ = m.span(uint64(cost)) // cost <= capacity: fits
	return ns, frac
}

// admits is the admission test: the debt at now, dn+df/n (<= 2 tau: see
// Store.Settle), plus a cost's span cn+cf/n, is what the debt would become,
// nn+nf/n; the request fits iff that is at most tau.
func (m *meter) admits(dn, df, cn, cf uint64) (nn, nf uint64, ok bool) {
	nn, nf = dn+cn, df+cf // <= 3 tau < 2^64
	if nf >= m.n {
		nn, nf = nn+1, nf-m.n
	}
	return nn, nf, nn < m.tauNs || (nn == m.tauNs && nf <= m.tauFrac)
}

// schedule is the meter's step, writing the whole Decision into *d, so
// that a caller returning it builds it in place rather than copying. wait
// is how far the schedule ran ahead of now before this request: for an
// admitted request, how long it queues.
func (m *meter) schedule(d *Decision, s *vtime, now, cost int64, commit bool) (waitNs, waitFrac uint64) {
	dn, df := m.debt(s, now)
	cn, cf := m.costSpan(cost)
	nn, nf, ok := m.admits(dn, df, cn, cf)
	if ok && commit {
		s.t, s.frac = now+int64(nn), nf
	}
	m.conclude(d, now, dn, df, nn, nf, ok)
	if ok {
		return dn, df
	}
	return 0, 0
}

// conclude writes into *d the Decision for a request judged at now on a
// debt of dn+df/n, which admitting it makes nn+nf/n, and which ok says
// fits (admits' answers).
func (m *meter) conclude(d *Decision, now int64, dn, df, nn, nf uint64, ok bool) {
	*d = m.pol.decision()
	d.At = time.Duration(now)
	if ok {
		d.Allowed = true
		dn, df = nn, nf
	} else {
		rn, rf := nn-m.tauNs, nf
		if rf < m.tauFrac {
			rn, rf = rn-1, rf+m.n
		}
		d.RetryAfter = ceilNs(rn, rf-m.tauFrac)
	}
	d.ResetAfter = ceilNs(dn, df)
	// Spent milli-units = debt*n/p, rounded up: what is left is rounded
	// down, and nothing while the key is in debt.
	spent := m.milliCeil(dn, df) // <= 2 capMilli (see Store.Settle)
	d.Remaining = max(m.capMilli-int64(spent), 0) / int64(Unit)
}

func (m *meter) fresh(s *vtime, now int64) bool {
	dn, df := m.debt(s, now)
	return dn == 0 && df == 0
}

// gcraAlgo is a compiled GCRA rule.
type gcraAlgo struct{ meter }

func (r GCRA) compile() (*gcraAlgo, error) {
	return compileGCRA("GCRA", r.Name, r.Rate, r.Burst)
}

// compileGCRA compiles a GCRA of the given rate and burst for the rule type
// named rule (GCRA, or TokenBucket, which runs on it).
func compileGCRA(rule, name string, r Rate, burst int64) (*gcraAlgo, error) {
	m, err := newMeter(rule, name, "Rate", "Burst", r, burst)
	if err != nil {
		return nil, err
	}
	return &gcraAlgo{m}, nil
}

func (a *gcraAlgo) step(s *vtime, now, cost int64, m stepMode) Decision {
	var d Decision
	a.schedule(&d, s, now, cost, m.commits())
	return d
}

// bind keeps GCRA's own binding, for its lock-free single-key limiter.
func (r GCRA) bind() (binding, error) { return bindGCRA(r.compile()) }

// bindGCRA binds a compiled GCRA, passing on a compile error.
func bindGCRA(a *gcraAlgo, err error) (binding, error) {
	if err != nil {
		return nil, err
	}
	return gcraBinding{bound[vtime, *gcraAlgo]{a}}, nil
}
