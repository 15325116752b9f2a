package ratelimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strconv"
	"strings"
	"time"
)

// InFlightLimit is a limit that is not a rate: at most Limit requests of a
// key in progress at once, each holding a slot from when it is acquired
// until it is released. Build an [InFlight] from it with [NewInFlight].
type InFlightLimit struct {
	// Limit is how many requests of one key may be in progress at once,
	// from 1 to 1e15.
	Limit int64

	// MaxHold, if positive, bounds how long a slot is held: a slot not
	// released within MaxHold of its acquisition is taken back, and its
	// late release then changes nothing. It is the cure for leaks, a
	// holder that never releases (a lost handle, a goroutine stuck
	// forever): set it well above the longest a request may legitimately
	// run, since a request still running when its slot is taken back no
	// longer counts. 0, the default, holds a slot until it is released,
	// so a missing release keeps its slot, and the key's memory, for good.
	// It must be less than [MaxTime].
	MaxHold time.Duration

	// Name is reported as Decision.Policy.
	Name string
}

// Release gives back the slot an acquisition took. It is idempotent:
// calling it again, from any goroutine and concurrently, changes nothing,
// and so does calling it after [InFlightLimit].MaxHold took the slot back.
// The Release of a refused acquisition, or of one that failed, does
// nothing, so it is always safe to defer.
type Release func()

// noRelease is the Release of an acquisition that took no slot.
func noRelease() {}

// InFlight is a keyed in-flight limiter: at most Limit requests of each key
// in progress at once (see [InFlightLimit]). [InFlight.Acquire] takes a
// slot and returns the [Release] that gives it back; [InFlight.AcquireWith]
// also asks rate limits, all or nothing.
//
// Its Decisions: Allowed reports whether a slot was taken; Limit is the
// Limit; Remaining is how many slots of the key are free after this
// acquisition (0 for a refusal); Policy is the Name; At is the instant on
// the limiter's clock. An in-flight limit cannot know when a request in
// progress will end, so RetryAfter is 0 on a refusal, meaning unknown: a
// slot frees as soon as any request of the key ends. Window, ResetAfter and
// Delay are 0: the limit is not a quota over time.
//
// Memory. A key with nothing in flight holds no memory: its entry goes when
// its last slot is released. A key in progress costs an entry (a small
// struct, a channel and a map slot) and 16 bytes a slot held, its Release
// included; and its key string (a key longer than
// [MaxKeyLen] is kept as its digest, as a [Store] keeps it), so memory
// follows what is in progress, not how many keys have been seen. Slots
// that MaxHold took back are dropped when their key is next used, and in a
// pass over a shard each time it has doubled in size since the last one,
// so that leaked keys never pile up. Without MaxHold, a slot never released
// is a leak: always call the Release, with defer.
//
// An InFlight is safe for concurrent use; acquisitions of one key are
// linearizable. It starts no goroutines and needs no Close. The zero
// InFlight is not usable; build one with [NewInFlight].
type InFlight struct {
	limit  int64
	hold   int64 // MaxHold in ns; 0: none
	pol    policy
	clock  Clock
	seed   maphash.Seed
	mask   uint64
	shards []inflightShard
}

// inflightShard is one shard of an InFlight: its keys behind a timeLock,
// whose clamp makes every slot's expiry move forwards with its acquisitions.
type inflightShard struct {
	tl   timeLock
	keys map[string]*inflightEntry
	// swept is the number of keys after the last sweep: a sweep runs when
	// the shard has twice as many (see sweep).
	swept int
	_     [64]byte // keeps neighbouring shards' locks off each other's cache lines
}

// inflightEntry is one key in progress.
//
// gate serialises the acquisitions of the key (a channel of one token, so
// that waiting for it can be given up with a context). An acquisition
// holds it from before it counts the free slots until it has taken one or
// decided not to, which is what makes AcquireWith exact: no other
// acquisition of the key can take the slot while the rate limits are
// asked. Releases do not take it: they only ever free slots, so a free slot
// seen by the gate's holder stays free.
//
// Everything else is guarded by the shard's lock. slots holds the slots in
// acquisition order, so that their ids and their expiries both increase:
// a release finds its slot by binary search, and slots past their MaxHold
// are a prefix. users counts the acquisitions between taking a reference
// to the entry and finishing; the entry is dropped when it has neither
// users nor slots.
type inflightEntry struct {
	key   string
	gate  chan struct{}
	slots []inflightSlot
	next  uint64 // the id of the next slot taken
	users int
}

// inflightSlot is one slot held: its id within its entry, and when MaxHold
// takes it back (MaxTime for never).
type inflightSlot struct {
	id    uint64
	until int64
}

// NewInFlight validates l and returns an [InFlight] for it. A Limit out of
// range or a negative or too long MaxHold is an error matching
// [ErrInvalidRule] (a [*RuleError]). Of the options, [WithClock] sets the
// clock MaxHold is measured on and [WithShards] the number of independently
// locked shards (an out-of-range count is an error matching
// [ErrInvalidOption]); the others do not apply to it.
func NewInFlight(l InFlightLimit, opts ...Option) (*InFlight, error) {
	switch {
	case l.Limit < 1 || l.Limit > maxCount:
		return nil, &RuleError{Rule: "InFlightLimit", Field: "Limit", Reason: "must be from 1 to 1e15, got " + strconv.FormatInt(l.Limit, 10)}
	case l.MaxHold < 0 || l.MaxHold >= MaxTime:
		return nil, &RuleError{Rule: "InFlightLimit", Field: "MaxHold", Reason: "must be 0 (no bound) or positive and less than MaxTime, got " + l.MaxHold.String()}
	}
	o := buildOptions(opts)
	_, n, err := storeShape(o.store)
	if err != nil {
		return nil, err
	}
	return &InFlight{
		limit:  l.Limit,
		hold:   int64(l.MaxHold),
		pol:    policy{name: l.Name, limit: l.Limit},
		clock:  o.clock,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]inflightShard, n),
	}, nil
}

// Acquire takes a slot for key if one is free, at once: it never waits for
// one. The Decision says whether it did (see [InFlight] for its fields);
// the Release gives the slot back, and does nothing for a refusal. The
// error is always nil; it is there for the shape every acquisition shares.
func (f *InFlight) Acquire(key string) (Release, Decision, error) {
	return f.acquire(context.Background(), key, nil, 0)
}

// AcquireContext is [InFlight.Acquire] for callers that hold a context: it
// returns ctx's error, taking nothing, if ctx has ended, or ends while the
// acquisition waits for another acquisition of the same key to finish
// (one asking a slow rate limit; see [InFlight.AcquireWith]).
func (f *InFlight) AcquireContext(ctx context.Context, key string) (Release, Decision, error) {
	return f.acquire(ctx, key, nil, 0)
}

// AcquireWith takes a slot for key only if rate also admits cost for key,
// all or nothing: a request that rate refuses takes no slot, and one
// refused a slot spends nothing from rate, which is then not asked at all.
// rate is any keyed limiter (a [Store], a [Composite], [Plans]), asked with
// CheckContext and ctx if it is a [ContextChecker], else with Check. It
// keeps its own semantics: an admission spends as its Check does (and a
// [LeakyBucket]'s Delay is the caller's to wait, holding the slot), and it
// is the caller's to [Store.Refund] if it likes, with the Decision's At.
//
// How it is exact: the acquisitions of one key take turns, and the turn
// lasts from counting the free slots to taking one. A free slot seen at the
// start of a turn cannot be taken by another acquisition, and releases
// only free more, so once rate admits, the slot is certain: nothing is
// taken and given back, and no concurrent request of the key can see a
// slot held for a request that rate then refuses. The price is that
// acquisitions of one key wait for each other's rate check; those of other
// keys do not.
//
// The Decision is rate's when rate was asked, admitted or not (so its
// RetryAfter is rate's exact wait, and the HTTP fields describe the rate
// limit); when no slot was free it is the in-flight refusal, rate not
// having been asked, so a cost that rate would reject is then refused
// rather than an error. Errors:
// rate's, with rate's Decision and no slot taken (a cost that rate can
// never admit is one, matching [ErrInvalidCost] or
// [ErrCostExceedsCapacity]); ctx's, if it ends before the turn comes; and
// an error for a nil rate. The one error that comes with a slot is rate's
// matching [ErrDegraded] when its failure policy admitted (a Redis store
// failing open, or its fallback): that Decision decides the rate, never
// the slot, so the slot is taken as for any admission, and the Release
// must be called as for one; a degraded refusal takes none.
func (f *InFlight) AcquireWith(ctx context.Context, key string, rate KeyedLimiter, cost Units) (Release, Decision, error) {
	if isNil(rate) {
		return noRelease, f.pol.decision(), errNilRate
	}
	return f.acquire(ctx, key, rate, cost)
}

// errNilRate is AcquireWith's error for a nil rate limiter.
var errNilRate = fmt.Errorf("%w: InFlight.AcquireWith given a nil rate limiter; use Acquire for the in-flight limit alone", ErrInvalidRule)

// InUse returns how many slots key holds now, slots past MaxHold not
// counted.
func (f *InFlight) InUse(key string) int64 {
	key, sh := f.shardOf(key)
	now := sh.tl.lock(clampTime(f.clock.Now()))
	defer sh.tl.unlock()
	e := sh.keys[key]
	if e == nil {
		return 0
	}
	e.expire(now)
	n := int64(len(e.slots))
	f.drop(sh, e)
	return n
}

// Len returns how many keys the limiter holds an entry for: keys with a
// slot held or an acquisition under way, and keys whose slots MaxHold took
// back that have not been dropped yet.
func (f *InFlight) Len() int {
	n := 0
	for i := range f.shards {
		sh := &f.shards[i]
		sh.tl.mu.Lock()
		n += len(sh.keys)
		sh.tl.unlock()
	}
	return n
}

// Limit returns the most slots a key may hold.
func (f *InFlight) Limit() int64 { return f.limit }

// Clock returns the clock MaxHold is measured on.
func (f *InFlight) Clock() Clock { return f.clock }

// shardOf returns the key as the limiter keeps it and its shard. A key
// longer than MaxKeyLen is kept as its SHA-256 digest, padded past
// MaxKeyLen bytes so that no key kept as it is can share its slots.
func (f *InFlight) shardOf(key string) (string, *inflightShard) {
	if len(key) > MaxKeyLen {
		key = digestKey(key) + longKeyPad
	}
	h := maphash.String(f.seed, key)
	return key, &f.shards[h&f.mask]
}

// longKeyPad pads a digest (32 bytes) to MaxKeyLen+1 bytes.
var longKeyPad = strings.Repeat("\x00", MaxKeyLen+1-sha256.Size)

// acquire is every acquisition: rate nil for the in-flight limit alone.
func (f *InFlight) acquire(ctx context.Context, key string, rate KeyedLimiter, cost Units) (Release, Decision, error) {
	if err := ctx.Err(); err != nil {
		return noRelease, f.pol.decision(), err
	}
	kept, sh := f.shardOf(key)

	// Take a reference to the key's entry, then its turn.
	sh.tl.mu.Lock()
	e := sh.keys[kept]
	if e == nil {
		if sh.keys == nil {
			sh.keys = make(map[string]*inflightEntry)
		}
		e = &inflightEntry{key: kept, gate: make(chan struct{}, 1)}
		sh.keys[kept] = e
	}
	e.users++
	sh.tl.unlock()
	defer f.leave(sh, e)

	select {
	case e.gate <- struct{}{}:
	default:
		select {
		case e.gate <- struct{}{}:
		case <-ctx.Done():
			return noRelease, f.pol.decision(), ctx.Err()
		}
	}
	defer func() { <-e.gate }()

	now := sh.tl.lock(clampTime(f.clock.Now()))
	e.expire(now)
	free := f.limit - int64(len(e.slots))
	if free <= 0 {
		sh.tl.unlock()
		d := f.pol.decision()
		d.At = time.Duration(now)
		return noRelease, d, nil
	}

	var (
		d       Decision
		rateErr error // rate's, for an admission its failure policy made
	)
	if rate != nil {
		// rate is asked without the shard's lock: the turn alone keeps
		// the free slot free.
		sh.tl.unlock()
		var err error
		if cc, ok := rate.(ContextChecker); ok {
			d, err = cc.CheckContext(ctx, key, cost)
		} else {
			d, err = rate.Check(key, cost)
		}
		// An admission rate's failure policy made (an error matching
		// ErrDegraded, Allowed set) decides the rate and takes a slot
		// like any other: a request goes on only with one.
		if !d.Allowed || (err != nil && !errors.Is(err, ErrDegraded)) {
			return noRelease, d, err
		}
		rateErr = err
		now = sh.tl.lock(clampTime(f.clock.Now()))
	}
	until := int64(MaxTime)
	if f.hold > 0 {
		until = min(now+f.hold, int64(MaxTime))
	}
	id := e.next
	e.next++
	e.slots = append(e.slots, inflightSlot{id: id, until: until})
	sh.tl.unlock()
	if rate == nil {
		d = f.pol.decision()
		d.Allowed = true
		d.Remaining = free - 1
		d.At = time.Duration(now)
	}
	return func() { f.release(sh, e, id) }, d, rateErr
}

// expire drops the slots past their MaxHold at now, with the shard
// locked.
func (e *inflightEntry) expire(now int64) {
	n := 0
	for n < len(e.slots) && e.slots[n].until <= now {
		n++
	}
	if n > 0 {
		e.slots = append(e.slots[:0], e.slots[n:]...)
	}
}

// release gives back slot id of e, if e still holds it.
func (f *InFlight) release(sh *inflightShard, e *inflightEntry, id uint64) {
	sh.tl.mu.Lock()
	i := sort.Search(len(e.slots), func(i int) bool { return e.slots[i].id >= id })
	held := i < len(e.slots) && e.slots[i].id == id
	if held {
		e.slots = append(e.slots[:i], e.slots[i+1:]...)
		f.drop(sh, e)
	}
	sh.tl.unlock()
}

// leave ends an acquisition's use of e, dropping e from its shard if no
// other acquisition uses it and no slot is held; it may then sweep the
// shard.
func (f *InFlight) leave(sh *inflightShard, e *inflightEntry) {
	sh.tl.mu.Lock()
	defer sh.tl.unlock()
	e.users--
	f.drop(sh, e)
	if len(sh.keys) > max(2*sh.swept, 64) {
		f.sweep(sh)
	}
}

// drop removes e from its shard if it holds nothing and is not in use.
func (f *InFlight) drop(sh *inflightShard, e *inflightEntry) {
	if e.users == 0 && len(e.slots) == 0 && sh.keys[e.key] == e {
		delete(sh.keys, e.key)
	}
}

// sweep takes back every slot of the shard past its MaxHold and drops the
// entries left empty, with the shard locked. It runs when the shard has
// twice as many keys as after the last sweep, so its cost per acquisition
// is constant on average, and a shard never holds more than about twice
// the keys that have a slot held or an acquisition under way.
func (f *InFlight) sweep(sh *inflightShard) {
	if f.hold > 0 {
		now := sh.tl.advance(clampTime(f.clock.Now()))
		for _, e := range sh.keys {
			e.expire(now)
			f.drop(sh, e)
		}
	}
	sh.swept = len(sh.keys)
}
