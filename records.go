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
// What a move carries in is held in full until the instant the rule it was
// spent under would have made it whole, and given back whole then, as a
// fixed window gives its count back at its end: never sooner, whatever the
// rule that holds it meanwhile. It is kept as at most two amounts, each
// with its instant (x0 given back at until0, x at until, the later), for
// what a key carries comes back at different instants. When the key moves
// on, it carries what of those amounts is not yet given back, plus what
// its state shows beyond what it was given (what it was admitted since,
// given back when that state would be whole); of three amounts, the two
// whose instants are nearest are kept as one, at the later instant. So a
// rule that gives a move back sooner (a bucket refills at its own rate, or
// a window ends) or caps it (the new capacity is smaller) does so only
// while it holds the key.
type planRecord struct {
	plan    uint64 // the id of the plan whose stores hold the key (see builtPlan)
	lineage uint64 // and its lineage
	at      int64  // the instant of the last move
	until   int64  // when x is given back, and the state was given it all back
	x       int64  // what it carried in, before the new capacity's cap
	held    int64  // what the state it was given held at at (x0 and x, capped)
	until0  int64  // when x0 is given back: before until
	x0      int64  // what it carried in that is given back at until0
}

// tranche is an amount a key's record holds until an instant (see
// planRecord).
type tranche struct{ x, until int64 }

// pending returns what of the record's amounts is still held at now, and
// what the key's state was admitted since the move (since), given back at
// whole, as at most two tranches, the later last: of three, the two whose
// instants are nearest are merged at the later instant (sums saturate,
// see satAdd).
func (r *planRecord) pending(since, whole, now int64) [2]tranche {
	var ts [3]tranche
	n := 0
	for _, t := range [3]tranche{{r.x0, r.until0}, {r.x, r.until}, {since, whole}} {
		if t.x > 0 && t.until > now {
			ts[n] = t
			n++
		}
	}
	for i := 1; i < n; i++ { // by instant
		for j := i; j > 0 && ts[j].until < ts[j-1].until; j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
	if n == 3 {
		if ts[1].until-ts[0].until <= ts[2].until-ts[1].until {
			ts[1].x = satAdd(ts[0].x, ts[1].x)
			ts[0], ts[1], ts[2] = ts[1], ts[2], tranche{}
		} else {
			ts[2].x = satAdd(ts[1].x, ts[2].x)
			ts[1], ts[2] = ts[2], tranche{}
		}
		n = 2
	}
	if n == 2 && ts[0].until == ts[1].until {
		ts[1].x = satAdd(ts[0].x, ts[1].x)
		ts[0] = tranche{}
	}
	if n == 1 {
		ts[1], ts[0] = ts[0], tranche{}
	}
	return [2]tranche{ts[0], ts[1]}
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

// names reports whether key's record names plan id, if its shard's lock is
// free (as add, it must not wait).
func (r *planRecords) names(key string, id uint64) bool {
	k := r.prepare(key)
	sh := &r.shards[k.h&r.mask]
	if !sh.mu.TryLock() {
		return false
	}
	defer sh.mu.Unlock()
	rec := sh.t.Find(k.key, k.tag)
	return rec != nil && rec.plan == id
}
