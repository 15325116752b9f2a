package ratelimit

import (
	"sync/atomic"
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
// to earn a whole burst, must be less than [MaxTime]. For rates that divide into whole
// nanoseconds per milli-unit (10/s, 100/min, 1/ms, ...) the single-key
// limiter is lock-free.
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

// schedule is the meter's step, writing the whole Decision into *d, so
// that a caller returning it builds it in place rather than copying. wait
// is how far the schedule ran ahead of now before this request: for an
// admitted request, how long it queues.
func (m *meter) schedule(d *Decision, s *vtime, now, cost int64, commit bool) (waitNs, waitFrac uint64) {
	dn, df := m.debt(s, now) // <= 2 tau (see Store.Settle)
	cn, cf := m.unitNs, m.unitFrac
	if cost != int64(Unit) {
		cn, cf, _ = m.span(uint64(cost)) // cost <= capacity: fits
	}
	nn, nf := dn+cn, df+cf // <= 3 tau < 2^64
	if nf >= m.n {
		nn, nf = nn+1, nf-m.n
	}
	*d = m.pol.decision()
	d.At = time.Duration(now)
	if nn < m.tauNs || (nn == m.tauNs && nf <= m.tauFrac) {
		d.Allowed = true
		if commit {
			s.t, s.frac = now+int64(nn), nf
		}
		waitNs, waitFrac = dn, df
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
	return waitNs, waitFrac
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

func (a *gcraAlgo) step(s *vtime, now, cost int64, commit bool) Decision {
	var d Decision
	a.schedule(&d, s, now, cost, commit)
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

// gcraBinding builds the lock-free single-key limiter where it can.
type gcraBinding struct{ bound[vtime, *gcraAlgo] }

func (b gcraBinding) newLimiter(o *options) Limiter {
	if b.alg.n != 1 {
		return b.bound.newLimiter(o)
	}
	// Every span is a whole number of nanoseconds, so the state is one word
	// and compare-and-swap replaces the mutex.
	l := &atomicGCRA{alg: b.alg, obs: o.obs}
	if _, ok := o.clock.(systemClock); !ok {
		l.mono = &monotonic{clock: o.clock}
	}
	return l
}

// atomicGCRA is the lock-free single-key GCRA for a whole-nanosecond pace:
// the state is one TAT in whole nanoseconds, moved by compare-and-swap.
//
// The clock is read once per Check, before the loop. A Check that was
// overtaken by one that read a later time must not judge itself at its own,
// earlier reading (its debt could then exceed the burst's span). A TAT
// written by a Check is at most the burst's span (tau) ahead of the time it
// was written at; one written by a [Settle] may be up to 2 tau ahead (a key
// in debt: see [Store.Settle]). So a TAT more than tau ahead of an
// attempt's reading means that the attempt was overtaken, or that the key
// is in debt, and the state alone cannot tell which: the attempt reads the
// clock again (judgedAt). The clock is monotonic, and that reading comes
// after the TAT was written, so it is no earlier than the time it was
// written at: at least TAT - tau for a Check's, which keeps the debt within
// the burst and orders this attempt after the one it lost to, and at least
// TAT - 2 tau for a Settle's. Sequential use without debt never reads
// twice.
type atomicGCRA struct {
	alg  *gcraAlgo
	mono *monotonic // nil for the system clock, which is monotonic already
	obs  Observer
	// tat has a cache line of its own: the other core's CAS on it must not
	// evict the fields every Check reads.
	_   [64]byte
	tat atomic.Int64
	_   [56]byte
}

// now reads the limiter's clock, clamped.
func (l *atomicGCRA) now() int64 {
	if l.mono == nil {
		return clampTime(systemClock{}.Now())
	}
	return l.mono.now()
}

// judgedAt is the instant an operation that read now decides at, on a TAT
// it loaded: now, or a fresh reading of the clock if the TAT runs more
// than tau ahead of now (see atomicGCRA). The fresh reading is recorded,
// as now was.
func (l *atomicGCRA) judgedAt(now, tat int64) int64 {
	if tat-int64(l.alg.tauNs) > now {
		now = l.now()
	}
	return l.floor(now, tat)
}

// floor clamps now to TAT - 2 tau, the earliest time any TAT was written at:
// a fresh reading is never earlier than that, but a clock that is not
// monotonic across goroutines must not make the debt exceed its bound.
// TAT - 2 tau does not overflow: the TAT is at least 0 and 2 tau below
// 2^63.
func (l *atomicGCRA) floor(now, tat int64) int64 {
	return max(now, tat-2*int64(l.alg.tauNs))
}

// spend admits cost at now if the TAT allows it, moving the TAT on. It
// returns the TAT it decided on and the time it decided at (now, clamped as
// the type's comment says), from which step (without committing) builds
// the Decision, and whether it admitted. Only the admission test runs
// inside the loop, so a lost race costs a few instructions, not a Decision.
func (l *atomicGCRA) spend(now, cost int64) (tat, at int64, admitted bool) {
	span := l.alg.unitNs // n == 1: every span is whole nanoseconds
	if cost != int64(Unit) {
		span, _, _ = l.alg.span(uint64(cost))
	}
	for {
		tat = l.tat.Load()
		at = l.judgedAt(now, tat)
		base := max(tat, at)
		// base-at <= 2 tau, and span <= tau: the sum cannot overflow.
		if uint64(base-at)+span > l.alg.tauNs {
			return tat, at, false
		}
		if l.tat.CompareAndSwap(tat, base+int64(span)) {
			return tat, at, true
		}
	}
}

func (l *atomicGCRA) Check(cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.alg.capMilli, &l.alg.pol); err != nil {
		return d, err
	}
	tat, at, _ := l.spend(l.now(), int64(cost))
	var d Decision
	l.alg.schedule(&d, &vtime{t: tat}, at, int64(cost), false)
	if l.obs != nil {
		l.obs.Decided(d, cost, outcomeOf(&d))
	}
	return d, nil
}
