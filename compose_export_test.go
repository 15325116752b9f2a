package ratelimit

// LayerCheck checks key on layer i of c directly, bypassing the other
// layers, so that a test can look at one layer's state.
func LayerCheck(c *Composite, i int, key string, cost Units) (Decision, error) {
	return c.layers[i].store.check(key, cost)
}

// LayerSpinning reports whether a shard of layer i's store is marked as
// held by an insertion.
func LayerSpinning(c *Composite, i int) bool { return c.layers[i].store.spinning() }
