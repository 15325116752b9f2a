package redisstore

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
)

// The deny cache answers, without a round trip, a request that Redis would
// refuse: a client far over its limit then costs nothing on the server.
//
// Why its refusals are Redis's. When Redis refuses a key, the store keeps
// the key's state as the script left it (what it read, with the refusal's
// instant as the key's latest) and the instant the script decided at.
// Nothing another process checks can make that key admit sooner: checks
// only spend, and a refused check changes nothing but the key's latest
// instant. So at a later instant, a request that the kept state refuses
// (the rule's Machine decides, on that state, without committing) is
// refused by Redis too, whatever else has been checked meanwhile.
//
// Which instant. With a client clock it is that clock's reading, which is
// what Redis would be told. With the server's clock Redis's time now is not
// known exactly: Redis decided at its instant at some moment between when
// the request was sent and when its reply came back, so its time now is at
// least that instant plus the local time since the reply came back (the
// earliest) and at most that instant plus the time since the request was
// sent (the latest). The refusal is decided at the latest, so that it is
// one Redis makes whenever in that span it decides; the Decision is
// reported from the earliest (its At, and RetryAfter and ResetAfter
// lengthened by the span), so that a client that waits RetryAfter out is
// never early, and At never runs ahead of an answer Redis gives after.
//
// What others may have spent. Another process may have been admitted on
// the key since the refusal, at most what the kept state could admit by
// the latest instant: Redis then refuses the same request for longer. The
// Decision is therefore that of the worst case, the kept state with all
// it could admit spent at the latest instant (spent then, it ages out
// last): its RetryAfter and ResetAfter are never shorter than Redis's, and
// its Remaining (0) never higher. When the kept state could have admitted
// nothing since, nobody could have spent, and the Decision is exactly
// Redis's (for the server's clock, as if Redis's time were the earliest).
// Once the kept state would admit the request at the latest instant, the
// request goes to Redis and the entry is dropped.
//
// Where it does not hold: a key whose state is taken back or cleared
// behind the cache's back admits sooner in Redis than the cache knows, and
// the cache keeps refusing until its own instant; a settlement charged by
// another process can put the key in debt beyond what the kept state
// could admit, and Redis then refuses longer than the cache says. A refund
// or a reset made through this store drops the key's entry (see drop), and
// a charge made through it replaces the entry (see charged), but those of
// another process, or a Redis that lost the key to eviction or a restart,
// are not seen here. [WithDenyCache](0) turns it off.
//
// A check in flight while this process refunds or resets its key may carry
// back a refusal Redis made before the refund: the generation makes remember
// ignore every refusal from a check sent before the latest drop.
//
// A Composite's cache. An entry is a request key's: the states of every
// layer as the script read them when every layer's refusal was decided
// (Redis writes nothing for a refused request, not even the instant). The
// argument above holds per layer key: whatever request keys share a layer's
// key (a global cap), checks only spend it, so a request that an enforced
// layer's kept state refuses is refused by that layer in Redis, and so by
// the Composite. The worst case drains every layer: others may have spent
// on any of them. The Decision still names the layer that refuses on the
// kept states, with the worst case's longest RetryAfter and lowest
// Remaining, and, since the layer Redis names may then be another, the
// longest ResetAfter of every layer in the worst case. Its own refunds,
// settlements and resets clear the whole cache (clear): another request
// key's entry may hold a layer's key they changed.

// denyCache holds recent refusals by Redis key (a Composite's by the
// request's layer keys), at most max of them.
type denyCache struct {
	mu      sync.Mutex
	max     int
	gen     atomic.Uint64 // counts drops; changed with mu held
	entries map[string]denied
}

// denied is one refusal as Redis made it.
type denied struct {
	states [][]byte  // the key's state (a Composite's layers') as the script left it, or as refusals answered here would have
	latest int64     // the latest instant the states record
	at     int64     // the instant the script decided at, ns
	sent   time.Time // when the request was sent, by the local monotonic clock
	recv   time.Time // when its reply came back, by the same clock
}

// maxCachedState bounds the states a refusal keeps (a sliding log's can
// be long): longer ones are not cached, and their key goes to Redis every
// time.
const maxCachedState = 1024

func newDenyCache(max int) *denyCache {
	if max <= 0 {
		return nil
	}
	return &denyCache{max: max, entries: make(map[string]denied)}
}

// judge is what a deny cache decides with: a Store's rule on its key's
// state ([oneKey]), or a Composite's layers on their states
// ([layeredJudge]).
type judge interface {
	// refusal decides cost at now on states, spending nothing, and
	// returns the states as a refusal leaves them in Redis.
	refusal(states [][]byte, now time.Duration, cost ratelimit.Units) (ratelimit.Decision, [][]byte, error)
	// worst returns d, a refusal of cost at now on states, as the worst
	// case makes it: as if other requests had spent, at now, all that the
	// states admit then (spent then, it ages out last). Its RetryAfter
	// and ResetAfter are never shorter, and its Remaining never higher,
	// than those of a refusal on states that spent less since.
	worst(d ratelimit.Decision, states [][]byte, now time.Duration, cost ratelimit.Units) ratelimit.Decision
}

// worstOf is d made as long and as low as w, a refusal of the same
// request in the worst case, still describing the limit d describes.
func worstOf(d, w ratelimit.Decision) ratelimit.Decision {
	if !w.Allowed {
		d.RetryAfter = max(d.RetryAfter, w.RetryAfter)
		d.ResetAfter = max(d.ResetAfter, w.ResetAfter)
		d.Remaining = min(d.Remaining, w.Remaining)
	}
	return d
}

// oneKey is a Store's judge: its rule's Machine on its one key.
type oneKey struct{ m *ratelimit.Machine }

func (j oneKey) refusal(states [][]byte, now time.Duration, cost ratelimit.Units) (ratelimit.Decision, [][]byte, error) {
	d, next, err := j.m.Step(states[0], now, cost, true) // a refusal records its instant
	return d, [][]byte{next}, err
}

func (j oneKey) worst(d ratelimit.Decision, states [][]byte, now time.Duration, cost ratelimit.Units) ratelimit.Decision {
	if drained := drain(j.m, states[0], now, cost); drained != nil {
		if w, _, err := j.m.Step(drained, now, cost, false); err == nil {
			return worstOf(d, w)
		}
	}
	return d
}

// drain returns state with the largest cost it admits at now spent, or
// nil if it admits nothing.
func drain(m *ratelimit.Machine, state []byte, now time.Duration, cost ratelimit.Units) []byte {
	d, _, err := m.Step(state, now, cost, false)
	if err != nil {
		return nil
	}
	// Remaining is in whole units, rounded down: the largest cost admitted
	// is from that up to a unit more, and below cost if cost is refused.
	lo := ratelimit.Units(d.Remaining) * ratelimit.Unit // admitted, or 0
	hi := lo + ratelimit.Unit - 1
	if d.Allowed {
		lo, hi = lo+cost, min(hi+cost, m.Params().Capacity)
	} else {
		hi = min(hi, cost-1)
	}
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if d, _, err := m.Step(state, now, mid, false); err == nil && d.Allowed {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo <= 0 {
		return nil
	}
	_, drained, err := m.Step(state, now, lo, true)
	if err != nil {
		return nil
	}
	return drained
}

// answer returns, for cost on the Redis key rk now, a refusal Redis would
// make, if a cached refusal shows that Redis would refuse it; ok is false
// otherwise (and a refusal that no longer refuses is dropped). clock is
// the store's client clock, or nil for the server's. The refusal is
// decided at the latest instant Redis's time can be, and the Decision is
// the worst case's from the earliest (see the top of this file): Allowed
// is Redis's, RetryAfter and ResetAfter never shorter, Remaining never
// higher.
//
// A refusal answered here is one Redis would have made, and a Store's
// Redis would have recorded its instant as the key's latest: the cached
// state records it instead. When the request goes to Redis after all,
// latest is that instant, for a client clock's reading to be clamped to,
// as Redis would have (0 when nothing was cached).
func (c *denyCache) answer(j judge, clock ratelimit.Clock, rk string, cost ratelimit.Units) (d ratelimit.Decision, ok bool, latest int64) {
	c.mu.Lock()
	e, found := c.entries[rk]
	c.mu.Unlock()
	if !found {
		return ratelimit.Decision{}, false, 0
	}
	var late, early time.Duration
	if clock != nil {
		late = clock.Now()
	} else {
		late = time.Duration(e.at) + time.Since(e.sent)
		early = time.Duration(e.at) + time.Since(e.recv)
	}
	d, next, err := j.refusal(e.states, late, cost)
	if err != nil || d.Allowed {
		c.forget(rk)
		return ratelimit.Decision{}, false, e.latest
	}
	// Other requests may have spent what the kept states admit: answer as
	// if they had.
	d = j.worst(d, next, late, cost)
	// On the server's clock d is decided at late (or at an instant a cached
	// answer recorded, if later): report it from early. A client clock's
	// reading, clamped to the state's latest instant, is Redis's instant.
	if clock == nil && d.At > early {
		shift := d.At - early
		d.At = early
		d.RetryAfter = saturatingAdd(d.RetryAfter, shift)
		d.ResetAfter = saturatingAdd(d.ResetAfter, shift)
	}
	e.states = next
	e.latest = latestOfAll(next)
	c.mu.Lock()
	if _, still := c.entries[rk]; still {
		c.entries[rk] = e
	}
	c.mu.Unlock()
	return d, true, 0
}

// saturatingAdd is a + b for b >= 0, at most the largest Duration.
func saturatingAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// latestOf returns the latest instant an encoded state records: its first
// number (see ratelimit.Machine).
func latestOf(state []byte) int64 {
	var v int64
	for _, b := range state {
		if b < '0' || b > '9' {
			break
		}
		v = v*10 + int64(b-'0')
	}
	return v
}

// latestOfAll returns the latest instant any of states records.
func latestOfAll(states [][]byte) int64 {
	var v int64
	for _, s := range states {
		v = max(v, latestOf(s))
	}
	return v
}

// remember keeps Redis's refusal of rk, made at the instant at, leaving
// states, for a request sent at sent whose reply came back at recv, while
// the cache was at generation gen.
func (c *denyCache) remember(rk string, states [][]byte, at int64, sent, recv time.Time, gen uint64) {
	size := 0
	for _, s := range states {
		size += len(s)
	}
	if size > maxCachedState {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen.Load() {
		return // a refund or reset since may have made the refusal wrong
	}
	if _, found := c.entries[rk]; !found && len(c.entries) >= c.max {
		// Full: drop one entry (map order: arbitrary). Dropping one costs
		// a round trip for its key, nothing else.
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[rk] = denied{states: states, latest: latestOfAll(states), at: at, sent: sent, recv: recv}
}

// charged replaces rk's cached refusal, if any, by the state a
// settlement's charge wrote, computed at the instant at Redis read for a
// request sent at sent whose reply came back at recv: the key spends more
// than the cached state says, and answers must be Redis's. It makes
// remember ignore the refusals of checks sent before, which carry a state
// from before the charge.
func (c *denyCache) charged(rk string, state []byte, at int64, sent, recv time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.Add(1)
	if _, found := c.entries[rk]; !found {
		return
	}
	if len(state) > maxCachedState {
		delete(c.entries, rk)
		return
	}
	c.entries[rk] = denied{states: [][]byte{state}, latest: latestOf(state), at: at, sent: sent, recv: recv}
}

// forget drops rk's cached refusal, if any.
func (c *denyCache) forget(rk string) {
	c.mu.Lock()
	delete(c.entries, rk)
	c.mu.Unlock()
}

// generation returns the count of drops so far, for a check to pass to
// remember.
func (c *denyCache) generation() uint64 { return c.gen.Load() }

// drop forgets rk's cached refusal after its key was refunded or reset,
// and makes remember ignore the refusals of checks sent before.
func (c *denyCache) drop(rk string) {
	c.mu.Lock()
	delete(c.entries, rk)
	c.gen.Add(1)
	c.mu.Unlock()
}

// clear forgets every cached refusal, as drop does one key's: after a
// Composite's refund, settlement or reset, which may have taken back what
// a layer's key, shared by other requests' entries, had spent.
func (c *denyCache) clear() {
	if c == nil {
		return
	}
	c.mu.Lock()
	clear(c.entries)
	c.gen.Add(1)
	c.mu.Unlock()
}

// floor returns the latest instant rk's cached refusal records, or 0: the
// instant a client clock's reading is raised to for rk, as for a check.
func (c *denyCache) floor(rk string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[rk].latest
}
