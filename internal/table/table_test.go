package table

import (
	"encoding/binary"
	"hash/fnv"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// hash is a deterministic stand-in for the store's seeded hash, so that
// failures replay.
func hash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// The state in these tests is the instant the entry becomes fresh.
func expired(s *int64, now int64) bool { return *s <= now }

// consistent checks the table's structure: the directory points every
// tag's top bits at the one segment that holds it, every entry is found
// through its probe run from its home, no empty slot lies between an entry
// and its home, and the counts agree; every entry's key bytes lie in its
// segment's arena, below its end and apart from every other's, the arena's
// dropped bytes are what the keys held leave of it, and the spare arena is
// no segment's.
func consistent(t require.TestingT, tb *Table[int64]) {
	if len(tb.dir) == 0 {
		require.Zero(t, tb.n, "a table with no array holds nothing")
		require.Empty(t, tb.segs)
		return
	}
	require.Len(t, tb.dir, 1<<tb.depth)
	seen := map[*segment[int64]]int{}
	for i, e := range tb.dir {
		require.Less(t, int(e.idx), len(tb.segs), "directory entry %d names no segment", i)
		g := tb.segs[e.idx]
		require.NotNil(t, g)
		require.Equal(t, len(g.slots), len(e.array()), "directory entry %d holds a stale array", i)
		require.Equal(t, uint(g.depth), uint(e.depth), "directory entry %d holds a stale depth", i)
		require.Same(t, unsafe.SliceData(g.slots), unsafe.SliceData(e.array()), "directory entry %d holds a stale array", i)
		require.Same(t, unsafe.SliceData(g.keys), unsafe.SliceData(e.arena()), "directory entry %d holds a stale arena", i)
		require.Equal(t, len(g.keys), len(e.arena()), "directory entry %d holds a stale arena", i)
		require.Equal(t, uint32(i>>(tb.depth-uint(g.depth))), g.prefix, "directory entry %d points at the wrong segment", i)
		require.LessOrEqual(t, uint(g.depth), tb.depth)
		seen[g]++
		require.Same(t, g, tb.segs[g.idx], "segment at directory entry %d is not at its place in segs", i)
		// The directory entries of a segment of depth d share their top d
		// bits.
		first := i >> (tb.depth - uint(g.depth)) << (tb.depth - uint(g.depth))
		require.Same(t, g, tb.segs[tb.dir[first].idx])
	}
	require.Len(t, tb.segs, len(seen), "segs lists every segment once")
	used, slots := 0, 0
	for g, refs := range seen {
		slots += len(g.slots)
		require.Equal(t, 1<<(tb.depth-uint(g.depth)), refs, "a segment of depth %d has the wrong number of directory entries", g.depth)
		held, bytes := 0, 0
		owner := make([]int, g.end) // the slot whose key holds each byte, +1
		if len(tb.spare) > 0 {
			require.NotSame(t, unsafe.SliceData(tb.spare), unsafe.SliceData(g.keys), "the spare arena is a segment's")
		}
		for i := range g.slots {
			s := &g.slots[i]
			if s.meta == 0 {
				require.Zero(t, *s, "an empty slot keeps nothing alive")
				continue
			}
			held++
			off, n := keyOff(s.meta), tailLen(s.meta)
			if n == 0 {
				require.Zero(t, off, "slot %d's empty tail is not at 0", i)
			}
			require.LessOrEqual(t, off+n, int(g.end), "slot %d's key lies past its arena's end", i)
			for b := off; b < off+n; b++ {
				require.Zero(t, owner[b], "slots %d and %d share byte %d of their arena", owner[b]-1, i, b)
				owner[b] = i + 1
			}
			bytes += n
			tag := modelTag(g.keyOf(s))
			require.Equal(t, uint64(tag)<<32, s.meta&tagMask, "slot %d holds the wrong tag", i)
			require.Same(t, g, tb.seg(tag), "entry %q is in the wrong segment", g.keyOf(s))
			require.Equal(t, i, g.lookup(g.keyOf(s), tag), "entry %q not found at its slot", g.keyOf(s))
			for j := g.home(tag); j != i; j = (j + 1) % len(g.slots) {
				require.NotZero(t, g.slots[j].meta, "a gap in the probe run of %q", g.keyOf(s))
			}
		}
		require.Equal(t, int(g.n), held)
		require.Equal(t, bytes, int(g.end-g.dead), "bytes of the keys held")
		require.LessOrEqual(t, int(g.end), len(g.keys))
		require.LessOrEqual(t, len(g.keys), tb.arenaMax, "an arena past arenaMax")
		require.Less(t, int(g.n), len(g.slots))
		require.LessOrEqual(t, int(g.n)*8, len(g.slots)*7, "fuller than 7/8")
		used += held
	}
	require.Equal(t, tb.n, used)
	require.Equal(t, slots, tb.slots)
	if tb.pool == nil {
		require.LessOrEqual(t, tb.n, tb.max)
	} else {
		require.LessOrEqual(t, tb.n, tb.floor+int(tb.pool.max))
	}
}

// storeSlotBytes is the size of the slots of the store's 16-byte states.
const storeSlotBytes = int(unsafe.Sizeof(slot[[2]int64]{}))

// Keys starting with "d" play digests: their tag carries the flag.
func isDigest(key string) bool { return len(key) > 0 && key[0] == 'd' }

// modelTag is the tag TestTableModel gives key: its hash's, except that
// "cN", "cN-" and "cN+" share the tag of "cN", so that the table must tell
// keys of one tag apart by their length ("cN" from "cN-") and by their
// bytes ("cN-" from "cN+").
func modelTag(key string) uint32 {
	if strings.HasPrefix(key, "c") {
		return Tag(hash(strings.TrimRight(key, "-+")), false)
	}
	return Tag(hash(key), isDigest(key))
}

func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		max := rapid.IntRange(0, 300).Draw(t, "max")
		universe := rapid.IntRange(1, 600).Draw(t, "universe")
		var tb Table[int64]
		tb.Init(max, expired)
		// Segments of 8 to 64 slots, so that tables this small split.
		tb.segSlots = rapid.SampledFrom([]int{8, 16, 64, segmentBytes / 16}).Draw(t, "segSlots")
		tb.budget = tb.growthBudget(max) // as Init would for these segments
		if rapid.Bool().Draw(t, "halves") {
			tb.GrowInHalves()
		}
		if rapid.Bool().Draw(t, "preallocate") {
			tb.Preallocate()
			consistent(t, &tb)
		}
		model := map[string]int64{} // key -> the instant it becomes fresh
		var now int64
		pinned := map[string]bool{}
		// Keys of 0 to MaxKeyLen bytes, so that arenas fill unevenly and
		// compact (see Table.room).
		long := rapid.IntRange(0, MaxKeyLen).Draw(t, "long")
		key := func(t *rapid.T) string {
			i := rapid.IntRange(0, universe-1).Draw(t, "key")
			switch {
			case i == 0:
				return "" // the empty key, whose slot holds no pointer
			case i%3 == 0:
				return "d" + strconv.Itoa(i)
			case i%3 == 1: // three keys to a tag (see modelTag)
				return "c" + strconv.Itoa(i/9) + [...]string{"", "-", "+"}[i/3%3]
			}
			k := "k" + strconv.Itoa(i)
			if pad := i*7%(long+1) - len(k); pad > 0 {
				k += strings.Repeat("x", pad)
			}
			return k
		}
		use := func(t *rapid.T) {
			k := key(t)
			tag := modelTag(k)
			until := now + rapid.Int64Range(-5, 50).Draw(t, "until")
			if p := tb.Find(k, tag); p != nil {
				require.Contains(t, model, k)
				require.Equal(t, model[k], *p)
				*p = until
				model[k] = until
				return
			}
			require.NotContains(t, model, k)
			before := tb.Stats
			// Each key's segment now: a sweep visits one, which need not
			// be the new key's (see victim).
			segOf := map[string]*segment[int64]{}
			for _, g := range tb.segs {
				for i := range g.slots {
					if g.slots[i].meta != 0 {
						segOf[g.keyOf(&g.slots[i])] = g
					}
				}
			}
			// Half the time the insertion is first given what it wants
			// (see Wants), as the store gives it: then it allocates
			// nothing, unless an entry is pinned.
			given := rapid.Bool().Draw(t, "given")
			if given {
				tb.Give(Make[int64](tb.Wants(tag, len(k))))
			}
			p, ok := tb.Insert(k, tag, now)
			if given && len(tb.pins) == 0 {
				require.Equal(t, before.Allocations, tb.Stats.Allocations, "an insertion given what it wants allocated")
			}
			if !ok {
				heldPinned := 0
				for m := range model {
					if pinned[m] {
						heldPinned++
					}
				}
				require.True(t, max == 0 || heldPinned >= max, "insert refused with room to make")
				return
			}
			require.Zero(t, *p, "a new entry starts from the zero state")
			var dropped, lossy uint64
			var from *segment[int64] // the segment entries were dropped from
			for m, u := range model {
				if tb.Lookup(m, modelTag(m)) != nil {
					continue
				}
				require.False(t, pinned[m], "a pinned entry was evicted")
				require.True(t, from == nil || from == segOf[m], "entries dropped from two segments at once")
				from = segOf[m]
				dropped++
				if u > now {
					lossy++
				}
				delete(model, m)
			}
			if tb.Stats.Sweeps > before.Sweeps && dropped > 0 && lossy == 0 {
				// The sweep freed room: it dropped every fresh entry of
				// its segment, and nothing else.
				for m, g := range segOf {
					if u, held := model[m]; held && g == tb.swept {
						require.True(t, u > now || pinned[m], "a sweep left fresh key %q", m)
					}
				}
			} else {
				require.LessOrEqual(t, dropped, uint64(1), "CLOCK drops one entry at a time")
			}
			require.Equal(t, before.Evictions+dropped, tb.Stats.Evictions)
			require.Equal(t, before.LossyEvictions+lossy, tb.Stats.LossyEvictions)
			*p = until
			model[k] = until
			if rapid.IntRange(0, 9).Draw(t, "pin") == 0 {
				tb.Pin(k, tag)
				pinned[k] = true
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"use": use,
			"fill": func(t *rapid.T) { // enough keys at once to split
				for range rapid.IntRange(1, 100).Draw(t, "fill") {
					use(t)
				}
			},
			"unpin": func(t *rapid.T) {
				tb.Unpin()
				clear(pinned)
			},
			"delete": func(t *rapid.T) {
				k := key(t)
				_, held := model[k]
				before := tb.Stats.Evictions
				require.Equal(t, held, tb.Delete(k, modelTag(k)))
				require.Equal(t, before, tb.Stats.Evictions, "a deletion is not an eviction")
				delete(model, k) // a pin stays with the key, held or not
			},
			"advance": func(t *rapid.T) {
				now += rapid.Int64Range(0, 30).Draw(t, "advance")
			},
			"too long": func(t *rapid.T) {
				k := strings.Repeat("k", MaxKeyLen+1)
				_, ok := tb.Insert(k, modelTag(k), now)
				require.False(t, ok, "a key longer than MaxKeyLen was taken")
			},
			"": func(t *rapid.T) {
				consistent(t, &tb)
				require.Equal(t, len(model), tb.Len())
				for k, u := range model {
					p := tb.Lookup(k, modelTag(k))
					require.NotNil(t, p)
					require.Equal(t, u, *p)
				}
				n := 0
				tb.Each(func(k string, s *int64) {
					n++
					require.Equal(t, model[k], *s)
				})
				require.Equal(t, len(model), n)
			},
		})
	})
}

// TestTableFreshFirst: a small table drops a live entry only when nothing
// else in it is fresh.
func TestTableFreshFirst(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		max := rapid.IntRange(1, 7).Draw(t, "max") // max/8 == 0: sweeps before every eviction
		var tb Table[int64]
		tb.Init(max, expired)
		var now int64
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				k := strconv.Itoa(rapid.IntRange(0, 30).Draw(t, "key"))
				tag := Tag(hash(k), false)
				if tb.Find(k, tag) != nil {
					return
				}
				anyFresh := false
				tb.Each(func(_ string, s *int64) { anyFresh = anyFresh || expired(s, now) })
				lossy := tb.Stats.LossyEvictions
				p, ok := tb.Insert(k, tag, now)
				require.True(t, ok)
				if anyFresh {
					require.Equal(t, lossy, tb.Stats.LossyEvictions, "a live entry went while a fresh one was held")
				}
				*p = now + rapid.Int64Range(0, 20).Draw(t, "until")
			},
			"advance": func(t *rapid.T) { now += rapid.Int64Range(0, 10).Draw(t, "advance") },
		})
	})
}

// TestTableClockOrder: with nothing fresh, CLOCK keeps the entries used
// again within every turn of its hand and drops the others.
func TestTableClockOrder(t *testing.T) {
	var tb Table[int64]
	const size, hot, cold = 100, 10, 10_000
	tb.Init(size, expired)
	tag := func(k string) uint32 { return Tag(hash(k), false) }
	insert := func(k string) {
		p, ok := tb.Insert(k, tag(k), 0)
		require.True(t, ok)
		*p = 1 << 40 // never fresh in this test
	}
	for i := range hot {
		insert("hot" + strconv.Itoa(i))
	}
	for i := range cold {
		insert("cold" + strconv.Itoa(i))
		if i%30 == 0 {
			for j := range hot {
				require.NotNil(t, tb.Find("hot"+strconv.Itoa(j), tag("hot"+strconv.Itoa(j))),
					"hot key %d evicted at cold key %d", j, i)
			}
		}
	}
	require.Equal(t, uint64(cold-(size-hot)), tb.Stats.LossyEvictions)
	consistent(t, &tb)
}

// TestTableClockDropsFreshAtOnce: between sweeps, the CLOCK hand drops the
// first fresh entry it reaches in the new key's segment, however recently
// it was used, before it counts any live entry down to nothing. The table
// is large enough that the segment's next sweep is far off, and every entry
// has just been used.
func TestTableClockDropsFreshAtOnce(t *testing.T) {
	const size = 3000 // split in segments, each swept once per eighth of its entries in insertions
	const live = 1 << 40
	var tb Table[int64]
	tb.Init(size, expired)
	tag := func(k string) uint32 { return Tag(hash(k), false) }
	insert := func(k string) {
		p, ok := tb.Insert(k, tag(k), 0)
		require.True(t, ok)
		*p = live
	}
	var keys []string
	for i := range size {
		keys = append(keys, "k"+strconv.Itoa(i))
		insert(keys[i])
	}
	require.Greater(t, len(tb.segs), 1, "a table this large is split")
	g := tb.seg(tag("after-sweep"))
	var inG []string // keys g holds
	for _, k := range keys {
		if tb.seg(tag(k)) == g {
			inG = append(inG, k)
		}
	}
	// The table is full and g's sweep is due: let it drop one fresh entry,
	// so that g's next sweep is far off.
	*tb.Lookup(inG[0], tag(inG[0])) = 0
	insert("after-sweep")
	require.Equal(t, uint64(1), tb.Stats.Sweeps)
	require.Equal(t, uint64(1), tb.Stats.Evictions)
	require.Nil(t, tb.Lookup(inG[0], tag(inG[0])))
	keys = append(slices.DeleteFunc(keys, func(k string) bool { return k == inG[0] }), "after-sweep")

	// Another key of g turns fresh; every entry, that one included, is
	// used again; a newcomer to g comes.
	fresh := inG[len(inG)/2]
	*tb.Lookup(fresh, tag(fresh)) = 0
	for _, k := range keys {
		require.NotNil(t, tb.Find(k, tag(k)))
	}
	newcomer := "newcomer"
	for i := 0; tb.seg(tag(newcomer)) != g; i++ {
		newcomer = "newcomer" + strconv.Itoa(i)
	}
	before := tb.Stats
	insert(newcomer)
	require.Equal(t, before.Sweeps, tb.Stats.Sweeps, "no sweep was due")
	require.Equal(t, before.Evictions+1, tb.Stats.Evictions)
	require.Equal(t, before.LossyEvictions, tb.Stats.LossyEvictions, "a live entry went while a fresh one was held")
	require.Nil(t, tb.Lookup(fresh, tag(fresh)), "the fresh entry is still held")
	for _, k := range keys {
		if k != fresh {
			require.NotNil(t, tb.Lookup(k, tag(k)), "live entry %q dropped", k)
		}
	}
	consistent(t, &tb)
}

// TestTableChurnKeepsBudget: a full table whose entries turn fresh 2/5 of
// its bound in insertions after they came, churned through six times its
// bound, keeps its arrays within their budget and one growth past it
// (room a sweep frees in one segment must not let the others grow without
// end), and its evictions lossless: for a large table, and for one of the
// size a store's shard has, whose slack is less than a segment's (the
// slack of one segment each made a store of a million keys in 256 shards
// hold a tenth more memory once churned).
func TestTableChurnKeepsBudget(t *testing.T) {
	for _, m := range []int{100_000, 4_000} {
		var tb Table[int64]
		tb.Init(m, expired)
		most := 0
		for i := range 6 * m {
			k := "user-" + strconv.Itoa(i)
			p, ok := tb.Insert(k, Tag(hash(k), false), int64(i))
			require.True(t, ok)
			*p = int64(i + m*2/5)
			most = max(most, tb.slots)
		}
		t.Logf("%d entries: at most %d slots", m, most)
		// The budget, and one growth past it.
		require.LessOrEqual(t, most, m*10/7+min(tb.segSlots, m/16)+tb.segSlots/4, "arrays past 10/7 of a slot an entry")
		slots := 0
		for _, g := range tb.segs {
			slots += len(g.slots)
		}
		require.Equal(t, slots, tb.slots)
		require.Zero(t, tb.Stats.LossyEvictions, "a live entry went where fresh ones were held")
		consistent(t, &tb)
	}
}

// TestTableSegmentsBounded: filling a table to 300,000 entries and churning
// as many more through it never makes an array larger than segmentBytes,
// the most one operation copies, and keeps the table within 8/7 to 4/3
// slots per entry once it holds more than one segment's worth.
func TestTableSegmentsBounded(t *testing.T) {
	const n = 300_000
	var tb Table[[2]int64] // the slot of the store's 16-byte states
	tb.Init(n, func(*[2]int64, int64) bool { return false })
	largest := 0
	for i := range 2 * n {
		k := "key-" + strconv.Itoa(i)
		_, ok := tb.Insert(k, Tag(hash(k), false), 0)
		require.True(t, ok)
		if i%1000 == 999 {
			slots := 0
			for _, g := range tb.segs {
				slots += len(g.slots)
				largest = max(largest, len(g.slots)*int(unsafe.Sizeof(g.slots[0])))
			}
			if tb.n > tb.segSlots {
				require.GreaterOrEqual(t, float64(slots)/float64(tb.n), 8.0/7, "fuller than 7/8 at %d", tb.n)
				require.LessOrEqual(t, float64(slots)/float64(tb.n), 4.0/3, "emptier than 3/4 at %d", tb.n)
			}
		}
	}
	require.LessOrEqual(t, largest, segmentBytes)
	require.Greater(t, len(tb.segs), 100)
}

// TestTableSweepsKeepSegmentsEven: one-off keys that turn fresh 125
// insertions after they come flow through a full table that also holds
// live keys. A sweep gives the room of its segment's fresh entries to the
// whole table, and a small segment sweeps the most often: unless a full
// table takes room for a shrunken segment's keys from a larger one, such a
// segment shrinks to its live entries and its CLOCK drops them while other
// segments hold fresh ones.
func TestTableSweepsKeepSegmentsEven(t *testing.T) {
	const size, live, once = 6000, 1200, 300_000
	var lossy uint64
	for run := range 16 {
		var tb Table[int64]
		tb.Init(size, expired)
		tb.segSlots = segmentBytes / storeSlotBytes // as for the store's 16-byte states
		insert := func(k string, until, now int64) {
			k = strconv.Itoa(run) + k
			p, ok := tb.Insert(k, Tag(hash(k), false), now)
			require.True(t, ok)
			*p = until
		}
		for i := range live {
			insert("live-"+strconv.Itoa(i), 1<<62, 0)
		}
		for i := range once {
			insert("once-"+strconv.Itoa(i), int64(i)+125, int64(i))
		}
		require.Greater(t, len(tb.segs), 4, "a table this large is split")
		lossy += tb.Stats.LossyEvictions
		consistent(t, &tb)
	}
	require.Zero(t, lossy, "live entries went while fresh ones were held")
}

// TestTablePreallocated: a preallocated table fills to its bound without
// allocating (or, were a segment's count to stray past three standard
// deviations, with an allocation or two), at about 1.3 slots per entry.
func TestTablePreallocated(t *testing.T) {
	const size = 125_000 // a shard's share of a million keys over 8 shards
	keys := make([]string, size)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	var tb Table[int64]
	tb.Init(size, expired)
	tb.segSlots = segmentBytes / storeSlotBytes // as for the store's 16-byte states
	tb.Preallocate()
	slots := tb.slots
	require.InDelta(t, 1.3, float64(slots)/size, 0.1, "slots per entry")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		_, ok := tb.Insert(k, Tag(hash(k), false), 0)
		require.True(t, ok)
	}
	runtime.ReadMemStats(&after)
	require.Equal(t, size, tb.Len())
	require.LessOrEqual(t, after.Mallocs-before.Mallocs, uint64(6), "filling a preallocated table allocated")
	require.Zero(t, tb.Stats.Evictions)
	require.LessOrEqual(t, tb.slots-slots, 2*tb.segSlots, "segments grew")
	consistent(t, &tb)
}

// TestTableCopiesKeys: a table keeps a copy of each key's bytes, not the
// caller's: a key whose bytes the caller reuses after Insert is still found
// by what it was, and not by what the bytes became.
func TestTableCopiesKeys(t *testing.T) {
	var tb Table[int64]
	tb.Init(100, expired)
	const pad = "-and-a-tail-past-the-head"
	buf := []byte("key-0")
	for i := range 50 {
		buf[4] = byte('0' + i%10)
		buf = append(buf[:5], strconv.Itoa(i)...)
		if i%2 == 1 { // a key longer than its head
			buf = append(buf, pad...)
		}
		k := unsafe.String(&buf[0], len(buf)) // the caller's bytes, reused
		p, ok := tb.Insert(k, Tag(hash(k), false), 0)
		require.True(t, ok)
		*p = int64(i)
	}
	for i := range 50 {
		k := "key-" + string(rune('0'+i%10)) + strconv.Itoa(i)
		k = k[:4] + k[4:5] + strconv.Itoa(i)
		if i%2 == 1 {
			k += pad
		}
		p := tb.Lookup(k, Tag(hash(k), false))
		require.NotNil(t, p, "key %q", k)
		require.Equal(t, int64(i), *p)
	}
	consistent(t, &tb)
}

// TestTableArenaBound: a segment whose arena holds arenaMax bytes (here a
// few hundred; in a store only a segment at maxDepth could) makes room in
// itself for a new key rather than pass it, and refuses the key only if
// every entry it could drop is pinned.
func TestTableArenaBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var tb Table[int64]
		tb.Init(1000, expired)
		tb.arenaMax = rapid.IntRange(MaxKeyLen, 600).Draw(t, "arenaMax")
		tb.segSlots = 1 << 20 // one segment, which never splits
		held := map[string]bool{}
		for i := range rapid.IntRange(1, 300).Draw(t, "keys") {
			k := strconv.Itoa(i) + strings.Repeat("x", rapid.IntRange(0, MaxKeyLen-4).Draw(t, "pad"))
			pin := rapid.IntRange(0, 3).Draw(t, "pin") == 0
			p, ok := tb.Insert(k, Tag(hash(k), false), 0)
			if !ok {
				g := tb.segs[0]
				require.Greater(t, int(g.end-g.dead)+len(k), tb.arenaMax, "refused %q with room in the arena", k)
				tb.Each(func(m string, _ *int64) { require.True(t, held[m], "refused %q while %q could go", k, m) })
				tb.Unpin()
				clear(held)
				continue
			}
			*p = 1 << 40 // never fresh
			if pin {
				tb.Pin(k, Tag(hash(k), false))
				held[k] = true
			}
			require.NotNil(t, tb.Lookup(k, Tag(hash(k), false)))
			for m := range held {
				require.NotNil(t, tb.Lookup(m, Tag(hash(m), false)), "pinned %q dropped", m)
			}
			consistent(t, &tb)
		}
	})
}

// TestTableArenasRecycled: a preallocated table whose keys (of up to 24
// bytes, so up to 8 in the arena) come and go, each new key taking an old one's place, compacts its
// arenas into the spare and reuses the arena left: it allocates nothing,
// and its arenas stay within 9/4 of its keys' bytes (an arena is made 5/4
// of its keys' bytes, and not made smaller when its segment's sweeps leave
// it fewer keys). A table that allocates as it goes keeps its arenas within
// the same bound (about 2.1 here, against 1.3 preallocated).
func TestTableArenasRecycled(t *testing.T) {
	const size = 20_000
	for _, pre := range []bool{true, false} {
		var tb Table[int64]
		tb.Init(size, expired)
		tb.segSlots = segmentBytes / storeSlotBytes // as for the store's 16-byte states
		if pre {
			tb.Preallocate()
		}
		keys := make([]string, 5*size)
		for i := range keys {
			keys[i] = "user-session-ke" + strconv.Itoa(i*7919)
		}
		insert := func(i int) {
			k := keys[i]
			p, ok := tb.Insert(k, Tag(hash(k), false), int64(i))
			require.True(t, ok)
			*p = int64(i + size*3/4) // fresh when 3/4 of a bound have come after it
		}
		for i := range size {
			insert(i)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := size; i < 5*size; i++ {
			insert(i)
		}
		runtime.ReadMemStats(&after)
		require.Greater(t, tb.Stats.Compactions, uint64(len(tb.segs)), "arenas compacted")
		if pre {
			require.LessOrEqual(t, after.Mallocs-before.Mallocs, uint64(4), "a preallocated table churning allocated")
		}
		arenas, bytes := len(tb.spare), 0
		for _, g := range tb.segs {
			arenas += len(g.keys)
			bytes += int(g.end - g.dead)
		}
		require.LessOrEqual(t, arenas, bytes*9/4+len(tb.spare)+len(tb.segs)*arenaSize(0), "arenas (preallocated %v)", pre)
		t.Logf("preallocated %v: arenas %.2f bytes a key byte", pre, float64(arenas)/float64(bytes))
		consistent(t, &tb)
	}
}

// TestTablePoolModel: tables that share a Pool hold together no more than
// their floors and the pool, the pool's count is what they hold past their
// floors until it freezes, and a table makes room (drops an entry) only
// when it holds its floor and the pool is spent: however unevenly keys
// spread over the tables, none drops a key while the others leave room as
// they fill. Once the pool has frozen, a table that made room has a bound
// of its own, its floor and the units it held, and makes room only at it;
// the tables' bounds never pass their floors and the pool, and on one
// goroutine come to exactly that.
func TestTablePoolModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 4).Draw(t, "tables")
		pool := NewPool(rapid.IntRange(0, 24).Draw(t, "pool"))
		tables := make([]Table[int64], k)
		floors := 0
		for i := range tables {
			tables[i].Init(rapid.IntRange(1, 40).Draw(t, "share"), expired)
			tables[i].segSlots = 16    // small segments, so that they split
			tables[i].budget = 1 << 30 // no room made for the budget's sake
			tables[i].Share(pool, rapid.IntRange(1, 12).Draw(t, "floor"))
			floors += tables[i].floor
		}
		var now int64
		key := func(t *rapid.T) (string, *Table[int64]) {
			kk := "k" + strconv.Itoa(rapid.IntRange(0, 300).Draw(t, "key"))
			return kk, &tables[hash(kk)%uint64(k)]
		}
		check := func(t *rapid.T) {
			held, pooled, bounds := 0, 0, 0
			for i := range tables {
				tb := &tables[i]
				held += tb.n
				pooled += tb.pooled(tb.n)
				if tb.pool == nil { // frozen: a bound of its own
					require.True(t, pool.frozen.Load(), "a table left a pool that has not frozen")
					require.LessOrEqual(t, tb.n, tb.max)
					bounds += tb.max
				} else {
					bounds += tb.floor + tb.pooled(tb.n)
				}
				consistent(t, tb)
			}
			if !pool.frozen.Load() {
				require.Equal(t, int64(pooled), pool.used.Load(), "the pool's count")
				require.LessOrEqual(t, bounds, floors+int(pool.max), "the tables' bounds")
			} else { // frozen when spent, one goroutine: no unit lost
				require.Equal(t, floors+int(pool.max), bounds, "the tables' bounds")
			}
			require.LessOrEqual(t, held, floors+int(pool.max))
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				kk, tb := key(t)
				tag := Tag(hash(kk), false)
				if tb.Find(kk, tag) != nil {
					return
				}
				n, spent, ev := tb.n, pool.used.Load() == pool.max || pool.frozen.Load(), tb.Stats.Evictions
				p, ok := tb.Insert(kk, tag, now)
				require.True(t, ok, "an insertion refused")
				*p = now + rapid.Int64Range(0, 40).Draw(t, "until")
				if tb.Stats.Evictions != ev {
					require.True(t, n >= tb.floor && spent, "room made with %d of a floor of %d held and the pool not spent", n, tb.floor)
					require.Nil(t, tb.pool, "room made by a table that has not frozen")
					require.Equal(t, tb.max, n, "room made by a table under its own bound")
				} else {
					require.Equal(t, n+1, tb.n)
				}
				check(t)
			},
			"delete": func(t *rapid.T) {
				kk, tb := key(t)
				tb.Delete(kk, Tag(hash(kk), false))
				check(t)
			},
			"advance": func(t *rapid.T) { now += rapid.Int64Range(0, 20).Draw(t, "advance") },
		})
	})
}

// TestTablePoolConcurrent: tables that share a Pool, each used by a
// goroutine of its own (as a store's shards are, each under its own lock),
// never hold more than their floors and the pool together, and the pool's
// count ends as what they hold past their floors. (The pool goes to the
// tables that ask first: a table holds the units it took, and once the
// pool has frozen, evicts one of its own for each new key.)
func TestTablePoolConcurrent(t *testing.T) {
	const k, floor, units = 4, 100, 1000
	pool := NewPool(units)
	tables := make([]Table[int64], k)
	for i := range tables {
		tables[i].Init(floor+units/k, func(*int64, int64) bool { return false })
		tables[i].Share(pool, floor)
	}
	var wg sync.WaitGroup
	var over atomic.Bool
	for i := range tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tb := &tables[i]
			for j := range 20_000 * (i + 1) { // uneven: the last table takes the most keys
				kk := strconv.Itoa(i) + "-" + strconv.Itoa(j)
				if _, ok := tb.Insert(kk, Tag(hash(kk), false), 0); !ok {
					panic("an insertion refused")
				}
				if pool.used.Load() > pool.max {
					over.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, over.Load(), "the pool's count passed its bound")
	held, pooled := 0, 0
	for i := range tables {
		held += tables[i].n
		pooled += tables[i].pooled(tables[i].n)
	}
	require.Equal(t, int64(pooled), pool.used.Load())
	require.Equal(t, k*floor+units, held, "the tables hold their floors and the whole pool")
}

// TestTablePoolGrowsPastShare: a table that takes more than its share of
// the keys through its pool grows to hold them, preallocated or not, and
// drops none while the pool has units left: its arrays' budget follows the
// entries it holds, not its share. (A preallocated table once settled its
// budget when it first held its share, and then dropped keys of segments
// that grew past their slack while the store was not yet full.)
func TestTablePoolGrowsPastShare(t *testing.T) {
	const k, share = 8, 1000
	for _, pre := range []bool{false, true} {
		floor := share - share/8
		pool := NewPool(k*share - k*floor)
		tables := make([]Table[int64], k)
		for i := range tables {
			tables[i].Init(share, func(*int64, int64) bool { return false })
			tables[i].Share(pool, floor)
			if pre {
				tables[i].Preallocate()
			}
		}
		// The first table takes nearly the whole pool (1.84 times its
		// share), the others a few units each, and the tables end holding
		// exactly their floors and the pool.
		counts := make([]int, k)
		counts[0] = floor + k*share/8 - (k-1)*5
		for i := 1; i < k; i++ {
			counts[i] = floor + 5
		}
		for i, c := range counts {
			for j := range c {
				kk := strconv.Itoa(i) + "-" + strconv.Itoa(j)
				_, ok := tables[i].Insert(kk, Tag(hash(kk), false), 0)
				require.True(t, ok)
			}
		}
		for i := range tables {
			tb := &tables[i]
			require.Zero(t, tb.Stats.Evictions, "preallocated %v, table %d of %d entries (share %d): dropped a key before the pool was spent", pre, i, tb.n, share)
			require.Equal(t, counts[i], tb.n)
			consistent(t, tb)
		}
		require.Equal(t, pool.max, pool.used.Load(), "preallocated %v", pre)
		// One more key: the pool is spent, so it freezes, and the key's
		// table makes room in itself.
		_, ok := tables[0].Insert("more", Tag(hash("more"), false), 0)
		require.True(t, ok)
		require.True(t, pool.frozen.Load())
		require.Equal(t, uint64(1), tables[0].Stats.Evictions, "preallocated %v", pre)
	}
}

// TestTableHeadOf: a key's head is its first 16 bytes, zeros past its end,
// at every length.
func TestTableHeadOf(t *testing.T) {
	src := "abcdefghijklmnopqrstuvwxyz"
	for n := 0; n <= len(src); n++ {
		var b [headBytes]byte
		copy(b[:], src[:n])
		want := head{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
		require.Equal(t, want, headOf(strings.Clone(src[:n])), "key of %d bytes", n)
	}
}

// TestTableTellsKeysApart: keys of one tag are told apart by their length
// (a key ending in zero bytes from the shorter one, whose head is the
// same), by their heads, and past the head by their tails in the arena.
func TestTableTellsKeysApart(t *testing.T) {
	head16 := "0123456789abcdef"
	keys := []string{
		"", "\x00", "\x00\x00", "ab", "ab\x00", "abc", "abd", "12345678", "123456789", "12345678\x00",
		head16, head16 + "\x00", head16 + "x", head16 + "y", head16 + "xy", head16 + "yx",
		"1123456789abcdef" + "x", head16[:15] + "0x",
	}
	var tb Table[int64]
	tb.Init(100, expired)
	const tag = 42 << 8 // one tag for every key
	for i, k := range keys {
		require.Nil(t, tb.Lookup(k, tag), "%q found before it was added", k)
		p, ok := tb.Insert(k, tag, 0)
		require.True(t, ok)
		*p = int64(i + 1)
	}
	for i, k := range keys {
		p := tb.Lookup(k, tag)
		require.NotNil(t, p, "%q", k)
		require.Equal(t, int64(i+1), *p, "%q found another key's entry", k)
	}
	var seen []string
	tb.Each(func(k string, _ *int64) { seen = append(seen, k) })
	require.ElementsMatch(t, keys, seen)
}

// TestTableGivenWhatItWants: a table whose every insertion is first given
// what Wants names (as the store gives it, allocated outside its lock)
// allocates nothing itself while it fills from empty and churns through
// eviction, whatever it does: its first array, growths, splits (and the
// directory's doublings), compactions of arenas, with keys of every length
// up to MaxKeyLen. And it holds what a table never given anything holds.
func TestTableGivenWhatItWants(t *testing.T) {
	const size = 20_000
	for _, pre := range []bool{false, true} {
		var given, alone Table[int64]
		for _, tb := range []*Table[int64]{&given, &alone} {
			tb.Init(size, expired)
			tb.segSlots = segmentBytes / storeSlotBytes // as for the store's 16-byte states
			if pre {
				tb.Preallocate()
			}
		}
		start := given.Stats.Allocations
		for i := range 4 * size {
			k := "k" + strconv.Itoa(i*7919) + strings.Repeat("x", i*31%(MaxKeyLen-10))
			tag := Tag(hash(k), false)
			given.Give(Make[int64](given.Wants(tag, len(k))))
			for _, tb := range []*Table[int64]{&given, &alone} {
				p, ok := tb.Insert(k, tag, int64(i))
				require.True(t, ok)
				*p = int64(i + size*3/4) // fresh when 3/4 of a bound have come after it
			}
		}
		require.Equal(t, start, given.Stats.Allocations, "a table given what it wants allocated (preallocated %v)", pre)
		st := given.Stats
		require.NotZero(t, st.Compactions)
		if !pre {
			require.NotZero(t, st.Splits)
		}
		st.Allocations = alone.Stats.Allocations
		require.Equal(t, alone.Stats, st, "preallocated %v", pre)
		consistent(t, &given)
		alone.Each(func(k string, s *int64) {
			p := given.Lookup(k, Tag(hash(k), false))
			require.NotNil(t, p, "%q held alone and not given", k)
			require.Equal(t, *s, *p)
		})
		require.Equal(t, alone.Len(), given.Len())
	}
}

// TestGrowInHalves: a table whose segments grow by half their size
// allocates (and so copies its entries) less often as it fills than one
// that grows by a quarter (splits, which allocate as often in both, are
// counted too), and holds at most its budget of slots:
// 12/7 of a slot per entry and one segment's.
func TestGrowInHalves(t *testing.T) {
	const n = 200_000
	fill := func(halves bool) *Table[int64] {
		tb := new(Table[int64])
		tb.Init(n, expired)
		if halves {
			tb.GrowInHalves()
		}
		for i := range n {
			k := "key-" + strconv.Itoa(i)
			_, ok := tb.Insert(k, Tag(hash(k), false), 0)
			require.True(t, ok)
		}
		consistent(t, tb)
		return tb
	}
	fine, halves := fill(false), fill(true)
	require.Less(t, halves.Stats.Allocations*5, fine.Stats.Allocations*4, "allocations: %d by halves, %d by quarters", halves.Stats.Allocations, fine.Stats.Allocations)
	require.LessOrEqual(t, fine.slots, n*10/7+fine.segSlots)
	require.LessOrEqual(t, halves.slots, n*12/7+halves.segSlots)
	require.Greater(t, halves.slots, fine.slots, "growing by halves holds more slack")
}
