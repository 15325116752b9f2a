package ratelimit

import (
	"context"
	"sort"
)

// Reset makes lim start again as a fresh limiter, full, whatever it had
// spent: an administrative action, such as forgiving a client locked out by
// mistake. It is linearizable with lim's checks: each check sees lim before
// the reset or after it. The limiter's clamp on time is kept (a clock that
// went back is still not trusted).
//
// lim must be a limiter built by [New]; any other is an error matching
// [errors.ErrUnsupported].
func Reset(lim Limiter) error {
	r, ok := lim.(resetter)
	if !ok {
		return unsupported("Reset", lim)
	}
	r.reset()
	return nil
}

// resetter is what the single-key limiters of this package offer for
// Reset.
type resetter interface{ reset() }

func (l *single[S, A]) reset() {
	l.tl.mu.Lock()
	var fresh S
	l.state = fresh
	l.tl.unlock()
}

// reset sets the TAT to the zero ("long ago") time; a Check racing with it
// either spends before it (and is forgotten) or after it. A state moved
// under the mutex stays there.
func (l *atomicGCRA) reset() {
	for {
		w := l.word.Load()
		if w == movedWord {
			l.mu.Lock()
			l.locked = vtime{}
			l.mu.Unlock()
			return
		}
		if l.word.CompareAndSwap(w, 0) {
			return
		}
	}
}

// Reset makes key start again as a fresh key, full, whatever it had spent:
// the store drops its entry (it holds one key fewer; the drop is not an
// eviction). It is linearizable with the key's checks. Resetting a key the
// store does not hold does nothing.
func (s *Store) Reset(key string) {
	layers := [1]compositeLayer{{store: s.core}}
	resetLayers(layers[:], s.core.clock(), key)
}

// Reset makes key start again as a fresh key in every layer, shadow layers
// included, at one instant: each layer drops the entry of its own key
// (Layer.Key of key). A layer whose Key maps many keys to one (a global
// limit, say) drops that one shared entry, so resetting any key resets the
// shared allowance for every key: reset the key of a store of its own when
// that is not wanted. Layer keys a store does not hold are left alone.
func (c *Composite) Reset(key string) {
	resetLayers(c.layers, c.clock, key)
}

// resetLayers drops key's entry in every layer, with every layer's shard
// locked in the order tryLayers uses, so that no attempt sees some layers
// reset and others not.
func resetLayers(layers []compositeLayer, clock Clock, key string) {
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, 1, buf[:0])
	now := clampTime(clock.Now())
	for i := range turns {
		now = max(now, layers[i].store.lockShard(turns[i].shard, now))
	}
	for i := range turns {
		_, _, _ = layers[i].store.take(turns[i].k, now)
	}
	for i := len(turns) - 1; i >= 0; i-- {
		layers[i].store.unlockShard(turns[i].shard)
	}
}

// Reset makes key start again as a fresh key under its plan, as
// [Composite.Reset] does over the plan's layers (a layer with a Key, such
// as a global limit, included: its shared entry is reset for every key
// that maps to it), and drops what the rule set still holds of the key's
// own elsewhere: its entries in the layers without a Key of every plan of
// the rule set and of the plan it was last checked under (which may be a
// plan an Update replaced), and its record, so that no earlier state of
// the key can move back to it later, nor refuse it on a plan it comes back
// to. (A move onto a plan whose layer at some place has a Key leaves the
// key's own state at that place in the plan it came from, while its record
// names the plan it moved to when that plan has a layer of the key's own:
// a record names one plan, so a Reset looks for the key's own state in
// every plan.) The layers with a Key of other plans are left as they are
// (other keys on them share them), unless the record names an earlier
// version of the key's plan that an Update replaced: its shared entries
// are then the plan's, waiting to move into its new layers, and are reset
// with the plan's. It is atomic with the key's checks and with Update, and
// it locks a shard of every store of the rule set that has a layer without
// a Key: its cost grows with the number of plans.
func (p *Plans) Reset(key string) {
	// Holding Updates off for the whole reset, taken before the record's
	// lock (see fence), it cannot be started over by them.
	p.update.RLock()
	defer p.update.RUnlock()
	rk := p.records.prepare(key)
	rs := &p.records.shards[rk.h&p.records.mask]
	rs.mu.Lock()
	defer rs.mu.Unlock()
	g := p.gen.Load()
	// The stores to reset, each with the key's entry there.
	at := map[keyedStore]storeKey{}
	add := func(l compositeLayer) {
		if _, ok := at[l.store]; !ok {
			at[l.store] = l.store.prepare(layerKey(l.key, key))
		}
	}
	cur := p.plan(context.Background(), g, key)
	for _, l := range cur.comp.layers {
		add(l)
	}
	for _, bp := range g.byName {
		for _, l := range bp.comp.layers {
			if l.key == nil {
				add(l)
			}
		}
	}
	if rec := rs.t.Lookup(rk.key, rk.tag); rec != nil {
		if from := g.recorded(rec); from != nil {
			// A plan the key's plan replaced holds the shared entries an
			// Update has yet to move into the plan's new layers: they are
			// the plan's, and are reset with it.
			same := from.bp.lineage == cur.lineage
			for _, l := range from.bp.comp.layers {
				if l.key == nil || same {
					add(l)
				}
			}
		}
	}
	locks := make([]shardLock, 0, len(at))
	for st, k := range at {
		locks = append(locks, shardLock{store: st, shard: st.shardIndex(k)})
	}
	// In lockAll's order already, which its sort then only checks.
	sort.Slice(locks, func(i, j int) bool { return locks[i].store.id() < locks[j].store.id() })
	now := lockAll(locks, clampTime(p.clock.Now()), false)
	for _, l := range locks {
		_, _, _ = l.store.take(at[l.store], now)
	}
	if rec := rs.t.Lookup(rk.key, rk.tag); rec != nil && rec.carries() {
		rs.c.Delete(rk.key, rk.tag) // its moveRecord goes with it, rather than take room
	}
	rs.t.Delete(rk.key, rk.tag)
	unlockAll(locks)
}
