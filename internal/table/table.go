// Package table is the keyed store's per-shard core: a bounded map from
// string keys to small state values that evicts, when full, first the
// entries its owner reports as fresh and then the least recently used.
//
// A Table is not safe for concurrent use: the store guards each one with its
// shard's mutex. It never allocates an object per key: its entries live in
// arrays of slots, each holding the entry's state, a word with the key's
// 32-bit hash tag, its length, its offset in its segment's arena and a use
// count, and the key's first headBytes (16) bytes, so that finding a key of
// up to 16 bytes and reading its state touch the slot alone, and a longer
// key's the slot and the rest of its bytes. A slot is 24 bytes plus the
// state, so a 16-byte state takes 40-byte slots.
//
// Arenas. A key's first 16 bytes are copied into its slot and the rest, if
// any, to the end of an arena of its segment, a byte array, and the slot
// names their offset: a slot holds no pointer, so that the garbage
// collector has nothing to mark per key (for states without pointers, a
// table is a few arrays per segment to it, however many keys it holds),
// and the table keeps no reference to the caller's string. A dropped key
// leaves its bytes behind; when an arena has no room for a new key's, its
// keys' bytes are copied into the table's spare arena (see Table.room),
// which costs one pass over the segment, as a sweep does.
//
// Segments. No operation may pause for long, so no operation touches more
// than one segment's array of slots (at most segmentBytes, 32 KiB, for
// states of up to 40 bytes), apart from a doubling of the directory, which
// copies its entries. A table
// is a directory of segments in the manner of extendible hashing: the
// directory has 2^depth entries indexed by the tag's top depth bits, and a
// segment of local depth d holds every tag whose top d bits are its own
// (2^(depth-d) directory entries point at it). Each segment is an open
// addressed array with linear probing from a home slot chosen by the tag's
// bits below the top d, at most 7/8 full, that grows by up to about 1/4
// at a time, to the largest allocator size class within that (so that
// nothing of the class is wasted; the classes lie closer together than
// 1/4, so most steps are nearer 1/6; by 1/2 in a table set to
// GrowInHalves) until it reaches segmentBytes; a segment that full splits
// in two by its tags' next bit, each half sized for its entries. So memory
// per key stays between 8/7 and 10/7 of a slot (12/7 growing by halves) at
// every size (the segments being at every stage of their growth), a table
// of a few keys is one small array, and neither growth nor a split copies
// more than one segment. Arrays are allocated by the first insert; tables
// never shrink.
//
// Allocation. An insertion that grows or splits a segment, or needs a new
// arena, allocates, and an allocation may be charged a garbage
// collector's assist, and the first write to each page of fresh memory
// faults. So that none of that happens while the owner's lock is held,
// [Table.Wants] names what an insertion would allocate, [Make] allocates
// and writes it without the table, and [Table.Give] hands it back to the
// table for the insertion to take (see Reserve).
//
// Entries move when other entries are added or dropped, so a state pointer
// is valid only until the next [Table.Insert]; find an entry again by its
// key. Entries can be pinned by key so that eviction passes them by.
//
// Room. A key can only go to its own segment, so room is made there: when
// the table is full, and when the segment is full and the table's arrays
// already hold their budget (10/7 slots for every entry the table may hold),
// so that room freed in one segment cannot make the others grow without
// end. (When the table is full but the key's segment holds less than 7/8
// of its share of the entries, room is made in another segment that holds
// more than its share: see victim.) The segment first, if a sweep is due, drops every entry in it that
// is fresh (its state equals a fresh key's, so nothing is lost). A sweep
// costs one pass over the segment, so one is due once the segment has
// taken an eighth of its entries in insertions since its last. In between,
// and when a sweep frees nothing, the segment runs CLOCK (second chance): a
// hand visits its slots (in a scattered order, each once a turn), drops
// the first entry that is fresh or not referenced since the hand last
// passed it, and clears the reference bit of the others on its way. The reference bit is widened to
// a two-bit use count: a new entry starts at 1 and one used again goes to
// 3; the hand takes one off as it passes and drops entries it finds at 0.
// So every entry outlives at least one pass of its segment's hand (the hand
// walks slots in hash order, not in the order keys came, and a key just
// added must not be the next to go), a key seen only once goes before a key
// that keeps coming back, and a flood of one-off keys cycles through the
// table without pushing those out. Every segment's share of the entries is
// its share of the hash space, so dropping from the segment the key goes to
// keeps the segments' fill even. When the table is full and the segment has
// nothing to drop (it is empty, or all pinned), another segment drops one;
// when only the budget stops its growth, it grows past the budget instead.
package table

import (
	"encoding/binary"
	"math"
	"slices"
	"sync/atomic"
	"unsafe"
)

// Tag derives an entry's tag from its key's 64-bit hash (the owner hashes
// keys with a seeded hash such as hash/maphash): the hash's high 32
// bits with the lowest replaced by flag. The flag lets the owner keep two
// kinds of keys apart (raw keys and digests of long keys) even when their
// bytes are equal: Find matches tags before keys.
func Tag(h uint64, flag bool) uint32 {
	t := uint32(h>>32) &^ 1
	if flag {
		t |= 1
	}
	return t
}

// Bits of a slot's meta word below the tag. An empty slot's meta is 0.
// The use count is CLOCK's reference bit widened to two bits: 1 for a new
// entry, 3 for one used again; each pass of the hand takes one off, and
// the hand drops an entry it finds at 0.
//
// The turn bit records the parity of the hand's last turn over the entry,
// so that an entry moved (by a removal or a resize) to a slot still ahead
// of the hand is not counted down twice in one turn. A new entry takes the
// current turn's parity: it is first counted down in the next turn.
//
// The key's length takes the 7 bits above those, and its offset in its
// segment's arena the 21 between them and the tag, so that tag and length
// are matched by one comparison before any byte of the key, and a slot
// holds no pointer.
const (
	metaUsed     = 1 << 0
	useShift     = 1
	useMask      = 3 << useShift
	useNew       = 1 << useShift
	useAgain     = 3 << useShift
	metaTurn     = 1 << 3
	lenShift     = 4
	lenBits      = 7
	lenMask      = MaxKeyLen << lenShift
	offShift     = lenShift + lenBits
	offBits      = 32 - offShift
	offMask      = (1<<offBits - 1) << offShift
	tagMask      = 0xffffffff << 32
	handTurnsMax = 5 // turns that skip entries new this turn, count every use down to 0 and find it there
)

// MaxKeyLen is the longest key a Table holds: [Table.Insert] refuses a
// longer one. (The store keeps no key longer than 64 bytes.)
const MaxKeyLen = 1<<lenBits - 1

// arenaMax is the most bytes a segment's arena may hold: the offsets its
// slots can name. No segment that splits comes near it (one of the
// largest slots' segments holds 896 keys, each of at most 111 bytes past
// its head, 99 KB);
// only one at maxDepth, which grows instead of splitting, could reach it,
// and then it makes room in itself (see Table.room).
const arenaMax = 1 << offBits

// preallocKeyBytes is the arena room Preallocate gives every entry: keys
// of up to 24 bytes on average (8 past their heads) fill a preallocated
// table without a growth of any arena.
const preallocKeyBytes = 8

// minSlots is the size of a new segment's array.
const minSlots = 8

// segmentBytes is the largest array a segment grows to; one that would
// grow past it splits instead. It is the allocator's largest small size
// class, so that one operation copies at most 32 KiB, and an array is never
// a large object rounded up to whole 8 KiB pages. But a segment may always
// grow to segmentMinSlots: for large states (a sub-window counter's 60
// buckets), segments of a few dozen slots would cost more in segments and
// rounding than they save in pauses.
const (
	segmentBytes    = 32 << 10
	segmentMinSlots = 512
)

// sizeClasses are the Go allocator's size classes from 1 KiB to 32 KiB.
// An array that fills its class exactly wastes nothing, so a segment grows
// by up to about 1/4, to the size of a class (see fit). Were the allocator's
// classes to change, arrays would still be correct, only less tight.
var sizeClasses = [...]int{1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072,
	3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240,
	10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264,
	28672, 32768}

// maxDepth is the deepest a segment can split, which bounds the directory
// at 2^24 entries (a table of 2^24 segments holds about 10^10 keys). A
// segment at it (its tags' top 24 bits all equal: with a seeded hash, a
// matter of chance at any size a shard can have) grows instead.
const maxDepth = 24

// handPrime is a prime above any segment's size: the CLOCK hand moves by
// it, modulo the size, so that it visits every slot once a turn but never
// two neighbours in a row. A hand that walked slots in order would drop
// runs of neighbouring entries while new ones land anywhere, crowding the
// rest of the array into ever longer probe runs.
const handPrime = 1<<32 + 15

type slot[S any] struct {
	meta  uint64 // tag<<32 | tail offset<<offShift | key length<<lenShift | turn | use count<<useShift | metaUsed; 0 when empty
	head  head   // the key's first headBytes bytes
	state S
}

// headBytes is how many of a key's bytes its slot holds; the rest, its
// tail, lie in its segment's arena.
const headBytes = 16

// head is a key's first headBytes bytes as little-endian words, zeros past
// the key's end (the key's length, in the meta, tells a key that ends in
// zero bytes from a shorter one).
type head [2]uint64

// headOf returns key's head.
func headOf(key string) head {
	switch n := len(key); {
	case n >= headBytes:
		return head{le64(key[:8]), le64(key[8:16])}
	case n > 8:
		// The last 8 bytes, moved down past the ones the first word holds.
		return head{le64(key[:8]), le64(key[n-8:]) >> (8 * (headBytes - n))}
	}
	var b [headBytes]byte
	copy(b[:], key)
	return head{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

// le64 returns the first 8 bytes of s, which has at least 8, as a
// little-endian word: one load where the machine allows it.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// probe is what finding a key compares a slot with: the meta's tag and
// length (in the bits tagMask|lenMask pick), and the key's head.
type probe struct {
	m uint64
	h head
}

// probeOf returns key's probe; tag is its hash's.
func probeOf(key string, tag uint32) probe {
	return probe{match(key, tag), headOf(key)}
}

// match returns what a slot's meta holds of key, whose hash gave tag, in
// the bits tagMask|lenMask pick.
func match(key string, tag uint32) uint64 {
	return uint64(tag)<<32 | uint64(len(key))<<lenShift
}

// keyLen returns the length of the key a slot's meta describes, tailLen
// that of its tail (the bytes in the arena), and keyOff the tail's offset
// in its segment's arena.
func keyLen(meta uint64) int  { return int(meta & lenMask >> lenShift) }
func tailLen(meta uint64) int { return max(0, keyLen(meta)-headBytes) }
func keyOff(meta uint64) int  { return int(meta & offMask >> offShift) }

// is reports whether s, a slot of the segment whose arena is keys, holds
// key, whose probe is p: its tag, length and head first, and only then,
// for a key longer than its head, the tail's bytes in the arena.
func (s *slot[S]) is(keys []byte, key string, p *probe) bool {
	if s.meta&(tagMask|lenMask) != p.m || s.head != p.h {
		return false
	}
	if len(key) <= headBytes {
		return true
	}
	off := keyOff(s.meta)
	return string(keys[off:off+len(key)-headBytes]) == key[headBytes:]
}

// keyOf returns a copy of the key s, a slot of g, holds.
func (g *segment[S]) keyOf(s *slot[S]) string {
	n := keyLen(s.meta)
	b := make([]byte, max(n, headBytes))
	binary.LittleEndian.PutUint64(b, s.head[0])
	binary.LittleEndian.PutUint64(b[8:], s.head[1])
	off := keyOff(s.meta)
	copy(b[headBytes:], g.keys[off:off+tailLen(s.meta)])
	return string(b[:n])
}

type pin struct {
	tag uint32
	key string
}

// Stats counts what a Table has done since it was made.
type Stats struct {
	Inserts        uint64 // keys added
	Evictions      uint64 // entries dropped to make room, fresh ones included
	LossyEvictions uint64 // of those, the ones whose state was not fresh
	Sweeps         uint64 // passes over a segment dropping every fresh entry
	Splits         uint64 // segments split in two
	Compactions    uint64 // arenas whose keys were copied to make room (see room)
	Allocations    uint64 // arrays and headers the table allocated itself, not taken from a Reserve
}

// segment is one array of a table: the tags whose top depth bits are
// prefix. Its counts are 32-bit, so that its header fills a 96-byte size
// class: the collector marks every header whole, one for every few hundred
// keys.
type segment[S any] struct {
	slots  []slot[S]
	keys   []byte // its arena: the bytes of its keys' tails, at the offsets its slots hold
	end    int32  // bytes of keys used, from the start
	dead   int32  // of those, the bytes of keys dropped
	n      int32  // entries held
	growAt int32  // n at which the array grows or splits: 7/8 of it
	since  int32  // insertions since its last sweep
	idx    int32  // its place in the table's segs
	hand   int32  // CLOCK hand, a slot
	stride int32  // how far the hand moves at a time: coprime to len(slots)
	steps  int32  // slots the hand has visited this turn
	prefix uint32 // the tag's top depth bits' value
	depth  uint8  // the tag's top bits this segment is chosen by
	turn   uint8  // metaTurn or 0: the parity of the hand's current turn
}

// dirEntry is a directory entry: its segment's place in the table's segs,
// and copies of the segment's array, arena and depth, so that finding a
// key reads the directory, the array and the arena but not the segment. It
// takes half a cache line, and the collector marks its two pointers.
type dirEntry[S any] struct {
	slots *slot[S] // the array's first slot
	keys  *byte    // the arena's first byte
	n     uint32   // len(slots)
	nkeys uint32   // len(keys): at most arenaMax
	depth uint32
	idx   uint32 // the segment's place in segs
}

// array and arena return e's copies of its segment's array and arena.
func (e *dirEntry[S]) array() []slot[S] { return unsafe.Slice(e.slots, e.n) }
func (e *dirEntry[S]) arena() []byte    { return unsafe.Slice(e.keys, e.nkeys) }

// Table is one shard's bounded map. The zero Table holds nothing and admits
// nothing; call [Table.Init] first.
type Table[S any] struct {
	dir    []dirEntry[S] // 2^depth entries, by the tag's top depth bits
	segs   []*segment[S] // every segment once, in the order sweeps visit them
	depth  uint
	n      int         // entries held
	max    int         // the bound on n
	slots  int         // slots of every segment
	budget int         // slots past which a full segment makes room rather than grow
	settle bool        // Preallocate's: the budget comes down to slots when the table is first full
	rove   int         // the next segment victim looks at
	swept  *segment[S] // the segment swept last, for tests
	pins   []pin
	// spare is the arena a segment's compaction copies its keys into; the
	// arena they leave is the next spare (see room).
	spare    []byte
	arenaMax int // arenaMax; less in tests
	// res is the memory given for insertions to take (see Give).
	res Reserve[S]

	segSlots int // the most slots a segment grows to (see segmentBytes); fewer in tests
	// step is the share by which a segment's array grows: 1/2^step of
	// itself (see fit, GrowInHalves).
	step  uint8
	fresh func(s *S, now int64) bool
	Stats Stats

	// pool, if set, bounds t with other tables (see Share): t holds up to
	// floor entries of its own, and one unit of pool for each past that,
	// until the pool freezes (see Pool).
	pool  *Pool
	floor int
}

// Pool is a bound on the entries of several tables together, a store's
// shards, while they fill: each table holds up to a floor of entries of
// its own, and takes a unit of the pool for each entry past it, so that
// the tables together never hold more than their floors and the pool, and
// none makes room in itself until the pool is spent, however unevenly the
// keys spread over the tables. Its count is the one word the tables share.
//
// The first time a table finds the pool spent, the pool freezes: from then
// on each table keeps the units it holds, for good, and is bounded by its
// floor and those, as a table of its own bound is. So the tables fill to
// their bound together, and then each makes room in itself for its own
// keys, as its sweeps leave room in it: were the units of a table whose
// sweeps dropped its fresh entries to go to the others, a table that swept
// lately, holding only live entries, would have to make room (dropping
// one of them) while the one that gave its units back held fresh ones
// (TestStoreBoundUnderFlood). A unit given back in the moment the pool
// freezes is lost to the bound: the tables hold one entry fewer.
type Pool struct {
	used   atomic.Int64
	max    int64
	frozen atomic.Bool // the pool has been spent (see Pool)
	_      [40]byte    // keeps the count off its neighbours' cache lines
}

// NewPool returns a pool of max units.
func NewPool(max int) *Pool { return &Pool{max: int64(max)} }

// spent reports whether p has frozen or has no unit left: a take now
// would fail.
func (p *Pool) spent() bool { return p.frozen.Load() || p.used.Load() >= p.max }

// take takes a unit, if one is left and the pool has not frozen. Finding
// none left freezes it.
func (p *Pool) take() bool {
	if !p.spent() {
		if p.used.Add(1) <= p.max {
			return true
		}
		p.used.Add(-1)
	}
	p.frozen.Store(true)
	return false
}

// Share makes t one of the tables p bounds, holding up to floor entries
// (at least 1) without taking from p: t's own bound (Init's max) then
// sizes its arrays' budget and Preallocate, as the entries t is expected
// to hold, but no longer bounds them. Call it after Init, before the first
// Insert.
func (t *Table[S]) Share(p *Pool, floor int) {
	t.pool, t.floor = p, max(1, floor)
}

// pooled returns the units of t's pool that a table of n entries holds.
func (t *Table[S]) pooled(n int) int { return max(0, n-t.floor) }

// full reports, before an insertion, whether t must make room for it, and
// whether it took a unit of its pool for it.
func (t *Table[S]) full() (full, took bool) {
	if t.pool != nil {
		if t.n < t.floor {
			return false, false
		}
		if t.pool.take() {
			return false, true
		}
		t.freeze(t.n, false) // take refuses only a pool that has frozen
	}
	return t.n >= t.max, false
}

// freeze makes t a table of its own bound, once its pool has frozen (see
// Pool): its floor and the units it holds in an operation that began with
// n entries (and took a unit, if took), with that bound's budget if that
// is more than its own bound's (a preallocated table's comes down to its
// slots as it finds itself full, see budgetAt).
func (t *Table[S]) freeze(n int, took bool) {
	t.max = t.floor + t.pooled(n)
	if took {
		t.max++
	}
	t.budget = max(t.budget, t.growthBudget(t.max))
	t.pool = nil
}

// settlePool gives t's pool back the units that an operation which began
// with n entries (and took a unit, if took) no longer holds. Every unit is
// taken before the entry it counts is added, and given back after, so that
// the pool's count never passes its bound. Once the pool has frozen, t
// keeps them instead (see freeze).
func (t *Table[S]) settlePool(n int, took bool) {
	if t.pool == nil {
		return
	}
	if t.pool.frozen.Load() {
		t.freeze(n, took)
		return
	}
	back := t.pooled(n) - t.pooled(t.n)
	if took {
		back++
	}
	if back != 0 {
		t.pool.used.Add(-int64(back))
	}
}

// Init readies t to hold at most max entries; fresh reports whether a state
// at now is as good as the zero state. The first array is allocated by the
// first Insert, so that a table that never holds a key costs nothing beyond
// t.
func (t *Table[S]) Init(max int, fresh func(s *S, now int64) bool) {
	segSlots := segmentBytes / int(unsafe.Sizeof(slot[S]{}))
	if segSlots < segmentMinSlots {
		segSlots = segmentMinSlots
	}
	*t = Table[S]{max: max, fresh: fresh, segSlots: segSlots, step: quarterStep, arenaMax: arenaMax}
	t.budget = t.growthBudget(max)
}

// Growth steps (see Table.step, fit): by 1/4, for memory held within 10/7
// of a slot per entry; by 1/2, for fewer copies of each entry as the table
// fills. (By 1/8 would hold 9/7, and allocate a third more often as the
// table fills: each allocation is a chance for the collector to charge an
// assist or for fresh memory to fault, docs/tail.md.) Preallocate sizes
// its arrays in steps of 1/8, the finest it can use.
const (
	eighthStep  = 3
	quarterStep = 2
	halfStep    = 1
)

// GrowInHalves makes t's segments grow by half their size at a time
// rather than by a quarter, and a split's halves start with as much room:
// as the table fills, an entry is copied, and an array allocated, less
// often, for up to 12/7 of a slot per entry rather than 10/7. It is for a
// table whose insertions cost more than its memory. Call it after Init,
// before the first Insert.
func (t *Table[S]) GrowInHalves() {
	t.step = halfStep
	t.budget = t.growthBudget(t.max)
}

// growthBudget returns the slots a table of n entries may hold before a
// full segment makes room rather than grow: as many as a table whose
// every segment has just grown at 7/8 full (10/7 of a slot for every
// entry growing by 1/4, 12/7 by 1/2), and a slack of one segment, or of
// 1/16 of a slot an entry if that is less (but never less than a new
// segment's array), so that the slack of a store's many small tables does
// not add up to more than the segments themselves are allowed.
func (t *Table[S]) growthBudget(n int) int {
	return n + n/7 + n/7*8>>t.step + min(t.segSlots, max(minSlots, n/16))
}

// budgetAt returns the budget an insertion into t, holding n entries,
// goes by (see Insert), full if t must make room for it. A preallocated
// table's comes down to the slots it holds when it is first full (see
// Preallocate). A table that shares a pool that has not frozen, and holds
// more entries than its own bound (Init's), goes by the budget of the
// entries it will hold if that is more: it took a unit of the pool for the
// insertion, so the store has room, and a full segment of it grows rather
// than drop a key of its own.
func (t *Table[S]) budgetAt(n int, full bool) int {
	switch {
	case t.settle && full:
		return t.slots
	case t.pool != nil && !full && n >= t.max:
		return max(t.budget, t.growthBudget(n+1))
	}
	return t.budget
}

// Preallocate allocates at once what the table needs to hold its bound,
// so that filling it allocates nothing: a directory as deep as segments of
// at most 3/4 of a full segment's entries require, and every segment an
// array that holds its share of the bound and three standard deviations
// more (a segment's count at the bound is about binomial), so that hardly
// any segment grows or splits. It costs about the memory of a full table
// (about 1.3 slots per entry) from the start, and writes every page of it
// once, so that filling the table does not fault on fresh memory either. The budget is that and one
// segment more while the table fills, so that the few segments that stray
// past their slack grow rather than drop a live entry of their own (and,
// while it shares a Pool, its entries' budget if it holds more than its
// bound, see budgetAt); once the table is first full, it comes down to
// the slots held then.
// From then on a segment that is full makes room in itself even when the
// table is not (sweeps keep leaving a churning table a little below its
// bound, and the room they free lands in other segments as keys arrive),
// so that a preallocated table at its bound allocates only for a segment
// with nothing it may drop (every entry pinned). Call it after Init,
// before the first Insert.
func (t *Table[S]) Preallocate() {
	if t.max == 0 || len(t.dir) > 0 {
		return
	}
	limit := max(1, t.segSlots*7/8*3/4)
	var d uint
	for d < maxDepth && (t.max-1)>>d+1 > limit { // the share, rounded up
		d++
	}
	share := (t.max-1)>>d + 1
	want := share + 3*int(math.Sqrt(float64(share))) + 1       // entries under growAt
	size := fit[S](max(minSlots, want*8/7-want/8), eighthStep) // the least that holds want
	for size*7/8 < want {
		size = fit[S](size, eighthStep)
	}
	t.depth = d
	t.dir = make([]dirEntry[S], 1<<d)
	t.segs = make([]*segment[S], 1<<d)
	arena := want * preallocKeyBytes
	for i := range t.segs {
		g := &segment[S]{depth: uint8(d), prefix: uint32(i), idx: int32(i), keys: t.newArena(arena)}
		t.segs[i] = g
		t.resize(g, size)
	}
	t.spare = t.newArena(arena)
	// Every page written now, so that the insertions that fill the table
	// do not fault on them under their owner's lock (see touch).
	for _, g := range t.segs {
		touchSlots(g.slots)
		touchBytes(g.keys)
	}
	touchBytes(t.spare)
	t.budget = max(t.budget, t.slots+t.segSlots)
	t.settle = true
}

// Len returns the number of entries held.
func (t *Table[S]) Len() int { return t.n }

// Max returns the bound Init was given: the bound on Len, unless t shares
// a Pool.
func (t *Table[S]) Max() int { return t.max }

// entry returns the directory entry for tag, or nil before the first
// Insert.
func (t *Table[S]) entry(tag uint32) *dirEntry[S] {
	if len(t.dir) == 0 {
		return nil
	}
	return &t.dir[uint64(tag)>>(32-t.depth)]
}

// seg returns the segment that holds tag, or nil before the first Insert.
func (t *Table[S]) seg(tag uint32) *segment[S] {
	if e := t.entry(tag); e != nil {
		return t.segs[e.idx]
	}
	return nil
}

// home returns tag's home slot in an array of n slots chosen by the tag's
// top depth bits: the tag's bits below those, scaled to n.
func home(tag uint32, depth uint, n int) int {
	return int(uint64(uint32(uint64(tag)<<depth)) * uint64(n) >> 32)
}

func (g *segment[S]) home(tag uint32) int { return home(tag, uint(g.depth), len(g.slots)) }

// Find returns the state of key, whose hash gave tag, or nil if t does not
// hold it. It marks a found entry referenced. The pointer is valid until
// the next Insert.
func (t *Table[S]) Find(key string, tag uint32) *S {
	s := t.slotOf(key, tag)
	if s == nil {
		return nil
	}
	if s.meta&useMask != useAgain {
		s.meta |= useAgain
	}
	return &s.state
}

// Lookup is Find without marking the entry referenced.
func (t *Table[S]) Lookup(key string, tag uint32) *S {
	if s := t.slotOf(key, tag); s != nil {
		return &s.state
	}
	return nil
}

// slotOf returns key's slot, or nil.
func (t *Table[S]) slotOf(key string, tag uint32) *slot[S] {
	e := t.entry(tag)
	if e == nil {
		return nil
	}
	slots := e.array()
	i := lookup(slots, e.arena(), uint(e.depth), key, tag)
	if i < 0 {
		return nil
	}
	return &slots[i]
}

// lookup returns key's slot in g, or -1.
func (g *segment[S]) lookup(key string, tag uint32) int {
	return lookup(g.slots, g.keys, uint(g.depth), key, tag)
}

// lookup returns key's slot in slots, the array of a segment of depth whose
// arena is keys, or -1.
func lookup[S any](slots []slot[S], keys []byte, depth uint, key string, tag uint32) int {
	p := probeOf(key, tag)
	for i := home(tag, depth, len(slots)); ; {
		s := &slots[i]
		if s.meta == 0 {
			return -1
		}
		if s.is(keys, key, &p) {
			return i
		}
		if i++; i == len(slots) {
			i = 0
		}
	}
}

// Insert adds key, which t must not hold, with a zero state, making room if
// t is full (or its segment is, and the arrays hold their budget); now is
// the time fresh is asked about. It returns the new entry's state, or false
// if no entry can be dropped (every one is pinned, or the bound is 0) or
// key is longer than MaxKeyLen. The table copies the key's bytes into its
// segment's arena: it keeps no reference to key.
func (t *Table[S]) Insert(key string, tag uint32, now int64) (*S, bool) {
	if t.max == 0 || len(key) > MaxKeyLen {
		return nil, false
	}
	if len(t.dir) == 0 {
		g := t.newSegment()
		g.keys = t.newArena(arenaSize(0))
		t.dir = t.newDir(1)
		t.addSegment(g)
		t.resize(g, minSlots)
	}
	g := t.seg(tag)
	n := t.n
	full, took := t.full()
	budget := t.budgetAt(n, full)
	if t.settle && full { // a preallocated table first full
		t.budget, t.settle = budget, false
	}
	if full {
		if !t.evict(t.victim(g), now, true) {
			t.settlePool(n, took)
			return nil, false
		}
	} else if g.n >= g.growAt && t.slots >= budget {
		t.evict(g, now, false) // or else grow past the budget
	}
	for g.n >= g.growAt {
		if next := fit[S](len(g.slots), t.step); next <= t.segSlots || g.depth == maxDepth {
			t.resize(g, next)
			break
		}
		t.split(g)
		g = t.seg(tag)
	}
	tail := max(0, len(key)-headBytes)
	for !t.room(g, tail) {
		if !t.clock(g, now) { // a segment at maxDepth whose arena is full
			t.settlePool(n, took)
			return nil, false
		}
	}
	off := 0 // an empty tail's, so that it never lies past the arena's end
	if tail > 0 {
		off = int(g.end)
		g.end += int32(copy(g.keys[off:], key[headBytes:]))
	}
	i := g.place(tag)
	g.slots[i] = slot[S]{meta: match(key, tag) | uint64(off)<<offShift | uint64(g.turn) | useNew | metaUsed, head: headOf(key)}
	g.n++
	g.since++
	t.n++
	t.Stats.Inserts++
	t.settlePool(n, took)
	return &g.slots[i].state, true
}

// share returns the entries g would hold were the table's spread evenly
// over the hash space.
func (t *Table[S]) share(g *segment[S]) int32 { return int32(t.n >> g.depth) }

// victim returns the segment that makes room for a key of g in a full
// table: g, unless g holds less than 7/8 of its share and one of the next
// few segments in turn holds more than its own. Each segment's sweeps drop
// its fresh entries and give their room to the whole table, and a small
// segment sweeps the most often (see evict); were every segment to make
// room only for its own keys, the segments that sweep would shrink, the
// others would keep their fresh entries, and a shrunken segment's CLOCK
// would find only live entries to drop.
func (t *Table[S]) victim(g *segment[S]) *segment[S] {
	if sh := t.share(g); g.n >= sh-sh>>3 {
		return g
	}
	for range min(victimTries, len(t.segs)) {
		h := t.segs[t.rove]
		t.rove = (t.rove + 1) % len(t.segs)
		if h.n > t.share(h) {
			return h
		}
	}
	return g
}

// victimTries is how many segments victim looks at.
const victimTries = 4

// split replaces g by two segments one bit deeper, doubling the directory
// first if g is as deep as it.
func (t *Table[S]) split(g *segment[S]) {
	if uint(g.depth) == t.depth {
		dir := t.newDir(2 * len(t.dir))
		for i, e := range t.dir {
			dir[2*i], dir[2*i+1] = e, e
		}
		t.dir = dir
		t.depth++
	}
	d := uint(g.depth) + 1
	bit := uint64(1) << (32 - d) // the tag bit that parts the halves
	n1, bytes1 := g.halves(d)
	halves := [2]*segment[S]{t.newSegment(), t.newSegment()}
	*halves[0] = segment[S]{depth: uint8(d), prefix: g.prefix << 1, turn: g.turn, idx: g.idx}
	*halves[1] = segment[S]{depth: uint8(d), prefix: g.prefix<<1 | 1, turn: g.turn, idx: int32(len(t.segs))}
	t.segs[g.idx] = halves[0]
	t.addSegment(halves[1])
	t.slots -= len(g.slots)
	live := [2]int{int(g.end-g.dead) - bytes1, bytes1}
	for h, n := range [2]int{int(g.n) - n1, n1} {
		halves[h].resize(t.takeSlots(fit[S](max(minSlots-1, n*8/7+1), t.step)))
		halves[h].n = int32(n)
		halves[h].keys = t.newArena(arenaSize(live[h]))
		t.slots += len(halves[h].slots)
	}
	for i := range g.slots {
		if s := &g.slots[i]; s.meta != 0 {
			h := halves[s.meta>>32&bit>>(32-d)]
			h.slots[h.place(uint32(s.meta>>32))] = slot[S]{meta: h.store(g.keys, s.meta), head: s.head, state: s.state}
		}
	}
	t.recycle(g.keys)
	t.point(halves[0])
	t.point(halves[1])
	t.Stats.Splits++
}

// halves returns how many of g's entries, and how many bytes of their
// tails, go to the second half of a split of g to depth d: those whose tag
// has bit d (from the top) set.
func (g *segment[S]) halves(d uint) (n1, bytes1 int) {
	bit := uint64(1) << (32 - d)
	for i := range g.slots {
		if m := g.slots[i].meta; m != 0 && m>>32&bit != 0 {
			n1++
			bytes1 += tailLen(m)
		}
	}
	return n1, bytes1
}

// point points g's directory entries at g and its array: the run of
// 2^(depth-g.depth) entries that its prefix begins.
func (t *Table[S]) point(g *segment[S]) {
	run := 1 << (t.depth - uint(g.depth))
	first := int(g.prefix) << (t.depth - uint(g.depth))
	for i := range run {
		t.dir[first+i] = dirEntry[S]{slots: unsafe.SliceData(g.slots), keys: unsafe.SliceData(g.keys),
			n: uint32(len(g.slots)), nkeys: uint32(len(g.keys)), depth: uint32(g.depth), idx: uint32(g.idx)}
	}
}

// resize gives g an array of size slots and points its directory entries
// at it.
func (t *Table[S]) resize(g *segment[S], size int) {
	t.slots -= len(g.slots)
	g.resize(t.takeSlots(size))
	t.slots += len(g.slots)
	t.point(g)
}

// room makes room for a tail of n bytes at the end of g's arena, if it has
// none: it copies g's keys into an arena of their own size (the spare, if it
// is large enough, else a new one), leaving the bytes of the keys dropped
// behind, and the arena they leave becomes the spare. The new arena is the
// old one's size, unless the keys and n would fill more than 8/9 of it; it
// is then 5/4 of them. So a segment's keys are copied at most once for
// every eighth of them dropped, and a table whose keys come and go reuses
// its arenas rather than allocate. It reports false if g's keys and n would
// not fit in arenaMax bytes.
func (t *Table[S]) room(g *segment[S], n int) bool {
	if int(g.end)+n <= len(g.keys) {
		return true
	}
	size, ok := t.arenaFor(g, n)
	if !ok {
		return false
	}
	keys := t.spare
	if len(keys) < size {
		keys = t.newArena(size)
	} else {
		t.spare = nil
	}
	old := g.keys
	g.keys, g.end, g.dead = keys, 0, 0
	for i := range g.slots {
		if s := &g.slots[i]; s.meta != 0 {
			s.meta = g.store(old, s.meta)
		}
	}
	t.recycle(old)
	t.point(g)
	t.Stats.Compactions++
	return true
}

// arenaFor returns the size of the arena that g's keys and a tail of n
// bytes are copied into when g's arena has no room for the tail (see
// room), or false if they would not fit in arenaMax bytes.
func (t *Table[S]) arenaFor(g *segment[S], n int) (int, bool) {
	need := int(g.end-g.dead) + n
	if need > t.arenaMax {
		return 0, false
	}
	size := len(g.keys)
	if need+need/8 > size {
		size = arenaSize(need)
	}
	return size, true
}

// store copies the tail of the key that meta, a slot's of the segment
// whose arena is from, describes to the end of g's arena, and returns meta
// with the tail's new offset.
func (g *segment[S]) store(from []byte, meta uint64) uint64 {
	off, n := keyOff(meta), tailLen(meta)
	if n == 0 {
		return meta &^ offMask // at 0, as Insert puts it
	}
	copy(g.keys[g.end:], from[off:off+n])
	meta = meta&^offMask | uint64(g.end)<<offShift
	g.end += int32(n)
	return meta
}

// recycle offers an arena no segment uses any more as the spare: it is
// kept if it is larger than the spare.
func (t *Table[S]) recycle(keys []byte) {
	if len(keys) > len(t.spare) {
		t.spare = keys
	}
}

// arenaSize returns the size of a new arena for keys of n bytes: 5/4 of
// them and a few more.
func arenaSize(n int) int { return n + n/4 + 64 }

// arenaOf returns a new arena of at least size bytes, as large as the
// allocator's size class for it but not past limit.
func arenaOf(size, limit int) []byte {
	b := slices.Grow([]byte(nil), min(size, limit))
	return b[:min(cap(b), limit)]
}

// Pin keeps key's entry from being evicted until [Table.Unpin].
func (t *Table[S]) Pin(key string, tag uint32) { t.pins = append(t.pins, pin{tag, key}) }

// Unpin releases every pin.
func (t *Table[S]) Unpin() {
	clear(t.pins) // drop the keys
	t.pins = t.pins[:0]
}

func (t *Table[S]) pinned(g *segment[S], s *slot[S]) bool {
	for _, p := range t.pins {
		if pr := probeOf(p.key, p.tag); s.is(g.keys, p.key, &pr) {
			return true
		}
	}
	return false
}

// evict drops an entry of g: every fresh one if a sweep of g is due and
// finds any, otherwise the one CLOCK picks, or if g has none to drop and
// elsewhere is set, the one CLOCK picks in another segment.
func (t *Table[S]) evict(g *segment[S], now int64, elsewhere bool) bool {
	if g.since >= g.n>>3 {
		g.since = 0
		if t.sweepSeg(g, now) > 0 {
			return true
		}
	}
	if t.clock(g, now) {
		return true
	}
	if elsewhere {
		for _, h := range t.segs {
			if h != g && t.clock(h, now) {
				return true
			}
		}
	}
	return false
}

// sweepSeg drops every entry of g that is fresh at now and not pinned, and
// returns how many it dropped. It costs one pass over g.
func (t *Table[S]) sweepSeg(g *segment[S], now int64) int {
	t.Stats.Sweeps++
	t.swept = g
	dropped := 0
	for i := 0; i < len(g.slots); {
		s := &g.slots[i]
		if s.meta != 0 && t.fresh(&s.state, now) && !t.pinned(g, s) {
			t.remove(g, i, false)
			dropped++
			continue // another entry may have moved into slot i
		}
		i++
	}
	return dropped
}

// clock runs g's CLOCK hand until it drops an entry. Within five turns it
// has passed every entry new in the first, taken every unpinned entry's use
// count down to 0 and come back to it, so it fails only if every entry of
// g is pinned, or g is empty.
func (t *Table[S]) clock(g *segment[S], now int64) bool {
	if g.n == 0 {
		return false
	}
	for range handTurnsMax*len(g.slots) + 1 {
		i := int(g.hand)
		if g.hand += g.stride; int(g.hand) >= len(g.slots) {
			g.hand -= int32(len(g.slots))
		}
		if g.steps++; int(g.steps) == len(g.slots) {
			g.steps = 0
			g.turn ^= metaTurn
		}
		s := &g.slots[i]
		if s.meta == 0 || s.meta&metaTurn == uint64(g.turn) || t.pinned(g, s) {
			continue
		}
		s.meta ^= metaTurn
		if t.fresh(&s.state, now) {
			t.remove(g, i, false)
			return true
		}
		if s.meta&useMask != 0 {
			s.meta -= 1 << useShift
			continue
		}
		t.remove(g, i, true)
		return true
	}
	return false
}

// remove drops the entry at slot i of g, moving later members of its probe
// run back into the gap (so that no tombstones are needed) and clearing the
// slot left over.
func (t *Table[S]) remove(g *segment[S], i int, lossy bool) {
	if m := g.slots[i].meta; keyOff(m)+tailLen(m) == int(g.end) {
		g.end = int32(keyOff(m)) // the last tail stored: its bytes are free at once (an empty tail's are none)
	} else {
		g.dead += int32(tailLen(m))
	}
	n := len(g.slots)
	dist := func(from, to int) int { // cyclic distance
		if d := to - from; d >= 0 {
			return d
		}
		return to - from + n
	}
	hole := i
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		s := &g.slots[j]
		if s.meta == 0 {
			break
		}
		// The entry at j may fill the hole unless its home lies after the
		// hole (cyclically, in (hole, j]).
		if dist(g.home(uint32(s.meta>>32)), j) >= dist(hole, j) {
			g.slots[hole] = *s
			hole = j
		}
	}
	g.slots[hole] = slot[S]{}
	g.n--
	t.n--
	t.Stats.Evictions++
	if lossy {
		t.Stats.LossyEvictions++
	}
}

// Delete drops key's entry, if t holds it, as its owner's choice (the
// entry's state has moved elsewhere): it is not counted as an eviction. An
// entry pinned is dropped all the same.
func (t *Table[S]) Delete(key string, tag uint32) bool {
	g := t.seg(tag)
	if g == nil {
		return false
	}
	i := g.lookup(key, tag)
	if i < 0 {
		return false
	}
	t.remove(g, i, false)
	t.Stats.Evictions--
	t.settlePool(t.n+1, false)
	return true
}

// place returns the first empty slot from tag's home on.
func (g *segment[S]) place(tag uint32) int {
	i := g.home(tag)
	for g.slots[i].meta != 0 {
		if i++; i == len(g.slots) {
			i = 0
		}
	}
	return i
}

// fit returns the size of an array to hold more than least slots: about
// 1/2^step more (at least minSlots more), rounded to fill a size class, down if a
// class lies between least and that, else up.
func fit[S any](least int, step uint8) int {
	size := least + max(least>>step, minSlots)
	per := int(unsafe.Sizeof(slot[S]{}))
	if size*per < sizeClasses[0] || size*per > sizeClasses[len(sizeClasses)-1] {
		return size
	}
	i, _ := slices.BinarySearch(sizeClasses[:], size*per+1) // the first class above size
	if i > 0 && sizeClasses[i-1]/per > least {
		return sizeClasses[i-1] / per
	}
	return sizeClasses[i] / per
}

// resize moves g's entries into slots, a new array of empty slots. Each
// slot carries its tag, so no key is read or hashed again.
func (g *segment[S]) resize(slots []slot[S]) {
	old := g.slots
	g.slots = slots
	size := len(slots)
	g.growAt = int32(size * 7 / 8)
	g.hand, g.steps = 0, 0
	g.stride = int32(handPrime % uint64(size))
	for i := range old {
		if s := &old[i]; s.meta != 0 {
			g.slots[g.place(uint32(s.meta>>32))] = *s
		}
	}
}

// Each calls f for every entry held, with a copy of its key, segment after
// segment. f must not add or drop entries.
func (t *Table[S]) Each(f func(key string, s *S)) {
	for _, g := range t.segs {
		for i := range g.slots {
			if s := &g.slots[i]; s.meta != 0 {
				f(g.keyOf(s), &s.state)
			}
		}
	}
}
