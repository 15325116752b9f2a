package ratelimit

// StoreHolds reports whether s has an entry for key, fresh or not, without
// marking it used.
func StoreHolds(s *Store, key string) bool { return s.core.holds(key) }

// StoreSpinning reports whether a shard of s is marked as held by an
// insertion, which makes checks that wait for its lock spin.
func StoreSpinning(s *Store) bool { return s.core.spinning() }
