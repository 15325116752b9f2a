package table

import (
	"hash/maphash"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The state in these tests is the instant the entry becomes fresh.
func expired(s *int64, now int64) bool { return *s <= now }

// consistent checks the table's structure: every entry in use is found
// through the index at its own position, every index slot points at an
// entry in use, and the counts agree.
func consistent(t require.TestingT, tb *Table[int64], seed maphash.Seed) {
	slots := 0
	for _, s := range tb.index {
		if s == 0 {
			continue
		}
		slots++
		p := int32(uint32(s)) - 1
		require.Less(t, int(p), tb.hi)
		require.NotZero(t, tb.used[p>>6]&(1<<(p&63)), "index slot for a position not in use")
	}
	used := 0
	tb.Each(func(key string, s *int64) {
		used++
		h := maphash.String(seed, key)
		p := tb.Lookup(key, Tag(h, isDigest(key)))
		require.GreaterOrEqual(t, p, int32(0), "entry %q not found through the index", key)
		require.Equal(t, key, tb.Key(p))
	})
	require.Equal(t, tb.n, used)
	require.Equal(t, tb.n, slots)
	require.LessOrEqual(t, tb.n, tb.max)
	require.LessOrEqual(t, tb.n*5, len(tb.index)*4, "index fuller than 4/5")
}

// Keys starting with "d" play digests: their tag carries the flag.
func isDigest(key string) bool { return len(key) > 0 && key[0] == 'd' }

func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := maphash.MakeSeed()
		max := rapid.IntRange(0, 200).Draw(t, "max")
		universe := rapid.IntRange(1, 400).Draw(t, "universe")
		var tb Table[int64]
		tb.Init(max, seed, expired)
		model := map[string]int64{} // key -> the instant it becomes fresh
		var now int64
		pinned := map[string]bool{}
		key := func(t *rapid.T) string {
			i := rapid.IntRange(0, universe-1).Draw(t, "key")
			if i%3 == 0 {
				return "d" + strconv.Itoa(i)
			}
			return "k" + strconv.Itoa(i)
		}
		t.Repeat(map[string]func(*rapid.T){
			"use": func(t *rapid.T) {
				k := key(t)
				h := maphash.String(seed, k)
				tag := Tag(h, isDigest(k))
				until := now + rapid.Int64Range(-5, 50).Draw(t, "until")
				if p := tb.Find(k, tag); p >= 0 {
					require.Contains(t, model, k)
					require.Equal(t, model[k], *tb.State(p))
					*tb.State(p) = until
					model[k] = until
					return
				}
				require.NotContains(t, model, k)
				before := tb.Stats
				p, ok := tb.Insert(k, tag, now)
				if !ok {
					require.True(t, max == 0 || len(pinned) >= max, "insert refused with room to make")
					return
				}
				require.Zero(t, *tb.State(p), "a new entry starts from the zero state")
				var dropped, lossy uint64
				for m, u := range model {
					if tb.Lookup(m, Tag(maphash.String(seed, m), isDigest(m))) >= 0 {
						continue
					}
					require.False(t, pinned[m], "a pinned entry was evicted")
					dropped++
					if u > now {
						lossy++
					}
					delete(model, m)
				}
				require.Equal(t, before.Evictions+dropped, tb.Stats.Evictions)
				require.Equal(t, before.LossyEvictions+lossy, tb.Stats.LossyEvictions)
				*tb.State(p) = until
				model[k] = until
				if rapid.Bool().Draw(t, "pin") {
					tb.Pin(p)
					pinned[k] = true
				}
			},
			"unpin": func(t *rapid.T) {
				tb.Unpin()
				clear(pinned)
			},
			"advance": func(t *rapid.T) {
				now += rapid.Int64Range(0, 30).Draw(t, "advance")
			},
			"": func(t *rapid.T) {
				consistent(t, &tb, seed)
				require.Equal(t, len(model), tb.Len())
				for k := range model {
					require.GreaterOrEqual(t, tb.Lookup(k, Tag(maphash.String(seed, k), isDigest(k))), int32(0))
				}
			},
		})
	})
}

// TestTableFreshFirst: a small table drops a live entry only when nothing
// else in it is fresh.
func TestTableFreshFirst(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := maphash.MakeSeed()
		max := rapid.IntRange(1, 7).Draw(t, "max") // max/8 == 0: sweeps before every eviction
		var tb Table[int64]
		tb.Init(max, seed, expired)
		var now int64
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				k := strconv.Itoa(rapid.IntRange(0, 30).Draw(t, "key"))
				tag := Tag(maphash.String(seed, k), false)
				if tb.Find(k, tag) >= 0 {
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
				*tb.State(p) = now + rapid.Int64Range(0, 20).Draw(t, "until")
			},
			"advance": func(t *rapid.T) { now += rapid.Int64Range(0, 10).Draw(t, "advance") },
		})
	})
}

// TestTableClockOrder: with nothing fresh, CLOCK drops unreferenced entries
// in insertion order and keeps the ones used again.
func TestTableClockOrder(t *testing.T) {
	seed := maphash.MakeSeed()
	var tb Table[int64]
	const max = 100
	tb.Init(max, seed, expired)
	tag := func(k string) uint32 { return Tag(maphash.String(seed, k), false) }
	insert := func(k string) {
		p, ok := tb.Insert(k, tag(k), 0)
		require.True(t, ok)
		*tb.State(p) = 1 << 40 // never fresh in this test
	}
	for i := range 10 {
		insert("hot" + strconv.Itoa(i))
	}
	for i := range 10_000 {
		insert("cold" + strconv.Itoa(i))
		if i%30 == 0 {
			for j := range 10 {
				require.GreaterOrEqual(t, tb.Find("hot"+strconv.Itoa(j), tag("hot"+strconv.Itoa(j))), int32(0),
					"hot key %d evicted at cold key %d", j, i)
			}
		}
	}
	// The cold keys held are exactly the most recent ones.
	for i := range 10_000 {
		k := "cold" + strconv.Itoa(i)
		require.Equal(t, i >= 10_000-(max-10), tb.Lookup(k, tag(k)) >= 0, "cold key %d", i)
	}
	require.Equal(t, uint64(10_000-(max-10)), tb.Stats.LossyEvictions)
	consistent(t, &tb, seed)
}
