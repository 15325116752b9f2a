package ratelimit

import "time"

// SetLockWaits makes every hold of a store's shard lock that finds the
// lock held call f, with the lock held, once it has the lock: how long it
// waited, and whether it came to the mutex's wait rather than spinning
// (see storeShard.contend). nil stops it.
func SetLockWaits(f func(wait time.Duration, locked bool)) {
	if f == nil {
		lockWaits.Store(nil)
		return
	}
	lockWaits.Store(&f)
}

// SetInsertAllocs makes every allocation a store's insertion makes outside
// its shard's lock (see storeShard.ready) call f with how long it took.
// nil stops it.
func SetInsertAllocs(f func(time.Duration)) {
	if f == nil {
		insertAllocs.Store(nil)
		return
	}
	insertAllocs.Store(&f)
}

// StoreHolds reports whether s has an entry for key, fresh or not, without
// marking it used.
func StoreHolds(s *Store, key string) bool { return s.core.holds(key) }

// StoreSpinning reports whether a shard of s is marked as held by an
// insertion, which makes checks that wait for its lock spin.
func StoreSpinning(s *Store) bool { return s.core.spinning() }

// StoreAllocations returns how many arrays and headers the tables of s's
// shards have allocated under their shards' locks.
func StoreAllocations(s *Store) uint64 { return s.core.allocations() }

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
