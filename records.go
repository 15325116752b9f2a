package ratelimit

import (
	"hash/maphash"
	"sync"

	"github.com/ratekit/ratelimit/internal/table"
)

// planRecord is what a [Plans] remembers of a key, apart from its state:
// the plan whose stores hold that state, so that a key that moves (or
// whose plan an Update replaced) is found in one place whatever the number
// of plans and replaced rule sets. It is 16 bytes, as small as a store's
// state of two words, since every key new to the rule set gets one; what
// the key's last move carried into that plan's first layer, which only a
// key that moved has, is a moveRecord kept beside it (see planRecords).
type planRecord struct {
	// plan is the id of the plan whose stores hold the key (see builtPlan),
	// with recordCarries set if the key has a moveRecord.
	plan    uint64
	lineage uint64 // the plan's lineage
}

// recordCarries marks, in a planRecord's plan, a record with a moveRecord.
// Plan ids are counted from 1 and never come near it.
const recordCarries = 1 << 63

// id returns the id of the plan the record names.
func (r *planRecord) id() uint64 { return r.plan &^ recordCarries }

// carries reports whether the key has a moveRecord.
func (r *planRecord) carries() bool { return r.plan&recordCarries != 0 }

// moveRecord is what a key's last move carried into the first layer of the
// plan that holds it (see [Migration]).
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
// while it holds the key. The zero moveRecord carries nothing.
type moveRecord struct {
	at     int64 // the instant of the last move
	until  int64 // when x is given back, and the state was given it all back
	x      int64 // what it carried in, before the new capacity's cap
	held   int64 // what the state it was given held at at (x0 and x, capped)
	until0 int64 // when x0 is given back: before until
	x0     int64 // what it carried in that is given back at until0
}

// tranche is an amount a key's move record holds until an instant (see
// moveRecord).
type tranche struct{ x, until int64 }

// pending returns what of the record's amounts is still held at now, and
// what the key's state was admitted since the move (since), given back at
// whole, as at most two tranches, the later last: of three, the two whose
// instants are nearest are merged at the later instant (sums saturate,
// see satAdd).
func (r *moveRecord) pending(since, whole, now int64) [2]tranche {
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
// as a store is, each shard behind a plain lock. Each shard keeps its keys'
// planRecords in one table, and the moveRecords of those that carry one
// (see planRecord.carries) in another, bounded alike. Neither holds
// anything as good as none: a moveRecord whose amounts are given back may
// still tell what of its key's state is not the key's own (a fixed window
// holds a count to its window's end), and dropping it would change what
// the key's next move carries from what a backend's move record gives
// (see MoveState). A moveRecord dropped to make room loses its amounts as
// the record's loss would (see Plans): the key's next move carries only
// what its state shows. A moveRecord is found only through a record that
// carries one: one that outlives its record (dropped to make room) is never
// read; Reset drops both. A record's shard is locked before any store
// shard, and only by an attempt that adds or moves a key (see
// Plans.lockPlan), never by the check of a key its plan's stores hold; an
// attempt that holds store shards may only try its lock (add, absent),
// never wait for it.
type planRecords struct {
	seed   maphash.Seed
	mask   uint64
	shards []recordShard
}

type recordShard struct {
	mu sync.Mutex
	t  table.Table[planRecord]
	c  table.Table[moveRecord] // keyed as t
	_  [64]byte                // keeps neighbouring shards' locks off each other's cache lines
}

// init readies the table for at most maxKeys records over shards shards
// (a power of two no larger than maxKeys), allocated at once if prealloc,
// hashing keys with seed (the seed of the Plans' stores).
func (r *planRecords) init(seed maphash.Seed, maxKeys, shards int, prealloc bool) {
	r.seed = seed
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
		// Every key new to the rule set adds a record as well as its
		// state, so a key's first check would cost two stores' insertions:
		// the records' table grows by halves, whose insertions copy and
		// allocate far less, for more slack per record.
		r.shards[i].t.GrowInHalves()
		r.shards[i].c.Init(share, func(*moveRecord, int64) bool { return false })
		if prealloc {
			r.shards[i].t.Preallocate()
		}
	}
}

// prepare digests a long key and hashes it, as the Plans' stores do (with
// the same seed: a key a store prepared is the record's key too).
func (r *planRecords) prepare(key string) storeKey { return prepareKey(r.seed, key) }

// add records rec for k, a prepared key, if it has no record and its
// shard's lock is free (the caller may hold store locks: it must not
// wait), and reports whether it did.
func (r *planRecords) add(k storeKey, rec planRecord, now int64) bool {
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

// look returns the plan id of the record of k, a prepared key, and
// whether it has one, if its shard's lock is free (locked is false, and
// so is found, if it is not: as add, it must not wait).
func (r *planRecords) look(k storeKey) (id uint64, found, locked bool) {
	sh := &r.shards[k.h&r.mask]
	if !sh.mu.TryLock() {
		return 0, false, false
	}
	defer sh.mu.Unlock()
	if rec := sh.t.Find(k.key, k.tag); rec != nil {
		return rec.id(), true, true
	}
	return 0, false, true
}

// carry returns the moveRecord of rec, the record of k in shard sh, which
// the caller holds: the zero one if rec carries none.
func (sh *recordShard) carry(k storeKey, rec *planRecord) moveRecord {
	if rec.carries() {
		if m := sh.c.Lookup(k.key, k.tag); m != nil {
			return *m
		}
	}
	return moveRecord{}
}

// setCarry makes m the moveRecord of rec, the record of k in shard sh,
// which the caller holds, at now: none if m carries nothing (its held is 0).
func (sh *recordShard) setCarry(k storeKey, rec *planRecord, m moveRecord, now int64) {
	had := rec.carries()
	rec.plan &^= recordCarries
	if m.held <= 0 {
		if had {
			sh.c.Delete(k.key, k.tag)
		}
		return
	}
	p := sh.c.Find(k.key, k.tag)
	if p == nil {
		var ok bool
		if p, ok = sh.c.Insert(k.key, k.tag, now); !ok {
			return // no room (the table's bound is 0): the key carries nothing
		}
	}
	*p = m
	rec.plan |= recordCarries
}
