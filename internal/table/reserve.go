package table

import "unsafe"

// Want names the memory an insertion would allocate (see [Table.Wants]):
// arrays of slots by their length, arenas by the bytes asked for, segment
// headers, a directory by its length and a list of segments by its
// capacity. The zero Want names nothing.
type Want struct {
	slots    [2]int // lengths of arrays of slots; 0: none
	keys     [2]int // bytes of arenas; 0: none
	segs     int    // segment headers
	dir      int    // entries of a directory; 0: none
	list     int    // capacity of a list of segments; 0: none
	arenaMax int    // the table's arenaMax, which bounds its arenas
}

// None reports whether w names nothing.
func (w Want) None() bool { return w == Want{arenaMax: w.arenaMax} }

// Reserve is memory made ready for a table's insertions by [Make], outside
// the lock its owner guards the table with, and handed to it by
// [Table.Give]: an insertion takes from it what it needs, where the sizes
// fit, instead of allocating. Every page of it has been written once, so
// that the first writes to it do not fault either.
type Reserve[S any] struct {
	slots [2][]slot[S]
	keys  [2][]byte
	segs  [2]*segment[S]
	dir   []dirEntry[S]
	list  []*segment[S]
}

// Make allocates what w names and writes every page of it once (see
// Reserve). It touches no table: call it without the table's lock.
func Make[S any](w Want) Reserve[S] {
	var r Reserve[S]
	for i, n := range w.slots {
		if n > 0 {
			r.slots[i] = make([]slot[S], n)
			touchSlots(r.slots[i])
		}
	}
	for i, n := range w.keys {
		if n > 0 {
			r.keys[i] = arenaOf(n, w.arenaMax)
			touchBytes(r.keys[i])
		}
	}
	for i := range min(w.segs, len(r.segs)) {
		r.segs[i] = new(segment[S])
	}
	if w.dir > 0 {
		r.dir = make([]dirEntry[S], w.dir)
		touch(unsafe.Pointer(unsafe.SliceData(r.dir)), uintptr(len(r.dir))*unsafe.Sizeof(r.dir[0]))
	}
	if w.list > 0 {
		r.list = make([]*segment[S], 0, w.list)
	}
	return r
}

// pageBytes is the size of the pages that touch writes once each: the
// smallest a machine that runs Go uses.
const pageBytes = 4096

// touch writes a zero byte to every page of the n bytes at p, which hold
// no pointer that is not nil: the runtime does not zero memory fresh from
// the operating system, so the first write to each of its pages faults.
func touch(p unsafe.Pointer, n uintptr) {
	b := unsafe.Slice((*byte)(p), n)
	for i := 0; i < len(b); i += pageBytes {
		b[i] = 0
	}
	if n > 0 {
		b[n-1] = 0
	}
}

// touchSlots writes every page of a new array of slots once (see touch).
func touchSlots[S any](s []slot[S]) {
	touch(unsafe.Pointer(unsafe.SliceData(s)), uintptr(len(s))*unsafe.Sizeof(slot[S]{}))
}

// touchBytes writes every page of a new arena once (see touch).
func touchBytes(b []byte) { touch(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b))) }

// Give hands r to t, to take from in its insertions (see Reserve). What t
// already held and r replaces is dropped: a reserve holds at most two of
// each kind of array.
func (t *Table[S]) Give(r Reserve[S]) {
	for _, s := range r.slots {
		if s != nil {
			keep(&t.res.slots, s)
		}
	}
	for _, b := range r.keys {
		if b != nil {
			keep(&t.res.keys, b)
		}
	}
	for _, g := range r.segs {
		if g == nil {
			continue
		}
		for i := range t.res.segs {
			if t.res.segs[i] == nil {
				t.res.segs[i] = g
				break
			}
		}
	}
	if r.dir != nil {
		t.res.dir = r.dir
	}
	if r.list != nil {
		t.res.list = r.list
	}
}

// keep puts s in the first empty place of p, or if there is none, drops
// the first and puts s last.
func keep[E any](p *[2][]E, s []E) {
	switch {
	case p[0] == nil:
		p[0] = s
	case p[1] == nil:
		p[1] = s
	default:
		p[0], p[1] = p[1], s
	}
}

// Wants returns what an [Table.Insert] of a key of n bytes whose hash gave
// tag would allocate, beyond what t's reserve holds: so that its owner can
// let go of the table's lock, [Make] it, take the lock again and [Table.Give]
// it, for the insertion to allocate nothing under the lock. When the table
// is full and room for the key might be made in another segment than its
// own (see victim), it names the growth of the key's segment that would
// then follow, so it may name more than the insertion takes (what is left
// stays in the reserve for the next); it names less only when every entry
// of the key's segment is pinned. It changes nothing.
func (t *Table[S]) Wants(tag uint32, n int) Want {
	w := wants[S]{t: t, w: Want{arenaMax: t.arenaMax}}
	if t.max == 0 || n > MaxKeyLen {
		return Want{}
	}
	tail := max(0, n-headBytes)
	if len(t.dir) == 0 { // the first insertion: see Insert
		w.arena(arenaSize(0))
		w.directory(1)
		w.segments(1)
		w.header()
		w.array(minSlots)
		if tail > arenaSize(0) {
			w.arena(arenaSize(tail)) // a compaction (see room), to no spare
		}
		return w.w
	}
	g := t.seg(tag)
	full := t.n >= t.max
	if t.pool != nil {
		full = t.n >= t.floor && t.pool.spent()
	}
	budget := t.budgetAt(t.n, full)
	switch sh := t.share(g); {
	case full && g.n >= sh-sh>>3, !full && g.n >= g.growAt && t.slots >= budget:
		// Room is made in g (see Insert): it does not grow.
	case g.n >= g.growAt:
		if next := fit[S](len(g.slots), t.step); next <= t.segSlots || g.depth == maxDepth {
			w.array(next)
			break
		}
		// A split (see split): the halves' arenas are new, with room past
		// their keys, so no compaction follows.
		if uint(g.depth) == t.depth {
			w.directory(2 * len(t.dir))
		}
		if len(t.segs) == cap(t.segs) {
			w.segments(2 * len(t.segs))
		}
		n1, bytes1 := g.halves(uint(g.depth) + 1)
		live := [2]int{int(g.end-g.dead) - bytes1, bytes1}
		for h, n := range [2]int{int(g.n) - n1, n1} {
			w.header()
			w.array(fit[S](max(minSlots-1, n*8/7+1), t.step))
			w.arena(arenaSize(live[h]))
		}
		return w.w
	}
	if int(g.end)+tail > len(g.keys) { // a compaction (see room)
		if size, ok := t.arenaFor(g, tail); ok && len(t.spare) < size {
			w.arena(size)
		}
	}
	return w.w
}

// wants builds a Want for t, leaving out what t's reserve holds.
type wants[S any] struct {
	t *Table[S]
	w Want
	// taken marks what of t's reserve the Want already counts on.
	takenSlots, takenKeys [2]bool
	takenSegs             int
}

func (b *wants[S]) array(n int) {
	for i, s := range b.t.res.slots {
		if !b.takenSlots[i] && len(s) == n {
			b.takenSlots[i] = true
			return
		}
	}
	add(&b.w.slots, n)
}

func (b *wants[S]) arena(size int) {
	for i, k := range b.t.res.keys {
		if !b.takenKeys[i] && arenaFits(k, size, b.t.arenaMax) {
			b.takenKeys[i] = true
			return
		}
	}
	add(&b.w.keys, size)
}

func (b *wants[S]) header() {
	if held := b.t.res.segs; b.takenSegs < len(held) && held[b.takenSegs] != nil {
		b.takenSegs++
		return
	}
	b.w.segs++
}

func (b *wants[S]) directory(n int) {
	if len(b.t.res.dir) != n {
		b.w.dir = n
	}
}

func (b *wants[S]) segments(n int) {
	if cap(b.t.res.list) <= len(b.t.segs) {
		b.w.list = n
	}
}

// add puts n in the first empty place of p.
func add(p *[2]int, n int) {
	if p[0] == 0 {
		p[0] = n
	} else {
		p[1] = n
	}
}

// arenaFits reports whether b will do for an arena of size bytes: it has
// as many (or limit, if fewer), and not more than about twice as many.
func arenaFits(b []byte, size, limit int) bool {
	return len(b) >= min(size, limit) && len(b) <= 2*size+64
}

// takeSlots returns an array of n empty slots: the reserve's, if it holds
// one, else a new one.
func (t *Table[S]) takeSlots(n int) []slot[S] {
	for i, s := range t.res.slots {
		if len(s) == n {
			t.res.slots[i] = nil
			return s
		}
	}
	t.Stats.Allocations++
	return make([]slot[S], n)
}

// newArena returns an arena of at least size bytes (at most arenaMax): the
// reserve's, if it holds one that fits, else a new one (see arenaOf).
func (t *Table[S]) newArena(size int) []byte {
	for i, b := range t.res.keys {
		if b != nil && arenaFits(b, size, t.arenaMax) {
			t.res.keys[i] = nil
			return b
		}
	}
	t.Stats.Allocations++
	return arenaOf(size, t.arenaMax)
}

// newSegment returns an empty segment header: the reserve's, if it holds
// one, else a new one.
func (t *Table[S]) newSegment() *segment[S] {
	for i, g := range t.res.segs {
		if g != nil {
			t.res.segs[i] = nil
			return g
		}
	}
	t.Stats.Allocations++
	return new(segment[S])
}

// newDir returns a zeroed directory of n entries: the reserve's, if it
// holds one that long, else a new one.
func (t *Table[S]) newDir(n int) []dirEntry[S] {
	if d := t.res.dir; len(d) == n {
		t.res.dir = nil
		return d
	}
	t.Stats.Allocations++
	return make([]dirEntry[S], n)
}

// addSegment appends g to segs, in the reserve's list if segs has no room
// left and the reserve's has.
func (t *Table[S]) addSegment(g *segment[S]) {
	if len(t.segs) == cap(t.segs) {
		if l := t.res.list; cap(l) > len(t.segs) {
			t.res.list = nil
			t.segs = append(l[:0], t.segs...)
		} else {
			t.Stats.Allocations++
		}
	}
	t.segs = append(t.segs, g)
}
