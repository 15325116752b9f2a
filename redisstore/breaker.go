package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// breaker is a lock-free circuit breaker. Closed, every check tries Redis.
// After enough consecutive failures it opens until a time; the first check
// after that time becomes the probe, moving the time on by a pause so that
// the others keep failing fast while it runs. A success closes it.
type breaker struct {
	fails     atomic.Int64
	openUntil atomic.Int64 // Unix ns; 0 when closed
}

// allow reports whether a check may try Redis, and whether it is a probe.
func (b *breaker) allow(now time.Time, pause time.Duration) (probe, ok bool) {
	return b.allowRead(b.openUntil.Load(), now, pause)
}

// allowRead is allow for a check that read the circuit as open until
// until (0: closed), which other checks may have changed since: of the
// checks that read the same until past its pause, only the first to move
// it on becomes the probe.
func (b *breaker) allowRead(until int64, now time.Time, pause time.Duration) (probe, ok bool) {
	if until == 0 {
		return false, true
	}
	t := now.UnixNano()
	if t < until {
		return false, false
	}
	if !b.openUntil.CompareAndSwap(until, t+int64(pause)) {
		return false, false // another check is the probe
	}
	return true, true
}

func (b *breaker) success(probe bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if probe || b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

func (b *breaker) failure(now time.Time, probe bool, threshold int, pause time.Duration) {
	if n := b.fails.Add(1); probe || n >= int64(threshold) {
		b.openUntil.Store(now.UnixNano() + int64(pause))
	}
}

// open reports whether the circuit is open.
func (b *breaker) open() bool { return b.openUntil.Load() != 0 }

// circuit is a Store's circuit breakers. On a [redis.ClusterClient] there
// is one per master, found by the address of the node that the client's
// slot map says serves the key's slot: a lost master then opens the
// circuit for the keys of its own slots only, and the live masters' keys
// go on being decided by Redis. Failures are correlated by master, not by
// slot (a dead master fails every slot it serves at once), so a breaker
// per master opens as soon as one per Redis would, for those keys. A key
// whose master the client cannot name (no slot map yet and none loadable)
// uses the one breaker, as does every key on any other client.
//
// Memory is bounded: at most maxMasters breakers by address; when that is
// full, those of closed circuits are dropped (a closed breaker with no
// failures holds nothing a fresh one would not), and if none is closed
// the key uses the one breaker.
type circuit struct {
	one     breaker
	cluster *redis.ClusterClient // nil unless the client is a Cluster client
	guard   bool                 // the client may not stop at a context's deadline

	mu      sync.Mutex                          // serialises changes to masters
	masters atomic.Pointer[map[string]*breaker] // by node address; replaced whole

	// mapped says the client has a slot map: a lookup has succeeded, and
	// the client, which replaces its map but never drops it, answers every
	// lookup after from memory, so a guarded one needs no goroutine.
	mapped atomic.Bool
}

// maxMasters bounds the breakers a circuit keeps by master address.
const maxMasters = 256

// newCircuit returns the circuit for rdb; guard says rdb may not stop at a
// context's deadline (see runScript).
func newCircuit(rdb redis.UniversalClient, guard bool) *circuit {
	c := &circuit{guard: guard}
	if cl, ok := rdb.(*redis.ClusterClient); ok {
		c.cluster = cl
	}
	return c
}

// forKey returns the breaker for the Redis key rk. On a Cluster client it
// reads the client's slot map, which it loads first if it has none (within
// ctx).
func (c *circuit) forKey(ctx context.Context, rk string) *breaker {
	if c.cluster == nil {
		return &c.one
	}
	addr, ok := c.master(ctx, rk)
	if !ok {
		return &c.one
	}
	return c.byAddr(addr)
}

// byAddr returns the breaker of the master at addr, adding one if there is
// room (see circuit).
func (c *circuit) byAddr(addr string) *breaker {
	if m := c.masters.Load(); m != nil {
		if b := (*m)[addr]; b != nil {
			return b
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[string]*breaker
	if m := c.masters.Load(); m != nil {
		old = *m
	}
	if b := old[addr]; b != nil {
		return b
	}
	next := make(map[string]*breaker, len(old)+1)
	for a, b := range old {
		if len(old) < maxMasters || b.open() || b.fails.Load() != 0 {
			next[a] = b
		}
	}
	if len(next) >= maxMasters {
		return &c.one
	}
	b := &breaker{}
	next[addr] = b
	c.masters.Store(&next)
	return b
}

// master returns the address of the master serving rk's slot. Only a
// client without a slot map yet goes to the network for it; one that may
// not stop at ctx's deadline then does so on a goroutine of its own, which
// the caller stops waiting for at the deadline.
func (c *circuit) master(ctx context.Context, rk string) (string, bool) {
	if !c.guard || c.mapped.Load() {
		addr := c.lookup(ctx, rk)
		return addr, addr != ""
	}
	ch := make(chan string, 1)
	go func() { ch <- c.lookup(ctx, rk) }()
	select {
	case addr := <-ch:
		return addr, addr != ""
	case <-ctx.Done():
		return "", false
	}
}

// lookup returns the address of the master serving rk's slot, or "" if the
// client cannot name it.
func (c *circuit) lookup(ctx context.Context, rk string) string {
	node, err := c.cluster.MasterForKey(ctx, rk)
	if err != nil {
		return ""
	}
	if !c.mapped.Load() {
		c.mapped.Store(true)
	}
	return node.Options().Addr
}
