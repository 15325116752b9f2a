package ratelimit

// StoreHolds reports whether s has an entry for key, fresh or not, without
// marking it used.
func StoreHolds(s *Store, key string) bool { return s.core.holds(key) }

// StoreSpinning reports whether a shard of s is marked as held by an
// insertion, which makes checks that wait for its lock spin.
func StoreSpinning(s *Store) bool { return s.core.spinning() }

// StoreHoldMarks takes key's shard in s as a composite's turn does (the
// shard locked, the key acquired) and reports whether the shard was marked
// as held by an insertion while held, and whether it still is once
// released.
func StoreHoldMarks(s *Store, key string) (held, after bool) {
	k := s.core.prepare(key)
	i := s.core.shardIndex(k)
	s.core.lockShard(i, 0)
	if !s.core.acquire(k, 0) {
		panic("no room")
	}
	held = s.core.spinning()
	s.core.unlockShard(i)
	return held, s.core.spinning()
}
