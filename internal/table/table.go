// Package table is the keyed store's per-shard core: a bounded map from
// string keys to small state values that evicts, when full, first the
// entries its owner reports as fresh and then the least recently used.
//
// A Table is not safe for concurrent use: the store guards each one with its
// shard's mutex. It never allocates an object per key: it is one array of
// slots, each holding a key's string header, its state, and a word with the
// key's 32-bit hash tag and a reference bit, kept inline so that finding a
// key and reading its state touch one place in memory. The array is open
// addressed with linear probing from a home slot chosen by the tag, is at
// most 7/8 full, and grows by 1/8 at a time rather than doubling, so that
// it is always more than 7/9 full once it has grown: memory per key stays
// within 8/7 to 9/7 of a slot. The array is allocated by the first insert,
// and tables never shrink.
//
// Entries move when other entries are added or dropped, so a position is
// valid only until the next [Table.Insert]; find an entry again by its key.
// Entries can be pinned by key so that eviction passes them by.
//
// Eviction. A full table asked for room first sweeps every entry and drops
// all those that are fresh (their state equals a fresh key's, so nothing is
// lost). A sweep costs one pass over the table, so after one the table
// waits for Max/8 insertions before sweeping again; in between, and when a
// sweep frees nothing, it runs CLOCK (second chance): a hand visits the
// slots (in a scattered order, each once a turn), drops the first entry that is fresh or not referenced since the
// hand last passed it, and clears the reference bit of the others on its
// way. The reference bit is widened to a two-bit use count: a new entry
// starts at 1 and one used again goes to 3; the hand takes one off as it
// passes and drops entries it finds at 0. So every entry outlives at least
// one pass of the hand (the hand walks slots in hash order, not in the
// order keys came, and a key just added must not be the next to go), a key
// seen only once goes before a key that keeps coming back, and a flood of
// one-off keys cycles through the table without pushing those out.
package table

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
const (
	metaUsed     = 1 << 0
	useShift     = 1
	useMask      = 3 << useShift
	useNew       = 1 << useShift
	useAgain     = 3 << useShift
	metaTurn     = 1 << 3
	tagMask      = 0xffffffff << 32
	handTurnsMax = 5 // turns that skip entries new this turn, count every use down to 0 and find it there
)

// minSlots is the size of a new table's array.
const minSlots = 8

// handPrime is a prime above any table's size: the CLOCK hand moves by it,
// modulo the size, so that it visits every slot once a turn but never two
// neighbours in a row. A hand that walked slots in order would drop runs of
// neighbouring entries while new ones land anywhere, crowding the rest of
// the array into ever longer probe runs.
const handPrime = 1<<32 + 15

type slot[S any] struct {
	meta  uint64 // tag<<32 | use count<<useShift | metaUsed; 0 when empty
	key   string
	state S
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
	Sweeps         uint64 // full passes dropping every fresh entry
}

// Table is one shard's bounded map. The zero Table holds nothing and admits
// nothing; call [Table.Init] first.
type Table[S any] struct {
	slots  []slot[S]
	n      int    // entries held
	max    int    // the bound on n
	growAt int    // n at which the array grows: 7/8 of it
	hand   int    // CLOCK hand, a slot
	stride int    // how far the hand moves at a time: coprime to len(slots)
	steps  int    // slots the hand has visited this turn
	turn   uint64 // metaTurn or 0: the parity of the hand's current turn
	since  int    // insertions since the last sweep
	pins   []pin

	fresh func(s *S, now int64) bool
	Stats Stats
}

// Init readies t to hold at most max entries; fresh reports whether a state
// at now is as good as the zero state. The array is allocated by the first
// Insert, so that a table that never holds a key costs nothing beyond t.
func (t *Table[S]) Init(max int, fresh func(s *S, now int64) bool) {
	*t = Table[S]{max: max, fresh: fresh}
}

// Len returns the number of entries held.
func (t *Table[S]) Len() int { return t.n }

// Max returns the bound on Len.
func (t *Table[S]) Max() int { return t.max }

// home returns tag's home slot: tag scaled to the array's length.
func (t *Table[S]) home(tag uint32) int {
	return int(uint64(tag) * uint64(len(t.slots)) >> 32)
}

// Find returns the position of key, whose hash gave tag, or -1 if t does not
// hold it. It marks a found entry referenced.
func (t *Table[S]) Find(key string, tag uint32) int {
	i := t.Lookup(key, tag)
	if i >= 0 {
		if m := &t.slots[i].meta; *m&useMask != useAgain {
			*m |= useAgain
		}
	}
	return i
}

// Lookup is Find without marking the entry referenced.
func (t *Table[S]) Lookup(key string, tag uint32) int {
	slots := t.slots
	if len(slots) == 0 {
		return -1
	}
	want := uint64(tag) << 32
	for i := t.home(tag); ; {
		s := &slots[i]
		if s.meta == 0 {
			return -1
		}
		if s.meta&tagMask == want && s.key == key {
			return i
		}
		if i++; i == len(slots) {
			i = 0
		}
	}
}

// State returns the state at position i, valid until the next Insert.
func (t *Table[S]) State(i int) *S { return &t.slots[i].state }

// Insert adds key, which t must not hold, with a zero state, making room if
// t is full; now is the time fresh is asked about. It returns the new
// entry's position, or false if no entry can be dropped (every one is
// pinned, or the bound is 0). The table keeps the key string itself.
func (t *Table[S]) Insert(key string, tag uint32, now int64) (int, bool) {
	if t.n >= t.max && !t.evict(now) {
		return -1, false
	}
	if t.n >= t.growAt { // also true of a table not yet allocated
		t.resize(len(t.slots) + max(len(t.slots)/8, minSlots))
	}
	i := t.place(tag)
	t.slots[i] = slot[S]{meta: uint64(tag)<<32 | t.turn | useNew | metaUsed, key: key}
	t.n++
	t.since++
	t.Stats.Inserts++
	return i, true
}

// Pin keeps key's entry from being evicted until [Table.Unpin].
func (t *Table[S]) Pin(key string, tag uint32) { t.pins = append(t.pins, pin{tag, key}) }

// Unpin releases every pin.
func (t *Table[S]) Unpin() {
	clear(t.pins) // drop the keys
	t.pins = t.pins[:0]
}

func (t *Table[S]) pinned(s *slot[S]) bool {
	for _, p := range t.pins {
		if uint64(p.tag)<<32 == s.meta&tagMask && p.key == s.key {
			return true
		}
	}
	return false
}

// evict drops an entry: every fresh one if a sweep is due and finds any,
// otherwise the one CLOCK picks.
func (t *Table[S]) evict(now int64) bool {
	if t.max == 0 {
		return false
	}
	if t.since >= t.max>>3 {
		t.since = 0
		if t.sweep(now) > 0 {
			return true
		}
	}
	return t.clock(now)
}

// sweep drops every entry that is fresh at now and not pinned, and returns
// how many it dropped. It costs one pass over the table.
func (t *Table[S]) sweep(now int64) int {
	t.Stats.Sweeps++
	dropped := 0
	for i := 0; i < len(t.slots); {
		s := &t.slots[i]
		if s.meta != 0 && t.fresh(&s.state, now) && !t.pinned(s) {
			t.remove(i, false)
			dropped++
			continue // another entry may have moved into slot i
		}
		i++
	}
	return dropped
}

// clock runs the CLOCK hand until it drops an entry. Within five turns it
// has passed every entry new in the first, taken every unpinned entry's use
// count down to 0 and come back to it, so it fails only if every entry is
// pinned.
func (t *Table[S]) clock(now int64) bool {
	for range handTurnsMax*len(t.slots) + 1 {
		i := t.hand
		if t.hand += t.stride; t.hand >= len(t.slots) {
			t.hand -= len(t.slots)
		}
		if t.steps++; t.steps == len(t.slots) {
			t.steps = 0
			t.turn ^= metaTurn
		}
		s := &t.slots[i]
		if s.meta == 0 || s.meta&metaTurn == t.turn || t.pinned(s) {
			continue
		}
		s.meta ^= metaTurn
		if t.fresh(&s.state, now) {
			t.remove(i, false)
			return true
		}
		if s.meta&useMask != 0 {
			s.meta -= 1 << useShift
			continue
		}
		t.remove(i, true)
		return true
	}
	return false
}

// remove drops the entry at slot i, moving later members of its probe run
// back into the gap (so that no tombstones are needed) and clearing the
// slot left over, so that no key or state is kept alive.
func (t *Table[S]) remove(i int, lossy bool) {
	n := len(t.slots)
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
		s := &t.slots[j]
		if s.meta == 0 {
			break
		}
		// The entry at j may fill the hole unless its home lies after the
		// hole (cyclically, in (hole, j]).
		if dist(t.home(uint32(s.meta>>32)), j) >= dist(hole, j) {
			t.slots[hole] = *s
			hole = j
		}
	}
	t.slots[hole] = slot[S]{}
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
	i := t.Lookup(key, tag)
	if i < 0 {
		return false
	}
	t.remove(i, false)
	t.Stats.Evictions--
	return true
}

// place returns the first empty slot from tag's home on.
func (t *Table[S]) place(tag uint32) int {
	i := t.home(tag)
	for t.slots[i].meta != 0 {
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	return i
}

// resize moves every entry into a new array of size slots. Each slot
// carries its tag, so no key is read or hashed again.
func (t *Table[S]) resize(size int) {
	old := t.slots
	t.slots = make([]slot[S], size)
	t.growAt = size * 7 / 8
	t.hand, t.steps = 0, 0
	t.stride = int(handPrime % uint64(size))
	for i := range old {
		if s := &old[i]; s.meta != 0 {
			t.slots[t.place(uint32(s.meta>>32))] = *s
		}
	}
}

// Each calls f for every entry held, in slot order. f must not add or drop
// entries.
func (t *Table[S]) Each(f func(key string, s *S)) {
	for i := range t.slots {
		if s := &t.slots[i]; s.meta != 0 {
			f(s.key, &s.state)
		}
	}
}
