package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// remote is what a [Lockout] and an [InFlight] share with a [Store] for
// talking to Redis: the client, the options, the circuit breakers and the
// counters of calls Redis did not answer.
type remote struct {
	rdb   redis.UniversalClient
	o     options
	guard bool // the client may not stop at a context's deadline
	br    *circuit

	failures, circuitRefusals, invalid atomic.Uint64
}

// newRemote validates opts for rdb, over defaults (applied first, so that
// opts override them).
func newRemote(rdb redis.UniversalClient, defaults, opts []Option) (*remote, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil client", ratelimit.ErrInvalidOption)
	}
	o, err := buildOptions(append(defaults[:len(defaults):len(defaults)], opts...))
	if err != nil {
		return nil, err
	}
	guard := !honoursContext(rdb)
	return &remote{rdb: rdb, o: o, guard: guard, br: newCircuit(rdb, guard)}, nil
}

// call runs script on keys with args within ctx, bounded by the timeout
// when ctx has no deadline, through the circuit of keys[0]'s master. An
// error the script raised is returned as it is; any other failure is
// counted and wraps [ErrUnavailable] (or [ErrCircuitOpen], without trying
// Redis).
func (r *remote) call(ctx context.Context, script *redis.Script, keys []string, args ...any) ([]any, error) {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	br := r.br.forKey(ctx, keys[0])
	probe, ok := br.allow(time.Now(), r.o.pause)
	if !ok {
		r.circuitRefusals.Add(1)
		r.failures.Add(1)
		return nil, ErrCircuitOpen
	}
	reply, err := runScript(ctx, r.rdb, script, r.guard, keys, args)
	if err != nil && !isStateError(err) {
		r.failures.Add(1)
		br.failure(time.Now(), probe, r.o.failures, r.o.pause)
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	br.success(probe)
	return reply, err
}

// bounded returns ctx, or if it has no deadline, ctx bounded by the
// timeout.
func (r *remote) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, r.o.timeout)
}

// stats returns the counters, as a Store's [Stats].
func (r *remote) stats() Stats {
	return Stats{
		Failures:        r.failures.Load(),
		CircuitRefusals: r.circuitRefusals.Load(),
		InvalidStates:   r.invalid.Load(),
	}
}

// now is the client clock's instant, clamped into [0, MaxTime], and true;
// false when the server's TIME decides.
func (r *remote) now() (int64, bool) {
	if r.o.clock == nil {
		return 0, false
	}
	return clamp(r.o.clock.Now()), true
}

// clock returns the time base of the decisions: the client clock, or Unix
// time when the server's clock decides.
func (r *remote) clock() ratelimit.Clock {
	if r.o.clock == nil {
		return UnixClock()
	}
	return r.o.clock
}

// hashedKey is head, then the hex of a hash of key and a closing brace:
// with head ending in "{", the hash is the key's Cluster hash tag, the same
// for every kind of limiter, so that a Store's key and an InFlight's for
// the same key are in one slot.
func hashedKey(head, key string) string {
	sum := sha256.Sum256([]byte(key))
	var b strings.Builder
	b.Grow(len(head) + 33)
	b.WriteString(head)
	b.WriteString(hex.EncodeToString(sum[:16]))
	b.WriteByte('}')
	return b.String()
}

// shortHash is the hex of the first 4 bytes of a hash of s: a rule's tag in
// its keys' names, as ruleTag gives a Store's.
func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}
