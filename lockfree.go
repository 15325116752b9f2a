package ratelimit

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// gcraBinding builds GCRA's single-key limiter, atomicGCRA, for every pace:
// lock-free where the pace fits the word.
type gcraBinding struct{ bound[vtime, *gcraAlgo] }

// maxFracBits is the most bits a packed TAT gives the fraction of a
// nanosecond: the whole nanoseconds keep at least 55 bits, a span of more
// than a year (see atomicGCRA).
const maxFracBits = 8

func (b gcraBinding) newLimiter(o *options) Limiter {
	return newAtomicMeter(b.alg, nil, o)
}

// newAtomicMeter returns the single-key limiter for a GCRA (leak nil) or
// for a leaky bucket (leak, with alg its meter): lock-free if its pace's
// fraction fits the word, and otherwise with its state under the mutex
// from the start (see atomicGCRA).
func newAtomicMeter(alg *gcraAlgo, leak *leakyAlgo, o *options) *atomicGCRA {
	l := &atomicGCRA{alg: alg, leak: leak, obs: o.obs}
	l.reach = 2 * int64(alg.tauNs)
	if alg.tauFrac != 0 {
		l.reach += 2
	}
	if _, ok := o.clock.(systemClock); !ok {
		l.mono = &monotonic{clock: o.clock}
	}
	shift := uint(bits.Len64(alg.n - 1)) // frac < n fits in shift bits
	if shift > maxFracBits {
		l.word.Store(movedWord) // locked is the fresh state
		l.mutexOnly = true
		return l
	}
	l.shift, l.fracMask = shift, 1<<shift-1
	l.whole = shift == 0 && leak == nil
	// A look, not a use: the clock is only clamped to the readings that
	// decided something.
	l.base = clampTime(o.clock.Now())
	return l
}

// atomicGCRA is the lock-free single-key GCRA, which [TokenBucket] and
// [LeakyBucket] share (the leaky bucket's queue ends at a schedule time
// that moves as a TAT does; only its Decision adds a Delay): the state is
// one word, moved by compare-and-swap.
//
// The word is 0 for the fresh state (the zero vtime). Any other state is
// its TAT's whole nanoseconds since base (the clock's reading when the
// limiter was built) plus one, shifted left by shift bits, with the
// fraction's numerator (frac < n, the pace's denominator) in the low shift
// bits. For a pace of whole nanoseconds per milli-unit (10/s, 100/min,
// 1e6/s) shift is 0; 7 per 3 µs (n = 7) takes 3 bits. Paces whose n needs
// more than maxFracBits bits (1,000,003/h has n = 1,000,003) keep the
// mutex from the start (mutexOnly: the word is movedWord when the limiter is
// built): their whole nanoseconds would keep too few bits (2^54 ns, 208
// days, for n of 9 bits; 2^43 ns, 2.4 hours, for n = 1,000,003). Packing
// them in this one word against a base that moves would not be exact: a
// CAS that loaded the word before the base moved could succeed on the same
// bits after, which then stand for another TAT. That mutex is
// held only for the admission test and the write of the new TAT, as the CAS
// would be; the Decision is built outside it from the state it read, as on
// the word.
//
// A TAT 2^(63-shift) - 1 ns or more after base does not fit (for shift 3,
// 36 years after the limiter was built; for shift 8, 417 days; for shift
// 0, only a TAT of 2^63 - 1, the cap of a settlement, and only with base
// 0), nor does one before base (only a clock set back to before the
// limiter was built writes one). The
// operation that would write one moves the state under the mutex for good
// instead: it stores the state in locked and the word movedWord, with the
// mutex held, so that an operation that then finds movedWord takes the
// mutex and finds the state there.
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
//
// Contention. Checks of one key from every core each write the word, so
// its cache line moves between cores at every admission: a check from
// every core costs more than one from one goroutine (bench's
// BenchmarkPace; docs/performance.md has the figures). Two remedies were
// tried and not kept: loading the word
// with an atomic add of 0 (taking the line for writing at once, rather
// than shared and then for the CAS) left the parallel cost where it was
// and slowed a check from one goroutine; spinning for a while after a
// lost CAS, so that the other core keeps the line for a few checks, made
// it no faster. What would is a check that does not write the shared word
// on every admission (allowance drawn by each core in batches, say),
// which would change which checks are admitted near the limit.
type atomicGCRA struct {
	alg      *gcraAlgo
	leak     *leakyAlgo // the leaky bucket whose meter alg is; nil for GCRA
	mono     *monotonic // nil for the system clock, which is monotonic already
	obs      Observer
	base     int64 // the instant a packed TAT of 0 stands for
	shift    uint  // bits of the fraction in the word
	reach    int64 // 2 tau's whole nanoseconds, plus 2 if tau has a fraction (see floor)
	fracMask uint64
	whole    bool // a GCRA at a pace of whole nanoseconds: Check takes judgeWhole
	// mutexOnly: the pace's fraction never fits the word, which is
	// movedWord from the start.
	mutexOnly bool
	// word, mu and locked share a cache line of their own: the other
	// core's CAS on the word, or on the mutex, must not evict the fields
	// every Check reads.
	_      [64]byte
	word   atomic.Uint64
	mu     sync.Mutex
	locked vtime // the state once the word is movedWord; guarded by mu
	_      [32]byte
}

// movedWord marks a state moved under the mutex. No packed TAT is as
// large: every one is below 2^63.
const movedWord = math.MaxUint64

// unpack returns the state a word other than movedWord holds.
func (l *atomicGCRA) unpack(w uint64) vtime {
	if w == 0 {
		return vtime{}
	}
	return vtime{t: l.base + int64(w>>l.shift) - 1, frac: w & l.fracMask}
}

// pack returns the word for s, and false if its TAT lies before base or
// too far after it.
func (l *atomicGCRA) pack(s vtime) (uint64, bool) {
	if s == (vtime{}) {
		return 0, true
	}
	d := uint64(s.t-l.base) + 1 // s.t - base + 1 >= 1 unless s.t < base
	if s.t < l.base || d >= 1<<(63-l.shift) {
		return 0, false
	}
	return d<<l.shift | s.frac, true
}

// swap replaces the state loaded as w with s, and reports false, changing
// nothing, if another operation changed the state first.
func (l *atomicGCRA) swap(w uint64, s vtime) bool {
	if nw, ok := l.pack(s); ok {
		return l.word.CompareAndSwap(w, nw)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Only one operation may fill locked: the one whose CAS then succeeds.
	// One that finds the word changed gives up before writing; one that
	// writes and then loses its CAS to a lock-free writer leaves locked
	// unread, since the word is not movedWord.
	if l.word.Load() != w {
		return false
	}
	l.locked = s
	return l.word.CompareAndSwap(w, movedWord)
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
// monotonic across goroutines must not make the debt exceed its bound. tat
// is the TAT's whole nanoseconds: with fractions, TAT - 2 tau may lie up
// to 2 ns below tat - 2 tauNs, so the clamp then takes 2 ns off, which
// keeps it a bound on the time the TAT was written at. It does not
// overflow: the TAT is at least 0 and 2 tau + 2 below 2^63.
func (l *atomicGCRA) floor(now, tat int64) int64 {
	return max(now, tat-l.reach)
}

// spend admits cost at now if the state allows it, moving the TAT on. It
// returns the state it decided on and the time it decided at (now, clamped
// as the type's comment says), from which step (without committing)
// builds the Decision, and whether it admitted. Only the admission test
// runs inside the loop, so a lost race costs a few instructions, not a
// Decision.
func (l *atomicGCRA) spend(now, cost int64) (s vtime, at int64, admitted bool) {
	var v verdict
	s = l.judge(&v, now, cost)
	return s, v.at, v.ok
}

// verdict is what spend decided on: the instant, the debt it found there
// (dn+df/n), what admitting the request makes it (nn+nf/n), and whether
// it fits (admits' answers), from which meter.conclude builds the
// Decision without judging again.
type verdict struct {
	at             int64
	dn, df, nn, nf uint64
	ok             bool
}

// judge is spend, writing its verdict into *v.
func (l *atomicGCRA) judge(v *verdict, now, cost int64) vtime {
	cn, cf := l.alg.costSpan(cost)
	if l.mutexOnly {
		return l.judgeLocked(v, now, cn, cf)
	}
	for {
		w := l.word.Load()
		if w == movedWord {
			return l.judgeLocked(v, now, cn, cf)
		}
		s := l.unpack(w)
		v.at = l.judgedAt(now, s.t)
		v.dn, v.df = l.alg.debt(&s, v.at)
		v.nn, v.nf, v.ok = l.alg.admits(v.dn, v.df, cn, cf)
		if !v.ok || l.swap(w, vtime{t: v.at + int64(v.nn), frac: v.nf}) {
			return s
		}
	}
}

// judgeWhole is judge for a pace of whole nanoseconds (shift 0, so n = 1
// and no span has a fraction): the word is the TAT's nanoseconds since
// base plus one, and the admission test is admits' with no fraction to
// carry.
func (l *atomicGCRA) judgeWhole(v *verdict, now, cost int64) {
	span, _ := l.alg.costSpan(cost)
	v.df, v.nf = 0, 0
	for {
		w := l.word.Load()
		if w == movedWord {
			l.judgeLocked(v, now, span, 0)
			return
		}
		tat := int64(0) // the fresh state
		if w != 0 {
			tat = l.base + int64(w) - 1
		}
		v.at = now // judgedAt's answer unless the TAT runs more than tau ahead
		if tat-int64(l.alg.tauNs) > now {
			v.at = l.judgedAt(now, tat)
		}
		// The debt is at most 2 tau, and span at most tau: no overflow.
		v.dn = uint64(max(tat, v.at) - v.at)
		v.nn = v.dn + span
		v.ok = v.nn <= l.alg.tauNs
		if !v.ok {
			return
		}
		t := v.at + int64(v.nn)
		var won bool
		if nw := uint64(t-l.base) + 1; t > 0 && t >= l.base && nw < 1<<63 {
			won = l.word.CompareAndSwap(w, nw) // pack's word for vtime{t: t}
		} else {
			// A TAT of 0 (the fresh state's word), or one the word cannot
			// hold: swap decides as for any pace.
			won = l.swap(w, vtime{t: t})
		}
		if won {
			return
		}
	}
}

// judgeLocked is judge on the state under the mutex, for a cost that takes
// cn+cf/n: the mutex is held for the admission test and the new TAT only.
func (l *atomicGCRA) judgeLocked(v *verdict, now int64, cn, cf uint64) vtime {
	l.mu.Lock()
	s := l.locked
	v.at = l.judgedAt(now, s.t)
	v.dn, v.df = l.alg.debt(&s, v.at)
	v.nn, v.nf, v.ok = l.alg.admits(v.dn, v.df, cn, cf)
	if v.ok {
		l.locked = vtime{t: v.at + int64(v.nn), frac: v.nf}
	}
	l.mu.Unlock()
	return s
}

// load returns the state and the instant an operation that read now
// decides at, without changing either.
func (l *atomicGCRA) load(now int64, fresh func() int64) (vtime, int64) {
	var s vtime
	if w := l.word.Load(); w != movedWord {
		s = l.unpack(w)
	} else {
		l.mu.Lock()
		s = l.locked
		l.mu.Unlock()
	}
	if s.t-int64(l.alg.tauNs) > now {
		now = fresh()
	}
	return s, l.floor(now, s.t)
}

// update applies f, an operation on the state at the instant it decides
// at, that reports whether it changed the state, until it takes effect on
// the state it read.
func (l *atomicGCRA) update(now int64, f func(s *vtime, at int64) bool) {
	for {
		w := l.word.Load()
		if w == movedWord {
			l.mu.Lock()
			f(&l.locked, l.judgedAt(now, l.locked.t))
			l.mu.Unlock()
			return
		}
		s := l.unpack(w)
		if !f(&s, l.judgedAt(now, s.t)) || l.swap(w, s) {
			return
		}
	}
}

// decide writes into *d the Decision for cost on s at at, without
// committing: GCRA's, or the leaky bucket's with its Delay.
func (l *atomicGCRA) decide(d *Decision, s *vtime, at, cost int64) {
	if l.leak != nil {
		l.leak.decide(d, s, at, cost, false)
		return
	}
	l.alg.schedule(d, s, at, cost, false)
}

func (l *atomicGCRA) Check(cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.alg.capMilli, &l.alg.pol); err != nil {
		return d, err
	}
	var v verdict
	if l.whole {
		l.judgeWhole(&v, l.now(), int64(cost))
	} else {
		l.judge(&v, l.now(), int64(cost))
	}
	var d Decision
	l.alg.conclude(&d, v.at, v.dn, v.df, v.nn, v.nf, v.ok)
	if l.leak != nil && v.ok {
		l.leak.delay(&d, v.dn, v.df)
	}
	if l.obs != nil {
		l.obs.Decided(d, cost, outcomeOf(&d))
	}
	return d, nil
}
