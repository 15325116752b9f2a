package ratelimit

import (
	"hash/maphash"
	"sync"

	"github.com/ratekit/ratelimit/internal/table"
)

// planRecord is what a [Plans] remembers of a key, apart from its state:
// the plan whose stores hold that state, so that a key that moves (or
// whose plan an Update replaced) is found in one place whatever the number
// of plans and replaced rule sets; and, for the first layer of that plan,
// what the key's last move carried in (see [Migration]).
//
// What a move carries in is given back evenly from the move to the instant
// the old rule would have made the key whole, whatever the rule that holds
// it meanwhile: when the key moves on, its state's amount is taken as that
// evenly given-back remainder, plus what it shows beyond what the state it
// was given would hold by then (what it was admitted since). So a rule
// that rounds a move up (a fixed window holds a count to its window's end,
// a bucket refills at its own rate) or down (the new capacity is smaller)
// does so only while it holds the key.
type planRecord struct {
	plan    uint64 // the id of the plan whose stores hold the key (see builtPlan)
	lineage uint64 // and its lineage
	at      int64  // the instant of the last move
	until   int64  // when what it carried in is given back in full
	x       int64  // what it carried in, before the new capacity's cap
	held    int64  // what the state it was given held at at (x, capped)
}

// linear returns ceil(x * (until-now) / (until-at)), what of x given back
// evenly from at to until is left at now (at <= now).
func linear(x, at, until, now int64) int64 {
	if x <= 0 || now >= until {
		return 0
	}
	return ceilMulDiv(x, until-now, until-at)
}

// planRecords is a rule set's table of key records: sharded and bounded
// as a store is, each shard behind a plain lock. A record's shard is
// locked before any store shard, and only by an attempt that adds or moves
// a key (see Plans.lockPlan), never by the check of a key its plan's stores
// hold; an attempt that holds store shards may only try its lock (add,
// absent), never wait for it.
type planRecords struct {
	seed   maphash.Seed
	mask   uint64
	shards []recordShard
}

type recordShard struct {
	mu sync.Mutex
	t  table.Table[planRecord]
	_  [64]byte // keeps neighbouring shards' locks off each other's cache lines
}

// init readies the table for at most maxKeys records over shards shards
// (a power of two no larger than maxKeys), allocated at once if prealloc.
func (r *planRecords) init(maxKeys, shards int, prealloc bool) {
	r.seed = maphash.MakeSeed()
	r.mask = uint64(shards - 1)
	r.shards = make([]recordShard, shards)
	for i := range r.shards {
		share := maxKeys / shards
		if i < maxKeys%shards {
			share++
		}
		// A record is never as good as none: it is dropped only to make
		// room, the least recently moved first.
		r.shards[i].t.Init(share, func(*planRecord, int64) bool { return false })
		if prealloc {
			r.shards[i].t.Preallocate()
		}
	}
}

// prepare digests a long key and hashes it, as a store does.
func (r *planRecords) prepare(key string) storeKey {
	long := len(key) > MaxKeyLen
	if long {
		key = digestKey(key)
	}
	h := maphash.String(r.seed, key)
	return storeKey{key: key, h: h, tag: table.Tag(h, long)}
}

// add records rec for key if key has no record and its shard's lock is
// free (the caller may hold store locks: it must not wait), and reports
// whether it did.
func (r *planRecords) add(key string, rec planRecord, now int64) bool {
	k := r.prepare(key)
	sh := &r.shards[k.h&r.mask]
	if !sh.mu.TryLock() {
		return false
	}
	defer sh.mu.Unlock()
	if sh.t.Find(k.key, k.tag) != nil {
		return false
	}
	p, _ := sh.t.Insert(k.key, k.tag, now) // nothing is pinned: always room
	*p = rec
	return true
}

// absent reports whether key has no record, if its shard's lock is free
// (false if it is not: see add).
func (r *planRecords) absent(key string) bool {
	k := r.prepare(key)
	sh := &r.shards[k.h&r.mask]
	if !sh.mu.TryLock() {
		return false
	}
	defer sh.mu.Unlock()
	return sh.t.Find(k.key, k.tag) == nil
}
