package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
)

// LeaseOptions configure [NewLeased].
type LeaseOptions struct {
	// Max is the largest lease a replica takes for one key, in milli-units:
	// at least 2 (two requests of one milli-unit) and at most the rule's
	// capacity. It bounds what one replica holds of a key's allowance, and
	// so what other replicas may be refused while it sits unused.
	Max ratelimit.Units

	// Hold is how long a lease admits after Redis granted it; what is left
	// then is given back. It must be positive. A window rule's lease also
	// ends with the window it was spent in (a sub-window's, with its
	// bucket). Hold is also the period over which a key's demand is
	// measured to size its next lease.
	Hold time.Duration

	// Keys bounds how many keys a Leased tracks (and so may lease) at
	// once; 0 means 10,000. A key that finds no room goes to Redis for
	// every request, as on a plain Store.
	Keys int
}

// Leased is a [Store] whose hot keys admit from leases: a replica takes k
// units of a key's allowance from Redis at once (one check of cost k,
// spent in Redis when taken) and admits requests from it locally, without
// a round trip, giving back what it did not use when the lease ends. Every
// admission is paid for in Redis before it is made, so all replicas
// together admit no more than the rule allows; see the package
// documentation, section Leases, for the exact bounds and their costs.
//
// Which keys lease: only keys seen hot. A key's demand is what its checks
// asked for (admitted or not) in the last period of Hold on this replica;
// a key leases when that demand is at least twice the request's cost,
// with k the demand capped at Max (so a lease is sized to be used up
// within about one Hold), and goes straight to Redis otherwise, exactly as
// the Store does. A token bucket or GCRA key leases, besides, only while
// Redis's last answer for it (its ResetAfter) puts it at least Hold from
// full: nearer full, a lease would stop admitting before it was used.
//
// A Leased is safe for concurrent use. Requests of one key share its lease
// through atomic operations; when it runs out, one of them takes the next
// lease while the others wait for that one round trip. It runs one
// goroutine per live lease, which gives the lease back when Hold has passed
// on the Store's clock; [Leased.Close] gives back every lease and stops
// them.
type Leased struct {
	s     *Store
	o     LeaseOptions
	meter bool  // token bucket or GCRA: a lease's allowance decays (see covers)
	span  int64 // the window or bucket a window rule's lease may not outlive, ns
	spans int64 // how many spans on from an admission's a refund of it gives nothing back
	base  time.Time

	keys   sync.Map // key -> *leaseKey
	nkeys  atomic.Int64
	closed atomic.Bool

	takes, takesRefused, localAdmits, direct, returns, returned, unreturned atomic.Uint64
}

// leaseKey is what a Leased knows of one key.
type leaseKey struct {
	key string
	cur atomic.Pointer[lease] // the live lease, or nil

	mu     sync.Mutex
	taking chan struct{} // closed when the take in flight ends; nil when none
	dead   bool          // dropped from the map: takes no lease

	// Demand, in milli-units asked per period of Hold on the local clock.
	period, demand, last atomic.Int64
	// full is when, on the local clock, the key's bucket is full again by
	// Redis's last Decision for it (its ResetAfter), if nothing else spends.
	full atomic.Int64
}

// lease is k milli-units of a key's allowance, spent in Redis by one check
// at the instant at.
type lease struct {
	k     int64
	used  atomic.Int64 // admitted from it; sealed (k+1) once it has ended
	d     ratelimit.Decision
	at    int64     // d.At, ns on the Redis time base
	end   int64     // the last instant it may admit at
	sent  time.Time // when the take was sent (local monotonic clock)
	state []byte    // the key's state in Redis right after the take (meters)
	stop  context.CancelFunc
}

// NewLeased returns s with leases for its hot keys (see [Leased]). The
// rule must spend exactly a check's cost on admission and count every
// admission alike wherever it falls in a lease's life: token bucket, GCRA,
// fixed window, sliding counter and sub-window, without CountRefused. A
// leaky bucket (each admission has its own Delay), a sliding log (an
// admission counts from the instant it is recorded, so one recorded early
// would leave the window early) and CountRefused (a refusal spends, so
// every request must reach Redis) are refused, as is a Store with
// [WithFallback]: a take that fails would charge the fallback the lease's
// size instead of the request's cost.
func NewLeased(s *Store, o LeaseOptions) (*Leased, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", ratelimit.ErrInvalidOption)
	}
	if o.Keys == 0 {
		o.Keys = 10_000
	}
	p := s.p
	switch {
	case o.Max < 2 || o.Max > p.Capacity:
		return nil, fmt.Errorf("%w: a lease's Max must be from 2 milli-units to the rule's capacity %v, not %v", ratelimit.ErrInvalidOption, p.Capacity, o.Max)
	case o.Hold <= 0:
		return nil, fmt.Errorf("%w: a lease's Hold must be positive", ratelimit.ErrInvalidOption)
	case o.Keys < 0:
		return nil, fmt.Errorf("%w: a lease's Keys must not be negative", ratelimit.ErrInvalidOption)
	case s.o.fallback != nil:
		return nil, fmt.Errorf("%w: leases do not combine with WithFallback", ratelimit.ErrInvalidOption)
	case p.CountRefused:
		return nil, fmt.Errorf("%w: %s with CountRefused cannot lease: each refusal spends", ratelimit.ErrInvalidRule, p.Algorithm)
	}
	ls := s.alg.lease
	if ls == nil {
		return nil, fmt.Errorf("%w: %s cannot lease: an admission must count alike wherever it falls in a lease", ratelimit.ErrInvalidRule, p.Algorithm)
	}
	l := &Leased{s: s, o: o, base: time.Now(), meter: ls.meter}
	if ls.span != nil {
		l.span, l.spans = ls.span(p), ls.spans(p)
	}
	return l, nil
}

// Store returns the Store l leases from.
func (l *Leased) Store() *Store { return l.s }

// Check is CheckContext with a background context.
func (l *Leased) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return l.CheckContext(context.Background(), key, cost)
}

// CheckContext checks cost for key: from the key's lease when it has one
// that can admit cost now, else as [Store.CheckContext] does, taking a new
// lease on the way when the key is hot (see [Leased]). Errors and the
// failure policy are the Store's, for the request's own cost.
//
// A Decision admitted from a lease describes the key as the lease's Redis
// answer left it, counted on locally: Allowed true; Limit, Policy and
// Window the rule's; At the instant Redis spent the lease (the instant
// [Store.Refund] needs, since that is when the cost was spent); Remaining
// Redis's Remaining at that answer plus what is left of the lease, in
// whole units rounded down (what this replica knows: other replicas may
// have spent Redis's part since, and time may have refilled it); ResetAfter
// the answer's, less the time since, as if the lease were all used;
// RetryAfter and Delay 0. A refusal always comes from Redis, for the
// request's own cost, and is exact, or from its deny cache (see
// [WithDenyCache]).
func (l *Leased) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	c := int64(cost)
	if c <= 0 || c > int64(l.s.p.Capacity) || l.closed.Load() {
		l.direct.Add(1)
		return l.s.CheckContext(ctx, key, cost)
	}
	e := l.entry(key)
	if e == nil {
		l.direct.Add(1)
		return l.s.CheckContext(ctx, key, cost)
	}
	est := e.note(l.local(), int64(l.o.Hold), c)
	for round := 0; ; round++ {
		ls := e.cur.Load()
		if ls != nil {
			if d, ok := l.admit(ls, c); ok {
				l.localAdmits.Add(1)
				l.s.observe(d, cost, nil)
				return d, nil
			}
		}
		k := min(int64(l.o.Max), est)
		if k < 2*c || round == maxRounds || l.meter && e.full.Load()-l.local() < int64(l.o.Hold) {
			// Cold (a lease left from hotter times ends with its Hold); a
			// bucket too near full for a lease to last (see covers); or
			// leases taken meanwhile ran out before this request got its
			// share: Redis decides it alone.
			return l.checkAlone(ctx, e, cost)
		}
		e.mu.Lock()
		if ch := e.taking; ch != nil {
			e.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return l.checkAlone(ctx, e, cost)
			}
		}
		if e.dead || e.cur.Load() != ls {
			e.mu.Unlock()
			if e.dead {
				return l.checkAlone(ctx, e, cost)
			}
			continue
		}
		ch := make(chan struct{})
		e.taking = ch
		e.mu.Unlock()
		d, err := l.take(ctx, e, ls, c, k)
		e.mu.Lock()
		e.taking = nil
		close(ch)
		e.mu.Unlock()
		return d, err
	}
}

// maxRounds is how many leases a request waits for before it goes to
// Redis alone: when many requests wait for one take, the lease may run
// out before each got its share.
const maxRounds = 3

// checkAlone checks cost for e's key in Redis, as the Store does, and
// keeps when the Decision says the key is full again, for the next lease.
func (l *Leased) checkAlone(ctx context.Context, e *leaseKey, cost ratelimit.Units) (ratelimit.Decision, error) {
	l.direct.Add(1)
	d, err := l.s.CheckContext(ctx, e.key, cost)
	if err == nil {
		e.full.Store(l.local() + int64(d.ResetAfter))
	}
	return d, err
}

// take ends old (if any), gives back its rest, and takes a lease of k for
// e's key, admitting c from it; if Redis refuses the lease, it checks c
// alone. It runs while e.taking is set, so one at a time per key.
func (l *Leased) take(ctx context.Context, e *leaseKey, old *lease, c, k int64) (ratelimit.Decision, error) {
	if old != nil {
		l.end(e, old)
	}
	sent := time.Now()
	d, err := l.s.check(ctx, e.key, ratelimit.Units(k), false)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			// The failure policy answers for the request's own cost.
			d, _ = l.s.degraded(ctx, e.key, ratelimit.Units(c), err)
		}
		l.s.observe(d, ratelimit.Units(c), err)
		return d, err
	}
	e.full.Store(l.local() + int64(d.ResetAfter))
	if !d.Allowed {
		// Redis has less than k: lease what it has, if that is worth a
		// lease, else check the request alone. Either costs the round trip
		// a check of the request alone would.
		l.takesRefused.Add(1)
		if r := d.Remaining * int64(ratelimit.Unit); r >= 2*c && r < k {
			d, err = l.s.check(ctx, e.key, ratelimit.Units(r), false)
			k = r
		}
		if err != nil || !d.Allowed {
			if err == nil {
				l.takesRefused.Add(1)
			}
			return l.checkAlone(ctx, e, ratelimit.Units(c))
		}
	}
	l.takes.Add(1)
	ls := &lease{k: k, d: d, at: int64(d.At), sent: sent}
	ls.end = ls.at + int64(min(l.o.Hold, time.Duration(int64(ratelimit.MaxTime)-ls.at)))
	if l.span > 0 {
		ls.end = min(ls.end, (ls.at/l.span+1)*l.span-1)
	}
	if l.meter {
		ls.state = meterState(ls.at, d.ResetAfter)
	}
	ls.used.Store(c)
	out := l.decision(ls, c, ls.at)
	l.s.observe(out, ratelimit.Units(c), nil)
	e.mu.Lock()
	if e.dead || l.closed.Load() {
		e.mu.Unlock()
		l.giveBackRest(e.key, ls)
		return out, nil
	}
	lctx, stop := context.WithCancel(context.Background())
	ls.stop = stop
	e.cur.Store(ls)
	e.mu.Unlock()
	go l.expire(lctx, e, ls)
	return out, nil
}

// admit spends c from ls if ls can admit it now, and returns the Decision.
func (l *Leased) admit(ls *lease, c int64) (ratelimit.Decision, bool) {
	t := l.instant(ls)
	if t > ls.end {
		return ratelimit.Decision{}, false
	}
	for {
		u := ls.used.Load()
		if u+c > ls.k {
			return ratelimit.Decision{}, false
		}
		if l.meter && t > ls.at && !l.covers(ls, u+c, t) {
			return ratelimit.Decision{}, false
		}
		if ls.used.CompareAndSwap(u, u+c) {
			return l.decision(ls, u+c, t), true
		}
	}
}

// covers reports whether a bucket lease may have admitted used in all at
// t: whether the key, as the take left it and with nothing spent since, is
// still short of full by at least used.
//
// Why. A lease holds allowance that Redis no longer has, while Redis's
// bucket refills toward its capacity as if that allowance were spent. Were
// the lease's allowance left in Redis instead, the bucket would reach its
// capacity sooner and stop refilling; a lease that admitted all of it
// after that would mint allowance the rule never gave. So a lease may have
// admitted, by t, at most what the bucket as the take left it still lacks
// at t; other replicas' checks since only make the bucket lack more. With
// that, at every instant Redis's allowance plus every lease's usable
// allowance is at most the capacity, it grows at most at the rule's rate,
// and each admission takes exactly its cost from it: over any span of time
// the cluster admits at most what the rule admits.
func (l *Leased) covers(ls *lease, used, t int64) bool {
	x := int64(l.s.p.Capacity) - used
	if x < 1 {
		return false
	}
	// Short of full by at least used iff the key could not admit
	// Capacity-used+1 milli-units; asking for Capacity-used errs by less
	// than one milli-unit, on the safe side.
	d, _, err := l.s.m.Step(ls.state, time.Duration(t), ratelimit.Units(x), false)
	return err == nil && !d.Allowed
}

// meterState is a bucket's state whose theoretical arrival time is at +
// resetAfter - 1 ns: no later than the state Redis wrote at at, whose
// Decision's ResetAfter is its arrival time less at, rounded up. It refills
// no later than the real one, so covers may refuse one nanosecond early,
// never admit late.
func meterState(at int64, resetAfter time.Duration) []byte {
	tat := at + max(int64(resetAfter)-1, 0)
	return []byte(strconv.FormatInt(at, 10) + " " + strconv.FormatInt(tat, 10) + " 0")
}

// instant is the time a lease's checks run at, on the Redis time base:
// the client clock's reading, or, on the server's clock, the instant Redis
// spent the lease plus the time since the take was sent (never less than
// the time elapsed in Redis since it decided).
func (l *Leased) instant(ls *lease) int64 {
	if l.s.clock != nil {
		return max(clamp(l.s.clock.Now()), ls.at)
	}
	return ls.at + int64(time.Since(ls.sent))
}

// local is the time demand is measured on: the client clock, or the local
// monotonic clock.
func (l *Leased) local() int64 {
	if l.s.clock != nil {
		return clamp(l.s.clock.Now())
	}
	return int64(time.Since(l.base))
}

// decision is the Decision of a request admitted from ls at t, leaving
// used spent from it.
func (l *Leased) decision(ls *lease, used, t int64) ratelimit.Decision {
	d := ls.d
	d.Allowed = true
	d.Remaining = (d.Remaining*int64(ratelimit.Unit) + ls.k - used) / int64(ratelimit.Unit)
	d.ResetAfter = max(0, d.ResetAfter-time.Duration(t-ls.at))
	d.RetryAfter, d.Delay = 0, 0
	return d
}

// note adds c to e's demand at t and returns the demand to size a lease
// by: the larger of the last whole period's and the current one's.
func (e *leaseKey) note(t, hold, c int64) int64 {
	p := e.period.Load()
	if t-p >= hold && e.period.CompareAndSwap(p, t) {
		d := e.demand.Swap(0)
		if t-p >= 2*hold {
			d = 0 // a whole period passed without a request
		}
		e.last.Store(d)
	}
	return max(e.demand.Add(c), e.last.Load())
}

// seal ends ls for admissions and returns what was left of it. Only the
// first call gets the rest; later ones get 0.
func (ls *lease) seal() int64 {
	for {
		u := ls.used.Load()
		if u > ls.k {
			return 0
		}
		if ls.used.CompareAndSwap(u, ls.k+1) {
			return ls.k - u
		}
	}
}

// end ends ls if it is still e's lease, and gives back its rest.
func (l *Leased) end(e *leaseKey, ls *lease) error {
	if !e.cur.CompareAndSwap(ls, nil) {
		return nil
	}
	return l.giveBackRest(e.key, ls)
}

// expire ends ls once Hold has passed on the Store's clock, unless ctx
// ends first (ls ended otherwise).
func (l *Leased) expire(ctx context.Context, e *leaseKey, ls *lease) {
	if ratelimit.Sleep(ctx, l.s.Clock(), l.o.Hold) == nil {
		l.end(e, ls)
	}
}

// giveBackRest seals ls and gives back to Redis what is left of it.
func (l *Leased) giveBackRest(key string, ls *lease) error {
	if ls.stop != nil {
		ls.stop()
	}
	rest := ls.seal()
	if rest <= 0 {
		return nil
	}
	if l.expired(ls, rest, l.instant(ls)) {
		l.unreturned.Add(uint64(rest))
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.s.o.timeout)
	defer cancel()
	g, err := l.giveBack(ctx, key, rest, ls.at)
	l.returns.Add(1)
	l.returned.Add(uint64(g))
	l.unreturned.Add(uint64(rest - g))
	return err
}

// expired reports whether a refund of rest spent at ls.at would give
// nothing back at t (see [ratelimit.Store.Refund]), so that asking Redis is
// a wasted round trip: a bucket has refilled rest since, or the window or
// bucket at is in no longer counts.
func (l *Leased) expired(ls *lease, rest, t int64) bool {
	if l.meter {
		// rest <= RateUnits/RateNanos x (t - at)
		p := l.s.p
		hi1, lo1 := bits.Mul64(uint64(rest), p.RateNanos)
		hi2, lo2 := bits.Mul64(p.RateUnits, uint64(t-ls.at))
		return hi1 < hi2 || hi1 == hi2 && lo1 <= lo2
	}
	return t/l.span-ls.at/l.span >= l.spans
}

// entry returns key's entry, adding it if there is room (dropping an idle
// entry if need be); nil if there is none.
func (l *Leased) entry(key string) *leaseKey {
	if v, ok := l.keys.Load(key); ok {
		return v.(*leaseKey)
	}
	for range 2 {
		if l.nkeys.Add(1) <= int64(l.o.Keys) {
			e := &leaseKey{key: key}
			e.period.Store(l.local())
			v, loaded := l.keys.LoadOrStore(key, e)
			if loaded {
				l.nkeys.Add(-1)
			}
			return v.(*leaseKey)
		}
		l.nkeys.Add(-1)
		if !l.dropIdle() {
			return nil
		}
	}
	return nil
}

// dropIdle drops one entry, among the first few the map offers, that has
// no lease, no take in flight, and no request for two periods.
func (l *Leased) dropIdle() bool {
	now, seen, dropped := l.local(), 0, false
	l.keys.Range(func(k, v any) bool {
		e := v.(*leaseKey)
		e.mu.Lock()
		if !e.dead && e.cur.Load() == nil && e.taking == nil && now-e.period.Load() >= 2*int64(l.o.Hold) {
			e.dead = true
			dropped = true
		}
		e.mu.Unlock()
		if dropped {
			l.keys.Delete(k)
			l.nkeys.Add(-1)
			return false
		}
		seen++
		return seen < 64
	})
	return dropped
}

// Close gives back every lease and stops their goroutines; checks after it
// go to Redis alone, as on the Store. A take in flight during Close gives
// back its lease when it ends. The error joins the give-backs' errors.
func (l *Leased) Close() error {
	l.closed.Store(true)
	var errs []error
	l.keys.Range(func(_, v any) bool {
		e := v.(*leaseKey)
		if ls := e.cur.Load(); ls != nil {
			errs = append(errs, l.end(e, ls))
		}
		return true
	})
	return errors.Join(errs...)
}

// LeaseStats are a Leased's counters since it was built.
type LeaseStats struct {
	// Takes counts leases Redis granted; TakesRefused, takes it refused
	// (the request was then checked alone).
	Takes, TakesRefused uint64
	// LocalAdmits counts requests admitted from a lease without a round
	// trip (the request that took a lease is not among them).
	LocalAdmits uint64
	// Direct counts requests checked in Redis for their own cost: cold keys,
	// refused takes, requests a fresh lease could not cover, cost errors.
	Direct uint64
	// Returns counts leases that ended with something left, which was
	// given back; Returned is what Redis took back, and Unreturned what it
	// did not (a bucket refilled meanwhile, a window passed, or the give
	// back failed).
	Returns              uint64
	Returned, Unreturned ratelimit.Units
	// Keys is how many keys are tracked now (at most LeaseOptions.Keys).
	Keys int
}

// Stats returns l's counters.
func (l *Leased) Stats() LeaseStats {
	return LeaseStats{
		Takes:        l.takes.Load(),
		TakesRefused: l.takesRefused.Load(),
		LocalAdmits:  l.localAdmits.Load(),
		Direct:       l.direct.Load(),
		Returns:      l.returns.Load(),
		Returned:     ratelimit.Units(l.returned.Load()),
		Unreturned:   ratelimit.Units(l.unreturned.Load()),
		Keys:         int(l.nkeys.Load()),
	}
}

// giveBack gives rest milli-units of key's allowance, spent at the instant
// at, back to Redis, and returns how much Redis took back.
func (l *Leased) giveBack(ctx context.Context, key string, rest, at int64) (int64, error) {
	g, err := l.s.RefundContext(ctx, key, ratelimit.Units(rest), time.Duration(at))
	return int64(g), err
}

var (
	_ ratelimit.ContextChecker = (*Leased)(nil)
	_ ratelimit.KeyedLimiter   = (*Leased)(nil)
)
