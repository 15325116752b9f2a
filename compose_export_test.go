package ratelimit

// LayerCheck checks key on layer i of c directly, bypassing the other
// layers, so that a test can look at one layer's state.
func LayerCheck(c *Composite, i int, key string, cost Units) (Decision, error) {
	return c.layers[i].store.check(key, cost)
}

// LayerSpinning reports whether a shard of layer i's store is marked as
// held by an insertion.
func LayerSpinning(c *Composite, i int) bool { return c.layers[i].store.spinning() }

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
