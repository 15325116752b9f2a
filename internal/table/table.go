// Package table is the keyed store's per-shard core: a bounded map from
// string keys to small state values that evicts, when full, first the
// entries its owner reports as fresh and then the least recently used.
//
// A Table is not safe for concurrent use: the store guards each one with its
// shard's mutex. It never allocates an object per key. Its memory is
//
//   - an index of 8-byte slots (a power of two of them, at most 4/5 full),
//     each a 32-bit tag taken from the key's hash and the entry's position;
//   - the entries themselves, key string header plus state, in chunks of
//     ChunkLen allocated as the table grows and kept when it shrinks;
//   - two bits per entry: "in use" and "referenced" (for CLOCK).
//
// An entry never moves once placed: a position handed out by [Table.Find]
// or [Table.Insert] stays valid until that entry is removed, and entries
// can be pinned so that eviction passes them by.
//
// Eviction. A full table asked for room first sweeps every entry and drops
// all those that are fresh (their state equals a fresh key's, so nothing is
// lost). A sweep costs one pass over the table, so after one the table
// waits for Max/8 insertions before sweeping again; in between, and when a
// sweep frees nothing, it runs CLOCK (second chance): a hand walks the
// entries in position order, drops the first one that is fresh or not
// referenced since the hand last passed it, and clears the reference bit of
// the others on its way. New entries start unreferenced, so a key seen once
// is dropped before a key seen twice: a flood of one-off keys cycles through
// the table without pushing out the keys that keep coming back.
package table

import (
	"hash/maphash"
	"math/bits"
)

// ChunkLen is the number of entries allocated at a time.
const (
	chunkBits = 9
	ChunkLen  = 1 << chunkBits
)

// minIndex is the smallest index, in slots.
const minIndex = 8

// Tag derives an entry's tag from its key's 64-bit hash: the hash's high 32
// bits with the lowest replaced by flag. The high bits of the tag pick the
// entry's home slot in the index; the flag does not, so that the table can
// find an entry's slot again from its key's hash alone. The flag lets the
// owner keep two kinds of keys apart (raw keys and digests of long keys)
// even when their bytes are equal: Find matches tags before keys.
func Tag(h uint64, flag bool) uint32 {
	t := uint32(h>>32) &^ 1
	if flag {
		t |= 1
	}
	return t
}

type entry[S any] struct {
	key   string
	state S
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
	index  []uint64 // tag<<32 | position+1; 0 is an empty slot
	shift  uint32   // 32 - log2(len(index)): a tag's home slot is tag>>shift
	chunks [][]entry[S]
	used   []uint64 // a bit per position: holds an entry
	ref    []uint64 // a bit per position: referenced since the hand passed
	pins   []int32

	n      int // entries held
	hi     int // positions handed out: [0, hi); positions n..hi-1 worth are holes
	max    int // the bound on n
	hand   int // CLOCK hand, a position
	holeAt int // where the search for a hole resumes
	since  int // insertions since the last sweep

	seed  maphash.Seed
	fresh func(s *S, now int64) bool
	Stats Stats
}

// Init readies t to hold at most max entries. seed must be the seed the
// owner hashes keys with (the table rehashes keys it drops), and fresh
// reports whether a state at now is as good as the zero state.
func (t *Table[S]) Init(max int, seed maphash.Seed, fresh func(s *S, now int64) bool) {
	*t = Table[S]{max: max, seed: seed, fresh: fresh}
	t.index = make([]uint64, minIndex)
	t.shift = 32 - uint32(bits.TrailingZeros(minIndex))
}

// Len returns the number of entries held.
func (t *Table[S]) Len() int { return t.n }

// Max returns the bound on Len.
func (t *Table[S]) Max() int { return t.max }

// Find returns the position of key, whose hash gave tag, or -1 if t does not
// hold it. It marks a found entry referenced.
func (t *Table[S]) Find(key string, tag uint32) int32 {
	p := t.Lookup(key, tag)
	if p >= 0 {
		if w := &t.ref[p>>6]; *w&(1<<(p&63)) == 0 {
			*w |= 1 << (p & 63)
		}
	}
	return p
}

// Lookup is Find without marking the entry referenced.
func (t *Table[S]) Lookup(key string, tag uint32) int32 {
	mask := uint32(len(t.index) - 1)
	for i := tag >> t.shift; ; i = (i + 1) & mask {
		s := t.index[i]
		if s == 0 {
			return -1
		}
		if uint32(s>>32) == tag {
			p := int32(uint32(s)) - 1
			if t.chunks[p>>chunkBits][p&(ChunkLen-1)].key == key {
				return p
			}
		}
	}
}

// State returns the state at position p, valid until the entry is removed.
func (t *Table[S]) State(p int32) *S {
	return &t.chunks[p>>chunkBits][p&(ChunkLen-1)].state
}

// Key returns the key at position p.
func (t *Table[S]) Key(p int32) string {
	return t.chunks[p>>chunkBits][p&(ChunkLen-1)].key
}

// Insert adds key, which t must not hold, with a zero state, making room if
// t is full; now is the time fresh is asked about. It returns the new
// entry's position, or false if no entry can be dropped (every one is
// pinned, or the bound is 0). The table keeps the key string itself.
func (t *Table[S]) Insert(key string, tag uint32, now int64) (int32, bool) {
	p, ok := t.room(now)
	if !ok {
		return -1, false
	}
	t.chunks[p>>chunkBits][p&(ChunkLen-1)].key = key
	t.used[p>>6] |= 1 << (p & 63)
	t.n++
	t.since++
	t.Stats.Inserts++
	if t.n*5 > len(t.index)*4 {
		t.grow()
	}
	t.place(tag, p)
	return p, true
}

// Pin keeps the entry at p from being evicted until [Table.Unpin].
func (t *Table[S]) Pin(p int32) { t.pins = append(t.pins, p) }

// Unpin releases every pin.
func (t *Table[S]) Unpin() { t.pins = t.pins[:0] }

// Pinned reports whether the entry at p is pinned.
func (t *Table[S]) Pinned(p int32) bool {
	for _, q := range t.pins {
		if q == p {
			return true
		}
	}
	return false
}

// room returns a free position: a hole, a never-used position, or the
// position of an entry it drops.
func (t *Table[S]) room(now int64) (int32, bool) {
	if t.n < t.hi {
		return t.hole(), true
	}
	if t.hi < t.max {
		p := t.hi
		t.hi++
		if p&(ChunkLen-1) == 0 {
			size := min(ChunkLen, t.max-p)
			t.chunks = append(t.chunks, make([]entry[S], size))
			words := (size + 63) / 64
			t.used = append(t.used, make([]uint64, words)...)
			t.ref = append(t.ref, make([]uint64, words)...)
		}
		return int32(p), true
	}
	if t.max == 0 {
		return -1, false
	}
	if t.since >= t.max>>3 {
		t.since = 0
		if t.sweep(now) > 0 {
			return t.hole(), true
		}
	}
	return t.clock(now)
}

// hole returns the first position not in use, searching on from where the
// last search stopped. There must be one (n < hi).
func (t *Table[S]) hole() int32 {
	w := t.holeAt >> 6
	free := ^t.used[w] &^ (1<<(t.holeAt&63) - 1)
	for {
		if free != 0 {
			p := w<<6 | bits.TrailingZeros64(free)
			if p < t.hi {
				t.holeAt = p + 1
				if t.holeAt >= t.hi {
					t.holeAt = 0
				}
				return int32(p)
			}
		}
		w++
		if w<<6 >= t.hi {
			w = 0
		}
		free = ^t.used[w]
	}
}

// sweep drops every entry that is fresh at now and not pinned, and returns
// how many it dropped. It costs one pass over the table.
func (t *Table[S]) sweep(now int64) int {
	t.Stats.Sweeps++
	dropped := 0
	for w, word := range t.used {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			p := int32(w<<6 | b)
			if t.fresh(t.State(p), now) && !t.Pinned(p) {
				t.remove(p, false)
				dropped++
			}
		}
	}
	return dropped
}

// clock runs the CLOCK hand until it drops an entry, and returns its
// position. Within two turns every unpinned entry has lost its reference
// bit, so it fails only if every entry is pinned.
func (t *Table[S]) clock(now int64) (int32, bool) {
	for range 2*t.hi + 1 {
		p := int32(t.hand)
		t.hand++
		if t.hand >= t.hi {
			t.hand = 0
		}
		w, bit := p>>6, uint64(1)<<(p&63)
		if t.used[w]&bit == 0 || t.Pinned(p) {
			continue
		}
		if t.fresh(t.State(p), now) {
			t.remove(p, false)
			return p, true
		}
		if t.ref[w]&bit != 0 {
			t.ref[w] &^= bit
			continue
		}
		t.remove(p, true)
		return p, true
	}
	return -1, false
}

// remove drops the entry at p: from the index (finding its slot from its
// key's hash), then its key and state, so that neither is kept alive.
func (t *Table[S]) remove(p int32, lossy bool) {
	e := &t.chunks[p>>chunkBits][p&(ChunkLen-1)]
	mask := uint32(len(t.index) - 1)
	i := Tag(maphash.String(t.seed, e.key), false) >> t.shift
	for uint32(t.index[i]) != uint32(p)+1 {
		i = (i + 1) & mask
	}
	// Backward-shift deletion: move later members of the probe run into
	// the gap, so no tombstones are needed.
	for j := i; ; {
		j = (j + 1) & mask
		s := t.index[j]
		if s == 0 {
			break
		}
		home := uint32(s>>32) >> t.shift
		if (j-home)&mask < (j-i)&mask {
			continue // its home is between the gap and j: it stays
		}
		t.index[i] = s
		i = j
	}
	t.index[i] = 0
	*e = entry[S]{}
	t.used[p>>6] &^= 1 << (p & 63)
	t.ref[p>>6] &^= 1 << (p & 63)
	t.n--
	t.Stats.Evictions++
	if lossy {
		t.Stats.LossyEvictions++
	}
}

// place records tag at position p in the index.
func (t *Table[S]) place(tag uint32, p int32) {
	mask := uint32(len(t.index) - 1)
	i := tag >> t.shift
	for t.index[i] != 0 {
		i = (i + 1) & mask
	}
	t.index[i] = uint64(tag)<<32 | uint64(uint32(p)+1)
}

// grow doubles the index. Every slot carries its tag, so no key is read.
func (t *Table[S]) grow() {
	old := t.index
	t.index = make([]uint64, 2*len(old))
	t.shift--
	for _, s := range old {
		if s != 0 {
			t.place(uint32(s>>32), int32(uint32(s))-1)
		}
	}
}

// Each calls f for every entry held, in position order.
func (t *Table[S]) Each(f func(key string, s *S)) {
	for w, word := range t.used {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			p := int32(w<<6 | b)
			e := &t.chunks[p>>chunkBits][p&(ChunkLen-1)]
			f(e.key, &e.state)
		}
	}
}
