package ratelimit

import (
	"context"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Load shedding protects a server from overload, whoever is calling, where
// a rate limit protects it from one client's excess. A shedder counts the
// requests in progress in this process (or, through a [FleetCounter], in a
// shared backend) and refuses the least important ones first when that
// count nears its limit. Requests are put in priority classes by the
// application: from the route, the authenticated caller, or a header it
// trusts, never from what a client may claim.

// Priority is a request's priority class for a shedder: the index of the
// class in the shedder's Classes, 0 being the most important. A Priority
// out of range (negative, or past the last class) is taken as the least
// important class, so that a mistake never raises a request's priority.
// Find a class's Priority by its name with the shedder's Class method.
type Priority int

// ShedClass is one priority class of a shedder.
type ShedClass struct {
	// Name names the class in Decisions, metrics and responses: a short
	// label such as "critical", "default" or "sheddable". Names must be
	// unique and not empty.
	Name string

	// Share is the percentage of the shedder's limit (1 to 100) up to
	// which the work in progress, all classes together, may rise for a
	// request of this class to be admitted. Classes are listed from the
	// most important to the least, with shares that never increase down
	// the list: what lies between one class's share and the next more
	// important class's is kept for the more important classes.
	Share int
}

// Shedder is what [FleetShedder] and [WorkerShedder] have in common, for
// middleware that sheds load whichever kind it is given (httplimit's and
// grpclimit's). Implementations are safe for concurrent use.
type Shedder interface {
	// Admit admits or refuses one request of class p, at once: it never
	// waits. An admitted request holds its place in the work in
	// progress until its Release is called; call it with defer, so that
	// a return or a panic gives the place back. A refusal, or an error,
	// takes nothing and its Release does nothing. The error is ctx's if
	// it had ended, or a [FleetCounter]'s.
	Admit(ctx context.Context, p Priority) (Release, Decision, error)

	// Class returns the Priority of the class named name, and false if
	// there is none.
	Class(name string) (Priority, bool)

	// Classes returns the classes, most important first. The slice is
	// the caller's.
	Classes() []ShedClass
}

// ShedObserver is an [Observer] that is also told the class of each
// decision a shedder makes, for metrics by class. A shedder given an
// Observer with [WithObserver] reports each decision to Decided (the
// Decision's Policy being the shedder's Name, the cost one [Unit]) and,
// if the Observer is also a ShedObserver, to Shed as well. class is a
// [ShedClass] Name: its values are as few as the classes configured, so
// it is safe as a metric label.
type ShedObserver interface {
	Observer
	Shed(policy, class string, o Outcome)
}

// maxShedClasses bounds the number of classes of a shedder.
const maxShedClasses = 64

// maxShedLimit bounds a shedder's limit: a billion requests in progress.
const maxShedLimit = 1_000_000_000

// shedClasses is the validated classes of a shedder.
type shedClasses struct {
	list []ShedClass
}

// validateClasses checks cs for the rule named rule, whose limit (the
// smallest it can take, for an adaptive limit) is min.
func validateClasses(rule string, cs []ShedClass, min int64) (shedClasses, error) {
	bad := func(field, reason string) error { return &RuleError{Rule: rule, Field: field, Reason: reason} }
	if len(cs) == 0 || len(cs) > maxShedClasses {
		return shedClasses{}, bad("Classes", "must list 1 to 64 classes, got "+strconv.Itoa(len(cs)))
	}
	seen := make(map[string]bool, len(cs))
	for i, c := range cs {
		f := "Classes[" + strconv.Itoa(i) + "]"
		switch {
		case c.Name == "":
			return shedClasses{}, bad(f+".Name", "must not be empty")
		case seen[c.Name]:
			return shedClasses{}, bad(f+".Name", strconv.Quote(c.Name)+" names two classes")
		case c.Share < 1 || c.Share > 100:
			return shedClasses{}, bad(f+".Share", "must be a percentage from 1 to 100, got "+strconv.Itoa(c.Share))
		case i > 0 && c.Share > cs[i-1].Share:
			return shedClasses{}, bad(f+".Share", "must not exceed the share of the more important class before it ("+
				strconv.Itoa(c.Share)+" > "+strconv.Itoa(cs[i-1].Share)+")")
		case int64(c.Share)*min < 100:
			return shedClasses{}, bad(f+".Share", strconv.Itoa(c.Share)+"% of a limit of "+strconv.FormatInt(min, 10)+
				" is less than one request: the class could never be admitted")
		}
		seen[c.Name] = true
	}
	return shedClasses{list: append([]ShedClass(nil), cs...)}, nil
}

// of returns p as an index into the classes: the last one if p is out of
// range.
func (c *shedClasses) of(p Priority) int {
	if p < 0 || int(p) >= len(c.list) {
		return len(c.list) - 1
	}
	return int(p)
}

func (c *shedClasses) class(name string) (Priority, bool) {
	for i := range c.list {
		if c.list[i].Name == name {
			return Priority(i), true
		}
	}
	return 0, false
}

func (c *shedClasses) classes() []ShedClass { return append([]ShedClass(nil), c.list...) }

// shedReport tells obs (which may be nil) of a shedder's decision.
func shedReport(obs Observer, sobs ShedObserver, d *Decision, class string) {
	if obs == nil {
		return
	}
	o := outcomeOf(d)
	obs.Decided(*d, Unit, o)
	if sobs != nil {
		sobs.Shed(d.Policy, class, o)
	}
}

// validRetry checks a shedder's RetryAfter and returns it with its default.
func validRetry(rule string, d time.Duration) (time.Duration, error) {
	switch {
	case d < 0 || d >= MaxTime:
		return 0, &RuleError{Rule: rule, Field: "RetryAfter", Reason: "must be 0 (one second) or positive and less than MaxTime, got " + d.String()}
	case d == 0:
		return time.Second, nil
	}
	return d, nil
}

// FleetLimit is the rule of a [FleetShedder]: a limit on the work in
// progress, of which each class may fill only its share, so that what lies
// above a class's share is kept for more important classes. With classes
// critical (100), default (90) and sheddable (70) and a Limit of 100,
// sheddable requests are admitted while fewer than 70 requests of any
// class are in progress, default ones while fewer than 90 are, and
// critical ones up to the full 100: 10 places are always kept for
// critical work, and 30 for critical and default.
type FleetLimit struct {
	// Limit is the most requests in progress at once, all classes
	// together, from 1 to 1e9.
	Limit int64

	// Classes are the priority classes, most important first (see
	// [ShedClass]). Each class's share of Limit must be at least one
	// request.
	Classes []ShedClass

	// RetryAfter is the wait a refusal suggests to the client (the
	// Decision's RetryAfter): when a request in progress ends cannot be
	// known, so it is a hint, not an exact wait. 0 means one second.
	RetryAfter time.Duration

	// Name is reported as Decision.Policy.
	Name string

	// Counter keeps the count of work in progress. nil, the default,
	// counts in this process. A backend shared by replicas can
	// implement [FleetCounter] so that the limit holds across a fleet;
	// this package provides none yet.
	Counter FleetCounter
}

// FleetCounter keeps the count of work in progress that a [FleetShedder]
// limits. The default counts in this process; the interface is the seam
// for a backend shared by replicas (an atomic "take one if fewer than
// limit are taken" with leases that expire, so that a replica that dies
// does not hold its places for good). No such backend exists in this
// module yet: a FleetShedder limits one process unless given one.
//
// Implementations must be safe for concurrent use.
type FleetCounter interface {
	// Acquire takes one place if fewer than limit are taken, atomically.
	// The Decision's Allowed says whether it did, and Remaining how
	// many places are free below limit after it; the Release gives the
	// place back, is idempotent and does nothing for a refusal. An
	// error takes nothing.
	Acquire(ctx context.Context, limit int64) (Release, Decision, error)

	// InUse returns how many places are taken.
	InUse(ctx context.Context) (int64, error)
}

// FleetShedder admits a request only while the work in progress is below
// its class's share of a limit (see [FleetLimit]). It keeps no state but
// the count, so its decisions are the same whenever they are asked: it is
// the reservation Stripe's fleet usage load shedder makes, and it does not
// adapt or wait before changing its mind; for that, see [WorkerShedder].
//
// Its Decisions: Allowed; Limit is the class's share of the limit, in
// requests (rounded down); Remaining is how many more requests of the
// class could be admitted at once after this one; RetryAfter is the
// rule's hint on a refusal, 0 on an admission; Policy is the Name; At is
// the instant on the shedder's clock.
//
// A FleetShedder is safe for concurrent use, starts no goroutines and
// needs no Close. The zero FleetShedder is not usable; build one with
// [NewFleetShedder].
type FleetShedder struct {
	classes shedClasses
	caps    []int64 // each class's share of the limit, in requests
	retry   time.Duration
	name    string
	counter FleetCounter
	clock   Clock
	obs     Observer
	sobs    ShedObserver
}

// NewFleetShedder validates l and returns a [FleetShedder] for it. A bad
// rule is an error matching [ErrInvalidRule]. Of the options, [WithClock]
// sets the clock of the Decisions' At and [WithObserver] the Observer
// (see [ShedObserver]); the others do not apply to it.
func NewFleetShedder(l FleetLimit, opts ...Option) (*FleetShedder, error) {
	if l.Limit < 1 || l.Limit > maxShedLimit {
		return nil, &RuleError{Rule: "FleetLimit", Field: "Limit", Reason: "must be from 1 to 1e9, got " + strconv.FormatInt(l.Limit, 10)}
	}
	cs, err := validateClasses("FleetLimit", l.Classes, l.Limit)
	if err != nil {
		return nil, err
	}
	retry, err := validRetry("FleetLimit", l.RetryAfter)
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	s := &FleetShedder{classes: cs, retry: retry, name: l.Name, counter: l.Counter, clock: o.clock, obs: o.obs}
	s.sobs, _ = o.obs.(ShedObserver)
	if isNil(s.counter) {
		s.counter = new(localCounter)
	}
	for _, c := range cs.list {
		s.caps = append(s.caps, int64(c.Share)*l.Limit/100)
	}
	return s, nil
}

// Admit admits a request of class p if the work in progress is below
// p's share of the limit (see [Shedder]).
func (s *FleetShedder) Admit(ctx context.Context, p Priority) (Release, Decision, error) {
	i := s.classes.of(p)
	d := Decision{Limit: s.caps[i], Policy: s.name}
	if err := ctx.Err(); err != nil {
		return noRelease, d, err
	}
	rel, cd, err := s.counter.Acquire(ctx, s.caps[i])
	d.At = time.Duration(clampTime(s.clock.Now()))
	if err != nil {
		if s.obs != nil && ctx.Err() == nil {
			s.obs.Failed(s.name, err)
		}
		return noRelease, d, err
	}
	d.Allowed, d.Remaining = cd.Allowed, max(0, cd.Remaining)
	if !d.Allowed {
		d.Remaining, d.RetryAfter = 0, s.retry
		rel = noRelease
	}
	shedReport(s.obs, s.sobs, &d, s.classes.list[i].Name)
	return rel, d, nil
}

// InUse returns the count of work in progress, from the counter.
func (s *FleetShedder) InUse(ctx context.Context) (int64, error) { return s.counter.InUse(ctx) }

// Class returns the Priority of the class named name.
func (s *FleetShedder) Class(name string) (Priority, bool) { return s.classes.class(name) }

// Classes returns the classes, most important first.
func (s *FleetShedder) Classes() []ShedClass { return s.classes.classes() }

// localCounter is the in-process FleetCounter.
type localCounter struct{ n atomic.Int64 }

func (c *localCounter) Acquire(_ context.Context, limit int64) (Release, Decision, error) {
	for {
		n := c.n.Load()
		if n >= limit {
			return noRelease, Decision{Limit: limit}, nil
		}
		if c.n.CompareAndSwap(n, n+1) {
			var done atomic.Bool
			return func() {
				if !done.Swap(true) {
					c.n.Add(-1)
				}
			}, Decision{Allowed: true, Limit: limit, Remaining: limit - n - 1}, nil
		}
	}
}

func (c *localCounter) InUse(context.Context) (int64, error) { return c.n.Load(), nil }

// WorkerLimit is the rule of a [WorkerShedder].
type WorkerLimit struct {
	// Limit is the most requests in progress at once in this process,
	// all classes together, from 1 to 1e9: the number of workers, say.
	// With Adaptive it is where the limit starts.
	Limit int64

	// Classes are the priority classes, most important first (see
	// [ShedClass]): the shedder starts refusing a class when the work in
	// progress reaches its Share of the limit. Each class's share of the
	// limit (of Adaptive's MinLimit, if set) must be at least one request.
	Classes []ShedClass

	// Hysteresis is how many percentage points below its Share the work
	// in progress must fall before a class that is being refused is
	// admitted again, so that the shedder does not flap around a
	// threshold; 0 means 10. It must be less than every class's Share.
	// It does not apply to a class of Share 100, refused only at the
	// limit.
	Hysteresis int

	// Hold is the least time a class stays refused once the shedder
	// starts refusing it, measured on the shedder's clock; 0 means no
	// such wait, the Hysteresis alone deciding. Like Hysteresis, it does
	// not apply to a class of Share 100.
	Hold time.Duration

	// Adaptive, if not nil, moves the limit with the latency of the
	// requests that complete (see [Gradient]); nil keeps it fixed at
	// Limit.
	Adaptive *Gradient

	// RetryAfter is the wait a refusal suggests to the client (the
	// Decision's RetryAfter), a hint: 0 means one second. When a request
	// in progress ends cannot be known, so no exact wait exists; a
	// refusal's RetryAfter is this hint, or what is left of Hold if that
	// is longer, since the class cannot be readmitted before.
	RetryAfter time.Duration

	// Name is reported as Decision.Policy.
	Name string
}

// Gradient makes a [WorkerShedder]'s limit adaptive, as the gradient
// limits of Netflix's concurrency-limits do: when the requests completing
// now take longer than they used to, work is queueing somewhere, and the
// limit comes down; while they take no longer, it rises.
//
// Latency is measured from a request's admission to its Release, on the
// shedder's clock, and gathered over windows of Window. At the end of each
// window that saw a request complete, with short the window's mean latency
// and long a moving average of short over the last LongWindow windows:
//
//	gradient = Tolerance × long / short, kept between 1/2 and 1
//	target   = limit × gradient + Queue
//	limit    = limit + (target − limit) × Smoothing
//
// kept between MinLimit and MaxLimit. While latency holds (short no more
// than Tolerance × long) the gradient is 1 and the limit grows by Queue ×
// Smoothing a window; the gradient's floor of 1/2 makes a limit under a
// long slowdown settle near 2 × Queue, not lower (set a smaller Queue to
// let it go lower).
//
// The limit does not move in a window in which the shedder refused no
// request and the most requests in progress stayed below half the limit:
// it is not what holds the traffic back. A refusal of any class counts,
// since the classes' shares are fractions of the limit: with shares under
// one half, the work in progress can stay below half the limit while the
// least important class is refused, and the limit must still grow for it
// to come back after a slowdown. When long is more than twice short (after
// a slowdown has passed), long drops by a tenth a window, as Netflix's
// Gradient2 drops it, so that latency back at its baseline reads as such
// sooner than the average alone would let it. After a slowdown the limit
// thus climbs back by Queue × Smoothing a window for as long as requests
// are refused and latency holds.
//
// All of it is integer arithmetic (the limit in thousandths of a request),
// and it happens during Admit and Release, so the limit moves only with
// requests, and on a [ManualClock] exactly as the test drives it.
//
// The zero values of its fields are defaults, as each says.
type Gradient struct {
	// MinLimit and MaxLimit bound the limit, from 1 to 1e9. MinLimit 0
	// means the least limit at which the least important class has room
	// for one request (100 / its Share, rounded up); MaxLimit 0 means 10
	// times the WorkerLimit's Limit (at most 1e9). The Limit, where the
	// limit starts, must lie between them, and every class's share of
	// MinLimit must be at least one request.
	MinLimit, MaxLimit int64

	// Window is how long latencies are gathered before the limit moves;
	// 0 means one second.
	Window time.Duration

	// LongWindow is how many windows the long-term latency averages over;
	// 0 means 100.
	LongWindow int

	// Tolerance, in percent (at least 100), is how much slower than the
	// long-term latency requests may get before the limit comes down; 0
	// means 150.
	Tolerance int

	// Smoothing, in percent (1 to 100), is how far the limit moves toward
	// its target each window; 0 means 20.
	Smoothing int

	// Queue is what the target adds to the limit, so that it keeps
	// probing for more room while latency holds; 0 means 4.
	Queue int64
}

// WorkerShedder watches how busy this process is, the requests in progress
// against a limit that is fixed or adaptive ([Gradient]), and as they fill
// it refuses the least important class first, then the next, the most
// important last: class i is refused from when the work in progress
// reaches its Share of the limit until it falls Hysteresis points below
// that Share again, and at least Hold after it started. A class whose Share
// is 100 is refused only while the limit itself is reached: hysteresis
// there would refuse the most important work while there is room that
// nothing less important may take. Classes are refused in order and
// readmitted in the reverse order, so that a class is never refused while
// a less important one is admitted. Whatever the classes, no request is
// admitted beyond the limit. It is the worker utilisation load shedder of
// Stripe's four limiters.
//
// A class's Share is of all the work in progress, so what lies above it is
// kept for the classes above it: with default at 90%, critical requests
// are sure of only a tenth of the limit when default traffic is heavy.
// Give the more important classes room for their own peak: if critical
// traffic alone can reach 40% of the limit, default's Share should be at
// most about 60%.
//
// Its Decisions: Allowed; Limit is the work in progress at which the
// class starts being refused, in requests, under the limit now in force;
// Remaining is how many more requests of the class could be admitted at
// once after this one (0 while it is refused); RetryAfter, on a refusal,
// is the rule's hint or, if longer, the time until Hold lets the class be
// readmitted (the Hold of each class refused above it included), 0 on an
// admission; Policy is the Name; At is the instant on the shedder's clock.
//
// Time comes from the shedder's clock and is clamped, never trusted to go
// backwards. A WorkerShedder is safe for concurrent use: its state sits
// behind one mutex, held for a few integer operations per Admit and
// Release. It starts no goroutines and needs no Close. The zero
// WorkerShedder is not usable; build one with [NewWorkerShedder].
type WorkerShedder struct {
	classes shedClasses
	hyst    int64
	hold    int64
	retry   time.Duration
	name    string
	clock   Clock
	obs     Observer
	sobs    ShedObserver
	grad    *gradientRule // nil: a fixed limit

	mu    sync.Mutex
	now   int64 // the latest instant seen
	inUse int64
	limit int64 // in thousandths of a request
	// cut is the first class refused: classes cut and after are refused.
	cut   int
	since []int64 // since[i]: when class i began being refused

	// The adaptive limit's window: its start, the sum and count of the
	// latencies of the requests completed in it, the most requests in
	// progress during it, and the requests refused in it; long is the
	// long-term latency (0: none yet).
	winStart, sum, count, peak, refused, long int64
}

// gradientRule is a validated Gradient.
type gradientRule struct {
	min, max, window, long, tol, smooth, queue int64 // min, max, queue in thousandths of a request
}

// NewWorkerShedder validates l and returns a [WorkerShedder] for it. A bad
// rule is an error matching [ErrInvalidRule]. Of the options, [WithClock]
// sets the clock latency and Hold are measured on and [WithObserver] the
// Observer (see [ShedObserver]); the others do not apply to it.
func NewWorkerShedder(l WorkerLimit, opts ...Option) (*WorkerShedder, error) {
	bad := func(field, reason string) error { return &RuleError{Rule: "WorkerLimit", Field: field, Reason: reason} }
	if l.Limit < 1 || l.Limit > maxShedLimit {
		return nil, bad("Limit", "must be from 1 to 1e9, got "+strconv.FormatInt(l.Limit, 10))
	}
	cs, err := validateClasses("WorkerLimit", l.Classes, l.Limit)
	if err != nil {
		return nil, err
	}
	var g *gradientRule
	if a := l.Adaptive; a != nil {
		g = &gradientRule{min: a.MinLimit, max: a.MaxLimit, window: int64(a.Window), long: int64(a.LongWindow),
			tol: int64(a.Tolerance), smooth: int64(a.Smoothing), queue: a.Queue}
		if g.min == 0 {
			// The least limit at which the least important class has
			// room for one request; no more than Limit, at which every
			// class has.
			g.min = ceilDiv64(100, int64(cs.list[len(cs.list)-1].Share))
		}
		if g.max == 0 {
			g.max = min(10*l.Limit, maxShedLimit)
		}
		def := func(v *int64, d int64) {
			if *v == 0 {
				*v = d
			}
		}
		def(&g.window, int64(time.Second))
		def(&g.long, 100)
		def(&g.tol, 150)
		def(&g.smooth, 20)
		def(&g.queue, 4)
		switch {
		case g.min < 1 || g.min > maxShedLimit || g.max < 1 || g.max > maxShedLimit || g.min > l.Limit || l.Limit > g.max:
			return nil, bad("Adaptive.MinLimit/MaxLimit", "must be from 1 to 1e9 with MinLimit <= Limit <= MaxLimit, got "+
				strconv.FormatInt(g.min, 10)+" <= "+strconv.FormatInt(l.Limit, 10)+" <= "+strconv.FormatInt(g.max, 10))
		case g.window < 0 || g.window >= int64(MaxTime):
			return nil, bad("Adaptive.Window", "must be 0 (one second) or positive and less than MaxTime, got "+a.Window.String())
		case g.long < 1 || g.long > 1_000_000:
			return nil, bad("Adaptive.LongWindow", "must be 0 (100) or from 1 to 1e6, got "+strconv.Itoa(a.LongWindow))
		case g.tol < 100 || g.tol > 10_000:
			return nil, bad("Adaptive.Tolerance", "must be 0 (150) or a percentage from 100 to 10000, got "+strconv.Itoa(a.Tolerance))
		case g.smooth < 1 || g.smooth > 100:
			return nil, bad("Adaptive.Smoothing", "must be 0 (20) or a percentage from 1 to 100, got "+strconv.Itoa(a.Smoothing))
		case g.queue < 0 || g.queue > maxShedLimit:
			return nil, bad("Adaptive.Queue", "must be 0 (4) or from 1 to 1e9, got "+strconv.FormatInt(a.Queue, 10))
		}
		if _, err := validateClasses("WorkerLimit", l.Classes, g.min); err != nil {
			return nil, err
		}
		g.min, g.max, g.queue = g.min*1000, g.max*1000, g.queue*1000
	}
	hyst := l.Hysteresis
	if hyst == 0 {
		hyst = 10
	}
	if least := cs.list[len(cs.list)-1].Share; hyst < 0 || hyst >= least {
		return nil, bad("Hysteresis", "must be 0 (10) or from 1 to less than the smallest Share ("+strconv.Itoa(least)+"), got "+strconv.Itoa(hyst))
	}
	if l.Hold < 0 || l.Hold >= MaxTime {
		return nil, bad("Hold", "must be 0 (none) or positive and less than MaxTime, got "+l.Hold.String())
	}
	retry, err := validRetry("WorkerLimit", l.RetryAfter)
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	s := &WorkerShedder{
		classes: cs, hyst: int64(hyst), hold: int64(l.Hold), retry: retry, name: l.Name,
		clock: o.clock, obs: o.obs, grad: g,
		limit: l.Limit * 1000, cut: len(cs.list), since: make([]int64, len(cs.list)),
	}
	s.sobs, _ = o.obs.(ShedObserver)
	s.now = clampTime(s.clock.Now())
	s.winStart = s.now
	return s, nil
}

// Admit admits a request of class p unless its class is being refused or
// the limit is reached (see [WorkerShedder] and [Shedder]).
func (s *WorkerShedder) Admit(ctx context.Context, p Priority) (Release, Decision, error) {
	i := s.classes.of(p)
	if err := ctx.Err(); err != nil {
		return noRelease, Decision{Policy: s.name}, err
	}
	s.mu.Lock()
	now := s.tick()
	d := Decision{Policy: s.name, At: time.Duration(now)}
	hard := s.limit / 1000
	d.Limit = min(s.onAt(i), hard)
	if i < s.cut && s.inUse < hard {
		s.inUse++
		s.peak = max(s.peak, s.inUse)
		s.step(now)
		d.Allowed = true
		if i < s.cut {
			d.Remaining = max(0, min(s.onAt(i), s.limit/1000)-s.inUse)
		}
	} else {
		d.RetryAfter = max(s.retry, s.holdLeft(i, now))
		if s.grad != nil {
			s.refused++
		}
	}
	s.mu.Unlock()
	shedReport(s.obs, s.sobs, &d, s.classes.list[i].Name)
	if !d.Allowed {
		return noRelease, d, nil
	}
	slot := &workerSlot{s: s, at: now}
	return slot.release, d, nil
}

// workerSlot is an admitted request's place in a WorkerShedder.
type workerSlot struct {
	s    *WorkerShedder
	at   int64
	done atomic.Bool
}

func (w *workerSlot) release() {
	if w.done.Swap(true) {
		return
	}
	s := w.s
	s.mu.Lock()
	now := s.tick()
	s.inUse--
	if s.grad != nil {
		s.sum = satAdd(s.sum, now-w.at)
		s.count++
	}
	s.step(now)
	s.mu.Unlock()
}

// satAdd is a + b for non-negative a and b, at most MaxTime.
func satAdd(a, b int64) int64 {
	if a > int64(MaxTime)-b {
		return int64(MaxTime)
	}
	return a + b
}

// tick reads the clock, clamped to never go back, moves the adaptive limit
// if a window has ended, and updates which classes are refused; with s.mu
// held.
func (s *WorkerShedder) tick() int64 {
	now := max(s.now, clampTime(s.clock.Now()))
	s.now = now
	if s.grad != nil && now-s.winStart >= s.grad.window {
		s.adapt()
		s.winStart, s.sum, s.count, s.peak, s.refused = now, 0, 0, s.inUse, 0
	}
	s.step(now)
	return now
}

// onAt is the work in progress, in requests, at which class i starts
// being refused: the least n with n >= Share% of the limit.
func (s *WorkerShedder) onAt(i int) int64 {
	return ceilDiv64(int64(s.classes.list[i].Share)*s.limit, 100_000)
}

func ceilDiv64(a, b int64) int64 { return (a + b - 1) / b }

// step refuses the classes whose share the work in progress has reached,
// most important last, and readmits those it has fallen Hysteresis points
// below (after Hold; a class of Share 100 as soon as it is below the
// limit), most important first; with s.mu held.
func (s *WorkerShedder) step(now int64) {
	u := s.inUse * 100_000 // in thousandths of a request, times 100
	for s.cut > 0 && u >= int64(s.classes.list[s.cut-1].Share)*s.limit {
		s.cut--
		s.since[s.cut] = now
	}
	for s.cut < len(s.classes.list) {
		share, hyst, hold := int64(s.classes.list[s.cut].Share), s.hyst, s.hold
		if share == 100 {
			// Refused only at the limit itself: below it, refusing would
			// waste room that nothing less important can take.
			hyst, hold = 0, 0
		}
		if u >= (share-hyst)*s.limit || now-s.since[s.cut] < hold {
			break
		}
		s.cut++
	}
}

// holdLeft is how long Hold keeps class i refused at least: classes are
// readmitted in order, so until the Hold of every class refused from the
// first one refused down to i has passed; with s.mu held.
func (s *WorkerShedder) holdLeft(i int, now int64) time.Duration {
	var left int64
	for j := s.cut; j <= i && j < len(s.classes.list); j++ {
		if s.classes.list[j].Share < 100 {
			left = max(left, s.since[j]+s.hold-now)
		}
	}
	return time.Duration(left)
}

// adapt moves the limit at the end of a window (see [Gradient]); with s.mu
// held.
func (s *WorkerShedder) adapt() {
	g := s.grad
	if s.count == 0 {
		return
	}
	short := max(1, s.sum/s.count)
	if s.long == 0 {
		s.long = short
	} else {
		// An exponential moving average over g.long windows: weight
		// 2/(n+1) for the newest.
		diff, n := short-s.long, g.long+1
		s.long = max(1, s.long+diff/n*2+diff%n*2/n)
	}
	if s.long/2 > short {
		s.long -= s.long / 10
	}
	if s.refused == 0 && s.peak*2000 < s.limit {
		return // the limit is not what holds the traffic back
	}
	// gradient in thousandths: Tolerance% × long / short, within [500, 1000].
	hi, lo := bits.Mul64(uint64(g.tol*10), uint64(s.long))
	grad := int64(1000)
	if hi < uint64(short) {
		if q, _ := bits.Div64(hi, lo, uint64(short)); q < 1000 {
			grad = max(500, int64(q))
		}
	}
	target := s.limit/1000*grad + s.limit%1000*grad/1000 + g.queue
	next := s.limit + (target-s.limit)*g.smooth/100
	s.limit = min(max(next, g.min), g.max)
}

// Limit returns the limit in force, in requests (rounded down, for an
// adaptive limit).
func (s *WorkerShedder) Limit() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	return s.limit / 1000
}

// InUse returns how many requests are in progress.
func (s *WorkerShedder) InUse() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse
}

// Refusing returns the Priority of the most important class being refused
// now, and false if every class is admitted (below the limit).
func (s *WorkerShedder) Refusing() (Priority, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	return Priority(s.cut), s.cut < len(s.classes.list)
}

// Class returns the Priority of the class named name.
func (s *WorkerShedder) Class(name string) (Priority, bool) { return s.classes.class(name) }

// Classes returns the classes, most important first.
func (s *WorkerShedder) Classes() []ShedClass { return s.classes.classes() }
