package ratelimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit/internal/table"
)

// Sizing defaults and limits of a [Store].
const (
	// DefaultMaxKeys is the bound of a store built without [WithMaxKeys]:
	// one million keys, one slot each and a copy of each key's bytes (see
	// [Store]; docs/tail.md measures the bytes per key),
	// enough for the distinct clients a busy service sees in a while, small
	// enough that a flood of made-up keys cannot take the process down.
	DefaultMaxKeys = 1_000_000

	// MaxKeyLen is the longest key a store keeps as it is. A longer key is
	// replaced by its SHA-256 digest, so that no key costs the store more
	// than MaxKeyLen bytes, however long it is.
	MaxKeyLen = 64

	// maxStoreKeys bounds WithMaxKeys, so that at most 1024 shards keep
	// every shard within maxShardKeys.
	maxStoreKeys = 1 << 40
	// maxShards bounds WithShards.
	maxShards = 1 << 16
	// minShardKeys is the fewest keys a shard is given when the shard count
	// is chosen by default, so that eviction in a small store still picks
	// among enough entries to approximate least-recently-used.
	minShardKeys = 256
	// boundShardKeys is the keys of its bound for which a store takes one
	// shard by default, up to boundShards shards: docs/tail.md measures
	// the tail of a million keys in 256 shards against 8.
	boundShardKeys = 4096
	boundShards    = 1024
	// maxShardKeys keeps every shard's table well within the 2^24 segments
	// its directory can address (internal/table's maxDepth): about 2^21
	// segments of a few hundred keys.
	maxShardKeys = 1 << 30
)

// ErrInvalidOption is returned by [NewStore] for an option whose value is
// out of range, such as WithMaxKeys(0). The error returned wraps it with the
// option's name and value.
var ErrInvalidOption = errors.New("ratelimit: invalid option")

// storeOptions are the options only [NewStore] reads. Zero fields mean the
// default; the set flags tell a zero passed on purpose (an error) from none.
type storeOptions struct {
	maxKeys, shards       int
	maxKeysSet, shardsSet bool
	prealloc              bool
}

// WithMaxKeys bounds a [Store] to at most n keys; it must be from 1 to
// 2^40. Without it a store holds at most [DefaultMaxKeys]. A store never
// holds more than n entries: when full, it first drops keys whose state is
// as good as a fresh key's, then the least recently used (see [Store]).
// [New] ignores this option.
func WithMaxKeys(n int) Option {
	return func(o *options) { o.store.maxKeys, o.store.maxKeysSet = n, true }
}

// WithShards sets how many independently locked shards a [Store] spreads
// its keys over; n is rounded up to a power of two and must be from 1 to
// 65536. Without it a store uses four per CPU ([runtime.GOMAXPROCS]), or
// one for every 4,096 keys of its bound if that is more (up to 1024: 256
// for the default bound of a million), rounded up to a power of two, but
// never so many that a shard would get fewer than 256 of the store's keys. More
// shards mean less waiting on a lock between goroutines, and a shorter
// tail when many new keys arrive (a check rarely waits for a shard whose
// holder the machine has interrupted; docs/tail.md measures 256 shards of
// a million keys against 8). The shards share the bound as the store
// fills: each holds up to 7/8 of its share of MaxKeys of its own and takes
// room for more from a count they share (once the store is first full,
// each keeps the room it holds then, and makes room for its own keys), so
// that a store fills to its bound before any shard drops a key, however
// many shards it has, unless a shard got fewer than
// 7/8 of its share of the keys: with 4,096 keys a shard, as a store of a
// large bound has by default, that is 8 standard deviations below its
// share; with 256, the fewest a shard gets by default, 2. Each shard costs
// its lock, its counters and an empty directory from the start, whether or
// not it ever holds a key (docs/tail.md has the bytes), so 65536 shards
// cost megabytes before the first check; its arrays of keys are allocated
// as keys arrive.
// [New] ignores this option.
func WithShards(n int) Option {
	return func(o *options) { o.store.shards, o.store.shardsSet = n, true }
}

// WithPreallocation makes a [Store] allocate, when it is built, the memory
// for its whole bound (each segment sized for its share of the bound and
// three standard deviations more, and arenas for keys of up to 24 bytes
// on average, whose first 16 bytes lie in their slots) instead of segment
// by segment as keys arrive, so that hardly any Check allocates as the
// store fills or once it is full, as new keys take the place of old ones:
// only a segment whose keys stray past that slack grows, rarely, near the
// bound, and longer keys grow an arena now and then until the arenas fit
// them. That leaves the garbage collector almost
// nothing to do on the store's account, and hardly any Check waits for a
// segment's growth or split (see [Store]; docs/tail.md has the memory and
// the latencies). Every page of the memory is written once when the store
// is built, so that the checks that fill it do not fault on fresh memory.
// The memory is taken whether or not keys ever come, so
// size the bound with it: it grows in proportion to the bound, however
// large. Each store of a [Plans] or [Composite] built with it preallocates too, a
// whole bound each. [New] and [NewInFlight] ignore this option.
func WithPreallocation() Option {
	return func(o *options) { o.store.prealloc = true }
}

// Store is a keyed limiter: one allowance per key, every key under the same
// rule, for any of the rules. Check has exactly the single-key
// semantics of [Limiter.Check] for each key while the store holds it (for
// a clock that steps back, see Time below); a key it does not hold starts
// full, as a fresh key does.
//
// Time. A check reads the clock once, before it takes the lock of its
// key's shard, and decides at the later of that reading and the latest
// instant any check of the shard has decided at, so that no key sees time
// go back. A single-key limiter ([New]) and a store in Redis clamp per key
// instead, to the key's own latest instant: keeping each key's instant
// would cost 8 bytes a key, only for a clock that misbehaves. The two
// decide alike, field for field, unless the clock steps back below the
// shard's latest instant (a [ManualClock] set back, a clock that is not
// monotonic). Then every key of the shard is decided at that instant until
// the clock passes it again, so a key whose own latest check was earlier,
// or that is checked for the first time, is decided later than alone, by
// at most the step. Which keys share a shard is up to a seeded hash; with
// [WithShards](1) all do. [SystemClock] never steps back: with it the only
// difference is for checks that race for a shard's lock, whose readings
// may reach it a few nanoseconds out of order.
//
// A Store is safe for concurrent use, and checks on one key are
// linearizable. It starts no goroutines and needs no Close. The zero Store
// is not usable; build one with [NewStore].
//
// Bound. A store never holds more than its bound ([WithMaxKeys],
// [DefaultMaxKeys] by default). When it needs room it first drops keys
// whose state is as good as a fresh key's, which loses nothing, then a key
// not checked lately (CLOCK, an approximation of least recently used under
// which keys checked again and again stay and one-off keys go first).
// Dropping a partly spent key hands it a fresh allowance when it returns:
// [StoreStats].LossyEvictions counts those; a store whose count grows is
// too small for its traffic. Its shards share the bound, so a key is
// dropped only once the store as a whole is full (see [WithShards] for the
// exception).
//
// Memory. A key costs one slot of its shard's table, a word of hash tag,
// key length, the place of the key's tail in its segment's arena and
// bookkeeping, the key's first 16 bytes, and the rule's state (16 bytes
// for the token bucket, GCRA, the leaky bucket, the fixed window and the
// sliding counter, 24 for a sliding counter whose Limit is over 2,147,483;
// a sliding log's state also points at its log), the slack of an
// open-addressed table, and a copy of the key's bytes past its first 16 in
// the arena: so checking a key of up to 16 bytes that the store holds
// reads its slot and none of the arena. No pointer per key, so that
// however many keys a store holds, the garbage collector has only its
// arrays to mark (BenchmarkStoreMemory and docs/tail.md have the bytes per
// key and the collector's times).
// A shard's table is a directory of segments, each an array of at most 32
// KiB allocated as keys arrive, and an arena of its keys' tails: a segment
// grows by up to about 1/4 at a time and splits in two when it would pass 32 KiB,
// and an arena is compacted as its keys are dropped, so that no check copies
// more than one segment under its shard's lock, however many keys the store
// holds (docs/tail.md has the latencies). A [Store.Check] whose key's
// insertion would allocate (a growth, a split, a new arena) lets go of the
// shard's lock, allocates and writes the memory once, and takes the lock
// again, so that no other check of the shard waits while the garbage
// collector charges the allocation an assist or the first writes to fresh
// memory fault. CheckWithin and Wait, a [Composite]'s checks, and a
// [Plans]' plan of layers or a key's move hold their shards while they
// insert, and allocate under the lock. [WithPreallocation] allocates
// everything when the store is built instead, and writes it once then.
type Store struct {
	core keyedStore
	obs  Observer // nil: none
}

// StoreStats is a snapshot of a [Store]'s counters, each read from every
// shard in turn (not all at one instant).
type StoreStats struct {
	// Policy, Limit and Window are the store's rule's, as its Decisions
	// report them (Policy is a plan's name for a rule of a [Plans] without
	// a Name): with Keys and MaxKeys, what a metric of the store needs.
	Policy string
	Limit  int64
	Window time.Duration

	Keys           int    // keys held now (never above MaxKeys)
	MaxKeys        int    // the bound on Keys
	Shards         int    // the number of shards
	Inserts        uint64 // keys added (a key's first check, or its first after it was dropped)
	Evictions      uint64 // keys dropped to make room, fresh ones included
	LossyEvictions uint64 // of those, keys that were partly spent: they start again fresh
	Sweeps         uint64 // passes over a segment of a full shard dropping every fresh key in it
}

// NewStore validates rule and the options and returns a [Store] for it. A
// malformed rule is an error matching [ErrInvalidRule], an option out of
// range one matching [ErrInvalidOption]. The store holds no keys and
// allocates its tables as keys arrive, or, with [WithPreallocation], all at
// once now.
func NewStore(rule Rule, opts ...Option) (*Store, error) {
	if isNil(rule) {
		return nil, nilRuleError("rule")
	}
	core, err := newKeyedStore(rule, opts)
	if err != nil {
		return nil, err
	}
	return &Store{core: core, obs: buildOptions(opts).obs}, nil
}

// newKeyedStore validates a non-nil rule and the options and builds the
// store behind a [Store] or a [Composite] layer.
func newKeyedStore(rule Rule, opts []Option) (keyedStore, error) {
	b, err := rule.bind()
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	if _, _, err := storeShape(o.store); err != nil {
		return nil, err
	}
	return b.newStore(o), nil
}

// Check asks to spend cost for key at the store's current time, with the
// same results and errors as [Limiter.Check]. An invalid cost is rejected
// before the key is looked at, and never adds it to the store. Checking an
// existing key does not allocate.
//
// The store copies the bytes of a key it adds and keeps no reference to
// the string: a key that is a slice of a larger string, or a string made
// with package unsafe over a buffer that is later reused, needs no cloning.
// A key longer than [MaxKeyLen] bytes is replaced by its SHA-256 digest
// (kept apart from ordinary keys, so no two distinct keys share an
// allowance), which costs a hash and one small allocation per Check.
func (s *Store) Check(key string, cost Units) (Decision, error) {
	// Kept this small, so that it inlines: the observer is told in check.
	return s.core.check(key, cost)
}

// CheckContext is [Store.Check] for callers that hold a context: it
// returns ctx's error, spending nothing, if ctx has already ended, and
// otherwise decides as Check does (a Store never blocks). It makes a Store
// a [ContextChecker].
func (s *Store) CheckContext(ctx context.Context, key string, cost Units) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return s.core.policy().decision(), err
	}
	return s.core.check(key, cost)
}

// CheckWithin is [Store.Check] for a request that may wait at most maxDelay
// for its turn: it admits cost for key only if the request would go on
// within maxDelay (a [LeakyBucket]'s Delay; every other rule's requests go
// on at once), and otherwise spends nothing and returns a denial whose
// RetryAfter is exactly when the same request would be admitted within
// maxDelay if nothing else arrived. A maxDelay < 0 is taken as 0.
func (s *Store) CheckWithin(key string, cost Units, maxDelay time.Duration) (Decision, error) {
	if d, err := checkCost(cost, s.core.capacity(), s.core.policy()); err != nil {
		return d, err
	}
	layers := []compositeLayer{{store: s.core}}
	return checkWithin(layers, 1, s.core.clock(), key, int64(cost), maxDelay, s.obs)
}

// Clock returns the clock the store reads, and that Wait sleeps on.
func (s *Store) Clock() Clock { return s.core.clock() }

// Len returns the number of keys the store holds.
func (s *Store) Len() int { return s.core.stats().Keys }

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats { return s.core.stats() }

// keyed is what every keyed limiter in this package offers, whatever its
// algorithm: a [Store]'s core, and each layer of a [Composite].
type keyed interface {
	check(key string, cost Units) (Decision, error)
	stats() StoreStats
	// capacity and policy are the rule's, for checkCost.
	capacity() int64
	policy() *policy
	// clock is the clock the store reads and Wait sleeps on.
	clock() Clock
}

// keyedStore is a store built around one algorithm, seen without its state
// type: the keyed limiter, and the shard locking a composite needs to
// decide on several keys at once, all or nothing (see tryLayers):
//
//  1. prepare every key (outside any lock) and read the time once;
//  2. lockShard the shards involved in one fixed order (layer after layer,
//     each layer's key in exactly one shard), agree on the latest time any
//     returns, and raiseShard that instant in every shard locked;
//  3. acquire each key's entry in its locked shard;
//  4. stepAt(stepLook) on every entry and, if all admit, stepAt
//     (stepCheck) on every entry;
//  5. unlockShard every shard locked.
//
// Entries acquired stay in the store until their shard is unlocked: a later
// acquire in the same shard never evicts them (it may move them, so they
// are found again by key). A key acquired and then denied keeps a zero
// (fresh) entry, which the store drops first when it needs room.
type keyedStore interface {
	keyed
	// holds reports whether the store has an entry for key (for tests).
	holds(key string) bool
	// spinning reports whether a shard is marked as held by an insertion
	// (for tests: see storeShard.hold).
	spinning() bool
	// allocations returns how many arrays and headers the shards' tables
	// have allocated themselves, under their locks (for tests: see
	// storeShard.ready).
	allocations() uint64
	// prepare digests a long key and hashes it. No lock is needed.
	prepare(key string) storeKey
	// shardIndex is the shard a prepared key lives in.
	shardIndex(k storeKey) int
	// lockShard locks shard i and clamps now to the shard's latest time,
	// recording it; it returns the clamped time.
	lockShard(i int, now int64) int64
	// markShard marks shard i, which the caller holds, as held by an
	// insertion until unlockShard (see storeShard.hold).
	markShard(i int)
	// peekShard locks shard i and returns now clamped to the shard's
	// latest time, without recording it (for a look: see Store.Peek).
	peekShard(i int, now int64) int64
	// raiseShard records now as shard i's latest time if it is later; the
	// caller holds the shard's lock.
	raiseShard(i int, now int64)
	// unlockShard releases every entry acquired in shard i and unlocks it.
	// It returns the keys the shard dropped to make room since it was
	// locked, if the store has an Observer, for the caller to pass to
	// evicted once it holds no lock.
	unlockShard(i int) evictions
	// evicted tells the store's Observer of evictions.
	evicted(e evictions)
	// acquire finds k's entry in its locked shard, or adds a fresh one,
	// evicting as Check does; the entry is pinned (it will not be evicted)
	// until unlockShard. It returns false if the shard has no room left
	// that is not pinned (more keys in one shard at once than 7/8 of its
	// share of MaxKeys, and the store full).
	acquire(k storeKey, now int64) bool
	// stepAt runs the rule's step of mode m on k's acquired entry, with its
	// shard locked. A look at a key the store does not hold steps a fresh
	// state, adding nothing.
	stepAt(k storeKey, now, cost int64, m stepMode) Decision

	// The parts a rule set ([Plans]) needs to move keys between stores,
	// each with k's shard locked:
	//
	// id orders stores for locking several at once: shards are locked in
	// increasing id order (the layers of a Composite have increasing ids).
	id() uint64
	// has reports whether the store holds k.
	has(k storeKey) bool
	// holdsSpent reports whether the store holds k in a state that is not
	// as good as a fresh one at now (a fresh entry may be dropped at any
	// time: a key must fare the same with it or without it).
	holdsSpent(k storeKey, now int64) bool
	// take removes k's entry and returns the milli-units it had spent at
	// now (rounded up) and the instant it would be whole again (see
	// migrator); ok is false if the store did not hold k.
	take(k storeKey, now int64) (spent, whole int64, ok bool)
	// refundAt gives back up to cost of what k's entry was admitted at at
	// (see refund.go); a key the store does not hold gives nothing.
	refundAt(k storeKey, now, at, cost int64) int64
	// settleAt settles k's entry from charged to actual (see
	// [Store.Settle]) and returns the cost as settled.
	settleAt(k storeKey, now, charged, actual int64, at time.Duration) int64
	// setSpent makes k's acquired entry a state with x milli-units spent
	// at now and whole again by until (see Migration), or a fresh one if x
	// <= 0 or until <= now.
	setSpent(k storeKey, now, x, until int64)
	// checkHeld is plan bp's check of key in its one store, of rule set g
	// of p (see Plans.checkHeld): for a valid cost, with the key's shard
	// locked, if p still holds g and the store holds the key (something
	// spent or a record naming bp, if g.shared), or the key is new to the
	// rule set (p's records have none of it, and their lock is free: then
	// a record of bp is added, and the key), it decides cost as a
	// Composite of this one store would, committing it if admitted, or,
	// if bp counts refusals (see builtPlan.counts), as the store's Check
	// would, with bp's name for a rule without one, and tells p's
	// Observer; ok is false, with nothing done, otherwise. The store
	// hashes the key with the seed of p's records (see options.seed).
	checkHeld(key string, cost Units, p *Plans, g *planGen, bp *builtPlan) (d Decision, ok bool)
	// countsRefused reports whether the rule counts refused cost
	// (CountRefused), as the store's Check does.
	countsRefused() bool
	// heldAt returns what a state that setSpent made with x (0 < x <=
	// the capacity) at at, whole by until, has in use at now, given no
	// new spending.
	heldAt(at, x, until, now int64) int64
}

// storeKey is a key prepared for a store: the key itself or, for a key
// longer than MaxKeyLen, its digest; its hash; and its tag in the table.
type storeKey struct {
	key string
	h   uint64
	tag uint32
}

// storeShape returns the bound and the shard count for the options.
func storeShape(o storeOptions) (maxKeys, shards int, err error) {
	maxKeys = DefaultMaxKeys
	if o.maxKeysSet {
		if o.maxKeys < 1 || o.maxKeys > maxStoreKeys {
			return 0, 0, fmt.Errorf("%w: WithMaxKeys(%d): must be from 1 to 2^40", ErrInvalidOption, o.maxKeys)
		}
		maxKeys = o.maxKeys
	}
	if o.shardsSet {
		if o.shards < 1 || o.shards > maxShards {
			return 0, 0, fmt.Errorf("%w: WithShards(%d): must be from 1 to 65536", ErrInvalidOption, o.shards)
		}
		shards = o.shards
	} else {
		shards = min(4*runtime.GOMAXPROCS(0), maxShards)
		shards = max(shards, min(maxKeys/boundShardKeys, boundShards))
	}
	shards = 1 << bits.Len(uint(shards-1)) // round up to a power of two
	floor := 1                             // the fewest keys a shard may get
	if !o.shardsSet {
		floor = minShardKeys
	}
	for shards > 1 && maxKeys/shards < floor {
		shards >>= 1
	}
	for maxKeys/shards >= maxShardKeys {
		shards <<= 1
	}
	return maxKeys, shards, nil
}

// storeShard is one shard: a table behind a timeLock.
//
// Keys are spread over a power-of-two number of shards by a hash seeded at
// random for each store (hash/maphash; a Plans' stores share the seed of
// its records), so no one can aim keys at one shard. Each shard has its own lock and its own clamp on time: the clock
// is read before the lock is taken, and inside it a reading earlier than
// the latest the shard has used is taken as that latest instant, so every
// key sees time only move forwards. The shards share the store's bound
// (see newStoreCore); eviction within a shard is the table's
// (internal/table explains CLOCK and its sweeps of fresh keys).
type storeShard[S any] struct {
	tl timeLock
	// spin is whether a check waiting for the lock may spin at all: not
	// when the store was built with GOMAXPROCS 1, where the holder cannot
	// run while another goroutine spins.
	spin bool
	// inserting is set while a hold of the lock adds a key, which may
	// grow, split or sweep a segment, or moves one between a rule set's
	// stores (see lockAll), and from the end of a hold that added a key
	// to the end of the next hold, which looks its own key up first (see
	// hold and release).
	inserting atomic.Bool
	added     bool // the last hold of the lock added a key
	marked    bool // this hold set inserting, and release clears it
	t         table.Table[S]
	// seenEv and seenLossy are t.Stats' eviction counts when last
	// reported to the store's Observer.
	seenEv, seenLossy uint64
	_                 [64]byte // keeps neighbouring shards' locks off each other's cache lines
}

// hold takes the shard's lock for a check (or a composite's turn) that
// read now, and returns now clamped (see timeLock). A check that finds the
// lock held by another's insertion spins until the insertion is over
// rather than park: an insertion may hold the lock for tens of
// microseconds (it may grow, split or sweep a segment), and a parked
// goroutine is woken only some hundreds of microseconds after the lock is
// free on a busy machine. So that a check that arrives while the holder is
// still looking its key up spins too, a hold that follows one that added a
// key counts as an insertion from the start (it marks the shard): new keys
// come in runs (a store filling, a flood of one-off keys). Any other
// holder is waited for as the mutex does (a short spin, then parking),
// which keeps the checks of one hot key from handing the lock to each
// other's core at every check; under a flood of new keys into one shard
// they do hand it over, a cost measured in docs/tail.md. Every hold ends
// with release.
func (sh *storeShard[S]) hold(now int64) int64 {
	sh.wait()
	now = sh.tl.advance(now)
	if sh.added {
		sh.added = false
		sh.mark()
	}
	return now
}

// wait takes the shard's lock, spinning while its holder is marked as
// inserting (see hold).
func (sh *storeShard[S]) wait() {
	if sh.tl.mu.TryLock() {
		return
	}
	if f := lockWaits.Load(); f != nil {
		start := time.Now()
		locked := sh.contend()
		(*f)(time.Since(start), locked)
		return
	}
	sh.contend()
}

// contend takes the shard's lock, found held: it spins while the holder is
// marked as inserting, then waits as the mutex does. It reports whether it
// came to the mutex's wait (which spins a little, then parks).
func (sh *storeShard[S]) contend() bool {
	for i := 0; sh.spin && i < insertSpins && sh.inserting.Load(); i++ {
		if sh.tl.mu.TryLock() {
			return false
		}
	}
	sh.tl.mu.Lock()
	return true
}

// ready readies the shard, whose lock the caller holds and which does not
// hold k, to add k without allocating under the lock: if the insertion
// would allocate (a segment's growth or split, a new arena), it lets go of
// the lock, allocates what the table wants and writes each of its pages
// once (table.Make), takes the lock again and gives it to the table. So a
// collection's assist charged to the allocation, or a page fault on fresh
// memory, stops no other check of the shard. It returns now clamped again
// (see hold) and k's state if another check added k meanwhile, else nil.
func (sh *storeShard[S]) ready(k storeKey, now int64) (int64, *S) {
	sh.mark() // an insertion begins (see hold)
	w := sh.t.Wants(k.tag, len(k.key))
	if w.None() {
		return now, nil
	}
	sh.added = true // so that the holds in between count as insertions (see hold)
	sh.release()
	var start time.Time
	f := insertAllocs.Load()
	if f != nil {
		start = time.Now()
	}
	r := table.Make[S](w)
	if f != nil {
		(*f)(time.Since(start))
	}
	now = sh.hold(now)
	sh.t.Give(r)
	return now, sh.t.Find(k.key, k.tag)
}

// lockWaits, if set (only tests set it), is told of every hold of a
// shard's lock that found it held, once the lock is taken: how long the
// hold waited for it, and whether it came to the mutex's wait (see
// contend). It runs with the lock held.
var lockWaits atomic.Pointer[func(wait time.Duration, locked bool)]

// insertAllocs, if set (only tests set it), is told of every allocation
// an insertion makes outside its shard's lock (see ready), once it is made:
// how long table.Make took. It runs without the lock.
var insertAllocs atomic.Pointer[func(time.Duration)]

// adding records, with the lock held, that this hold adds a key, and marks
// the shard if the hold has not yet.
func (sh *storeShard[S]) adding() {
	sh.added = true
	sh.mark()
}

// mark marks the shard as held by an insertion, once per hold.
func (sh *storeShard[S]) mark() {
	if !sh.marked {
		sh.marked = true
		sh.inserting.Store(true)
	}
}

// release clears the shard's mark, if this hold set it and added no key,
// and unlocks. A hold that added a key leaves the mark set for the next
// hold to take over (see hold), so that a check waiting for the lock
// keeps spinning while the lock passes from one insertion to the next,
// rather than find the mark clear in the moment between the next hold
// taking the lock and marking it, and park.
func (sh *storeShard[S]) release() {
	if sh.marked {
		sh.marked = false
		if !sh.added {
			sh.inserting.Store(false)
		}
	}
	sh.tl.unlock()
}

// insertSpins bounds a check's spinning on an insertion (see
// storeShard.hold): 2^17 tries, meant to last longer than a growth, split
// or sweep of a segment takes (docs/tail.md measures both).
// Then it parks: the insertion's goroutine may have been descheduled.
const insertSpins = 1 << 17

// evictions returns, with the lock held, the evictions made since the last
// call, to report once the lock is released. A key that a Plans moves out
// of the table (Delete) is not evicted: the table does not count it.
func (sh *storeShard[S]) evictions() evictions {
	ev, lossy := sh.t.Stats.Evictions-sh.seenEv, sh.t.Stats.LossyEvictions-sh.seenLossy
	sh.seenEv, sh.seenLossy = sh.t.Stats.Evictions, sh.t.Stats.LossyEvictions
	return evictions{n: ev - lossy, lossy: lossy}
}

// storeCore is the store for an algorithm A with state S.
type storeCore[S any, A algorithm[S]] struct {
	alg     A
	capMil  int64   // alg.capacity(), read once: no call on the hot path
	pol     *policy // alg.policy()
	clk     Clock
	obs     Observer // told of evictions; nil: none
	label   string   // the policy reported: pol.name, else the plan's name
	seed    maphash.Seed
	mask    uint64
	maxKeys int
	shards  []storeShard[S]
	ident   uint64
	// refused is whether the rule counts refused cost (CountRefused), which
	// a Composite's check does not: its checks look before they commit.
	refused bool
}

// storeIDs numbers stores in the order they are built (see keyedStore.id).
var storeIDs atomic.Uint64

func newStoreCore[S any, A algorithm[S]](alg A, o *options) *storeCore[S, A] {
	maxKeys, n, err := storeShape(o.store)
	if err != nil {
		panic(err) // NewStore validated the options
	}
	c := &storeCore[S, A]{
		alg:     alg,
		capMil:  alg.capacity(),
		pol:     alg.policy(),
		clk:     o.clock,
		obs:     o.obs,
		label:   alg.policy().name,
		seed:    seedOf(o),
		mask:    uint64(n - 1),
		maxKeys: maxKeys,
		shards:  make([]storeShard[S], n),
		ident:   storeIDs.Add(1),
	}
	if c.label == "" {
		c.label = o.label
	}
	if r, ok := any(alg).(interface{ countsRefused() bool }); ok {
		c.refused = r.countsRefused()
	}
	fresh := alg.fresh
	spin := runtime.GOMAXPROCS(0) > 1
	// The shards share the bound as the store fills: each holds up to 7/8
	// of its share of its own, and the rest of the bound is a pool any
	// shard may take from (see table.Pool), so that no shard makes room
	// while the store has some (unless a shard holds less than 7/8 of its
	// share, 8 standard deviations below it with 4,096 keys a shard). Once
	// the store is first full the pool freezes, and each shard keeps what
	// it holds as a bound of its own, so that the room a shard's sweeps
	// free stays with it: given to the others, it would leave a shard that
	// swept lately dropping live keys while they hold fresh ones.
	floor := maxKeys/n - maxKeys/n/8
	var pool *table.Pool
	if n > 1 {
		pool = table.NewPool(maxKeys - floor*n)
	}
	for i := range c.shards {
		share := maxKeys / n
		if i < maxKeys%n {
			share++
		}
		c.shards[i].t.Init(share, fresh)
		if pool != nil {
			c.shards[i].t.Share(pool, floor)
		}
		c.shards[i].spin = spin
		if o.store.prealloc {
			c.shards[i].t.Preallocate()
		}
	}
	return c
}

// check is Store.Check. It tells the store's Observer, if it has one, of
// the keys dropped to make room and of the decision, once the lock is
// released.
func (c *storeCore[S, A]) check(key string, cost Units) (Decision, error) {
	if cost <= 0 || int64(cost) > c.capMil {
		return checkCost(cost, c.capMil, c.pol)
	}
	k := c.prepare(key)
	now := clampTime(c.clk.Now())
	sh := &c.shards[k.h&c.mask]
	now = sh.hold(now)
	p := sh.t.Find(k.key, k.tag)
	if p == nil {
		now, p = sh.ready(k, now)
	}
	var ev evictions
	if p == nil {
		// Every shard holds at least one key and nothing is pinned outside
		// a composite's hold on the lock, so there is always room.
		sh.adding()
		p, _ = sh.t.Insert(k.key, k.tag, now)
		if c.obs != nil {
			ev = sh.evictions()
		}
	}
	d := c.alg.step(p, now, int64(cost), stepCheck)
	sh.release()
	if c.obs != nil {
		if ev.n|ev.lossy != 0 {
			c.evicted(ev)
		}
		c.obs.Decided(d, cost, outcomeOf(&d))
	}
	return d, nil
}

func (c *storeCore[S, A]) evicted(e evictions) {
	if e.n > 0 {
		c.obs.Evicted(c.label, e.n, false)
	}
	if e.lossy > 0 {
		c.obs.Evicted(c.label, e.lossy, true)
	}
}

func (c *storeCore[S, A]) stats() StoreStats {
	st := StoreStats{Policy: c.label, Limit: c.pol.limit, Window: c.pol.window, MaxKeys: c.maxKeys, Shards: len(c.shards)}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.tl.mu.Lock()
		st.Keys += sh.t.Len()
		ts := sh.t.Stats
		sh.tl.unlock()
		st.Inserts += ts.Inserts
		st.Evictions += ts.Evictions
		st.LossyEvictions += ts.LossyEvictions
		st.Sweeps += ts.Sweeps
	}
	// The shards' counts are read one after another while they share the
	// bound (see newStoreCore), and room one shard gives back another may
	// take before it is read: the sum may pass the bound that no instant
	// does.
	st.Keys = min(st.Keys, st.MaxKeys)
	return st
}

func (c *storeCore[S, A]) spinning() bool {
	for i := range c.shards {
		if c.shards[i].inserting.Load() {
			return true
		}
	}
	return false
}

func (c *storeCore[S, A]) allocations() uint64 {
	var n uint64
	for i := range c.shards {
		sh := &c.shards[i]
		sh.tl.mu.Lock()
		n += sh.t.Stats.Allocations
		sh.tl.unlock()
	}
	return n
}

func (c *storeCore[S, A]) holds(key string) bool {
	k := c.prepare(key)
	sh := &c.shards[k.h&c.mask]
	sh.tl.mu.Lock()
	defer sh.tl.unlock()
	return sh.t.Lookup(k.key, k.tag) != nil
}

func (c *storeCore[S, A]) clock() Clock              { return c.clk }
func (c *storeCore[S, A]) capacity() int64           { return c.capMil }
func (c *storeCore[S, A]) policy() *policy           { return c.pol }
func (c *storeCore[S, A]) shardIndex(k storeKey) int { return int(k.h & c.mask) }

func (c *storeCore[S, A]) prepare(key string) storeKey { return prepareKey(c.seed, key) }

// prepareKey digests a long key and hashes it with seed: how stores and a
// Plans' records find a key.
func prepareKey(seed maphash.Seed, key string) storeKey {
	long := len(key) > MaxKeyLen
	if long {
		key = digestKey(key)
	}
	h := maphash.String(seed, key)
	return storeKey{key: key, h: h, tag: table.Tag(h, long)}
}

// seedOf returns the seed of a store built with o: the seed o names, or a
// new one.
func seedOf(o *options) maphash.Seed {
	if o.seed != nil {
		return *o.seed
	}
	return maphash.MakeSeed()
}

func (c *storeCore[S, A]) lockShard(i int, now int64) int64 { return c.shards[i].hold(now) }

func (c *storeCore[S, A]) markShard(i int) { c.shards[i].mark() }

func (c *storeCore[S, A]) raiseShard(i int, now int64) { c.shards[i].tl.advance(now) }

func (c *storeCore[S, A]) unlockShard(i int) evictions {
	sh := &c.shards[i]
	sh.t.Unpin()
	var ev evictions
	if c.obs != nil {
		ev = sh.evictions()
	}
	sh.release()
	return ev
}

func (c *storeCore[S, A]) acquire(k storeKey, now int64) bool {
	sh := &c.shards[k.h&c.mask]
	if sh.t.Find(k.key, k.tag) == nil {
		sh.adding()
		if _, ok := sh.t.Insert(k.key, k.tag, now); !ok {
			return false
		}
	}
	sh.t.Pin(k.key, k.tag)
	return true
}

func (c *storeCore[S, A]) stepAt(k storeKey, now, cost int64, m stepMode) Decision {
	t := &c.shards[k.h&c.mask].t
	s := t.Lookup(k.key, k.tag)
	if s == nil {
		// Only a look (Peek) steps a key it has not acquired: a key the
		// store does not hold is a fresh one.
		var fresh S
		if m.commits() {
			m = stepPeek
		}
		return c.alg.step(&fresh, now, cost, m)
	}
	return c.alg.step(s, now, cost, m)
}

func (c *storeCore[S, A]) id() uint64 { return c.ident }

func (c *storeCore[S, A]) has(k storeKey) bool {
	return c.shards[k.h&c.mask].t.Lookup(k.key, k.tag) != nil
}

func (c *storeCore[S, A]) holdsSpent(k storeKey, now int64) bool {
	s := c.shards[k.h&c.mask].t.Lookup(k.key, k.tag)
	return s != nil && !c.alg.fresh(s, now)
}

func (c *storeCore[S, A]) take(k storeKey, now int64) (spent, whole int64, ok bool) {
	t := &c.shards[k.h&c.mask].t
	s := t.Lookup(k.key, k.tag)
	if s == nil {
		return 0, 0, false
	}
	spent, whole = c.alg.spentAt(s, now), c.alg.wholeAt(s, now)
	t.Delete(k.key, k.tag)
	return spent, whole, true
}

func (c *storeCore[S, A]) setSpent(k storeKey, now, x, until int64) {
	s := c.shards[k.h&c.mask].t.Lookup(k.key, k.tag)
	if x <= 0 || until <= now {
		var fresh S
		*s = fresh
		return
	}
	c.alg.withSpent(s, now, x, until)
}

func (c *storeCore[S, A]) checkHeld(key string, units Units, p *Plans, g *planGen, bp *builtPlan) (Decision, bool) {
	cost := int64(units)
	if cost <= 0 || cost > c.capMil {
		return Decision{}, false
	}
	k, recs := c.prepare(key), &p.records
	sh := &c.shards[k.h&c.mask]
	now := sh.hold(clampTime(c.clk.Now()))
	s := sh.t.Find(k.key, k.tag)
	if s == nil {
		now, s = sh.ready(k, now)
	}
	if p.gen.Load() != g {
		sh.release()
		return Decision{}, false
	}
	var ev evictions
	if s == nil {
		if !recs.add(k, planRecord{plan: bp.id, lineage: bp.lineage}, now) {
			sh.release()
			return Decision{}, false
		}
		sh.adding()
		s, _ = sh.t.Insert(k.key, k.tag, now) // nothing is pinned: always room
		if c.obs != nil {
			ev = sh.evictions()
		}
	} else if g.shared && c.alg.fresh(s, now) {
		// An entry that holds nothing spent may be one a move left: the
		// key's record may name another plan it must move from (see
		// lacking). A key whose record names bp stays; the others (and a
		// key whose record's shard is busy) take the slow path, which
		// moves them. One that holds something spent stays, as lockPlan
		// decides, with no look at the record: no state of the key's own
		// outlives its record (see Plans.Reset).
		if id, found, _ := recs.look(k); !found || id != bp.id {
			sh.release()
			return Decision{}, false
		}
	}
	var d Decision
	if bp.counts || !c.refused {
		d = c.alg.step(s, now, cost, stepCheck) // commits what it admits, and a refusal it counts
	} else if d = c.alg.step(s, now, cost, stepLook); d.Allowed {
		d = c.alg.step(s, now, cost, stepCheck)
	}
	sh.release()
	if ev.n|ev.lossy != 0 {
		c.evicted(ev)
	}
	bp.name.fill(&d)
	if p.obs != nil {
		p.obs.Decided(d, units, outcomeOf(&d))
	}
	return d, true
}

func (c *storeCore[S, A]) countsRefused() bool { return c.refused }

func (c *storeCore[S, A]) heldAt(at, x, until, now int64) int64 {
	return heldAt[S](c.alg, at, x, until, now)
}

// digestKey returns the SHA-256 digest of a long key, hashed in pieces so
// that a huge key is never copied whole.
func digestKey(key string) string {
	h := sha256.New()
	var buf [512]byte
	for len(key) > 0 {
		n := copy(buf[:], key)
		h.Write(buf[:n])
		key = key[n:]
	}
	return string(h.Sum(buf[:0]))
}
