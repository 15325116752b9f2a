package ratelimit

// StoreHolds reports whether s has an entry for key, fresh or not, without
// marking it used.
func StoreHolds(s *Store, key string) bool { return s.core.holds(key) }
