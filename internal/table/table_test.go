package table

import (
	"hash/fnv"
	"strconv"
	"testing"

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

// consistent checks the table's structure: every entry is found through
// its probe run from its home, no empty slot lies between an entry and its
// home, and the counts agree.
func consistent(t require.TestingT, tb *Table[int64]) {
	used := 0
	for i := range tb.slots {
		s := &tb.slots[i]
		if s.meta == 0 {
			require.Zero(t, *s, "an empty slot keeps nothing alive")
			continue
		}
		used++
		tag := Tag(hash(s.key), isDigest(s.key))
		require.Equal(t, uint64(tag)<<32, s.meta&tagMask, "slot %d holds the wrong tag", i)
		require.Equal(t, i, tb.Lookup(s.key, tag), "entry %q not found at its slot", s.key)
		for j := tb.home(tag); j != i; j = (j + 1) % len(tb.slots) {
			require.NotZero(t, tb.slots[j].meta, "a gap in the probe run of %q", s.key)
		}
	}
	require.Equal(t, tb.n, used)
	require.LessOrEqual(t, tb.n, tb.max)
	if len(tb.slots) == 0 {
		require.Zero(t, tb.n, "a table with no array holds nothing")
	} else {
		require.Less(t, tb.n, len(tb.slots))
	}
	require.LessOrEqual(t, tb.n*8, len(tb.slots)*7, "fuller than 7/8")
}

// Keys starting with "d" play digests: their tag carries the flag.
func isDigest(key string) bool { return len(key) > 0 && key[0] == 'd' }

func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		max := rapid.IntRange(0, 200).Draw(t, "max")
		universe := rapid.IntRange(1, 400).Draw(t, "universe")
		var tb Table[int64]
		tb.Init(max, expired)
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
				h := hash(k)
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
					if tb.Lookup(m, Tag(hash(m), isDigest(m))) >= 0 {
						continue
					}
					require.False(t, pinned[m], "a pinned entry was evicted")
					dropped++
					if u > now {
						lossy++
					}
					delete(model, m)
				}
				if tb.Stats.Sweeps > before.Sweeps && dropped > 0 {
					for m, u := range model {
						require.True(t, u > now || pinned[m], "a sweep left fresh key %q", m)
					}
				}
				require.Equal(t, before.Evictions+dropped, tb.Stats.Evictions)
				require.Equal(t, before.LossyEvictions+lossy, tb.Stats.LossyEvictions)
				*tb.State(p) = until
				model[k] = until
				if rapid.Bool().Draw(t, "pin") {
					tb.Pin(k, tag)
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
				consistent(t, &tb)
				require.Equal(t, len(model), tb.Len())
				for k := range model {
					require.GreaterOrEqual(t, tb.Lookup(k, Tag(hash(k), isDigest(k))), 0)
				}
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
		*tb.State(p) = 1 << 40 // never fresh in this test
	}
	for i := range hot {
		insert("hot" + strconv.Itoa(i))
	}
	for i := range cold {
		insert("cold" + strconv.Itoa(i))
		if i%30 == 0 {
			for j := range hot {
				require.GreaterOrEqual(t, tb.Find("hot"+strconv.Itoa(j), tag("hot"+strconv.Itoa(j))), 0,
					"hot key %d evicted at cold key %d", j, i)
			}
		}
	}
	require.Equal(t, uint64(cold-(size-hot)), tb.Stats.LossyEvictions)
	consistent(t, &tb)
}
