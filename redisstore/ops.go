package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// ErrConflict was returned by a leaky bucket's CheckWithin and Wait (a
// [Store]'s, and a [Composite]'s with a leaky bucket layer) when they were
// computed in Go and written with a compare-and-set that concurrent
// requests kept changing under them. They now run in one script, as every
// check, refund and settlement of a Store and a Composite does, and no
// operation of this package returns it.
//
// Deprecated: nothing returns it; errors.Is(err, ErrConflict) is always
// false.
var ErrConflict = errors.New("redisstore: compare-and-set conflicted with concurrent requests on every attempt")

// opsScript reads and resets keys (see ops.lua).
//
//go:embed ops.lua
var opsLua string

var opsScript = redis.NewScript(opsLua)

// opReply is the ops script's reply: the instant it read, and the states
// it read (none for a reset).
type opReply struct {
	instant int64
	states  [][]byte
}

// parseOp reads the ops script's reply for n keys.
func parseOp(reply []any, n int) (opReply, error) {
	var r opReply
	status, ok1 := reply0(reply)
	reading, ok2 := str(reply, 1)
	at, err := strconv.ParseInt(reading, 10, 64)
	if !ok1 || status != 1 || !ok2 || err != nil || (len(reply) != 2 && len(reply) != 2+n) {
		return r, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	r.instant = at
	if len(reply) == 2 {
		return r, nil
	}
	r.states = make([][]byte, n)
	for i := range n {
		s, ok := str(reply, 2+i)
		if !ok {
			return r, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
		}
		r.states[i] = []byte(s)
	}
	return r, nil
}

// oneState returns the one state a read of one key replies with, or an
// error wrapping ErrMismatch (counted) for a reply without it.
func (s *Store) oneState(r opReply) ([]byte, error) {
	if len(r.states) != 1 {
		s.mismatches.Add(1)
		return nil, fmt.Errorf("%w: no state in the reply", ErrMismatch)
	}
	return r.states[0], nil
}

func reply0(reply []any) (int64, bool) {
	if len(reply) == 0 {
		return 0, false
	}
	v, ok := reply[0].(int64)
	return v, ok
}

// withTimeout gives ctx the deadline d from now if it has none.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// op runs the ops script on the store's key rk, through the circuit
// breaker. floor is the latest instant the store used for rk without
// telling Redis (see args).
func (s *Store) op(ctx context.Context, rk string, floor int64, args ...any) (opReply, error) {
	reply, err := s.runOn(ctx, rk, floor, opsScript, args...)
	if err != nil {
		return opReply{}, err
	}
	r, err := parseOp(reply, 1)
	if err != nil {
		s.mismatches.Add(1)
	}
	return r, err
}

// runOn runs script on the store's key rk, with the instant to use (or an empty string
// for the server's TIME) before args, through the circuit breaker. floor
// is as for op.
func (s *Store) runOn(ctx context.Context, rk string, floor int64, script scriptRunner, args ...any) ([]any, error) {
	now := ""
	if s.clock != nil {
		now = strconv.FormatInt(max(clamp(s.clock.Now()), floor), 10)
	}
	br := s.br.forKey(ctx, rk)
	probe, ok := br.allow(time.Now(), s.o.pause)
	if !ok {
		return nil, ErrCircuitOpen
	}
	reply, err := runScript(ctx, s.rdb, script, s.guard, []string{rk}, append([]any{now}, args...))
	if err != nil {
		if isStateError(err) {
			br.success(probe)
			s.invalid.Add(1)
			return nil, fmt.Errorf("%w: redis key %q: %v", ratelimit.ErrInvalidState, clipKey(rk), err)
		}
		br.failure(time.Now(), probe, s.o.failures, s.o.pause)
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	br.success(probe)
	return reply, nil
}

// floor is the deny cache's floor for rk (see denyCache.floor).
func (s *Store) floor(rk string) int64 {
	if s.deny == nil {
		return 0
	}
	return s.deny.floor(rk)
}

// Peek is PeekContext with a background context.
func (s *Store) Peek(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return s.PeekContext(context.Background(), key, cost)
}

// PeekContext returns the Decision that [Store.CheckContext] would give
// cost for key now, spending nothing and writing nothing: the same
// Decision, field for field, as a check at the same instant, judged on the
// key's state as Redis holds it, as [ratelimit.Store.Peek] does. A rule
// with CountRefused reports a refusal as a check would, and counts
// nothing. It costs one round trip (a read), and is not reported to the
// observer.
//
// Its errors are CheckContext's. When Redis fails, the error wraps
// [ErrUnavailable] and the Decision is the failure policy's, spending
// nothing: fail open's fresh key, fail closed's refusal, or the
// fallback's Peek(key, cost) if it has one (a [ratelimit.Store] does),
// else the failure mode's.
func (s *Store) PeekContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	if cost <= 0 || cost > s.p.Capacity {
		d, _, err := s.m.Step(nil, 0, cost, false)
		return d, err
	}
	ctx, cancel := withTimeout(ctx, s.o.timeout)
	defer cancel()
	rk := s.Key(key)
	r, err := s.op(ctx, rk, s.floor(rk), "r")
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return degradedPeek(s.o.fallback, key, cost, err, s.failureMode)
		}
		return s.refused(), err
	}
	state, err := s.oneState(r)
	if err != nil {
		return s.refused(), err
	}
	d, _, err := s.m.Step(state, time.Duration(r.instant), cost, false)
	if err != nil {
		s.invalid.Add(1)
		return s.refused(), fmt.Errorf("key %q: %w", clipKey(key), err)
	}
	return d, nil
}

// degradedPeek is the failure policy's Decision for a Peek, spending
// nothing anywhere: fb's Peek if fb has one, else mode's Decision.
func degradedPeek(fb ratelimit.KeyedLimiter, key string, cost ratelimit.Units, cause error, mode func(ratelimit.Units) ratelimit.Decision) (ratelimit.Decision, error) {
	if p, ok := fb.(interface {
		Peek(string, ratelimit.Units) (ratelimit.Decision, error)
	}); ok {
		d, err := p.Peek(key, cost)
		if err != nil {
			return d, errors.Join(cause, err)
		}
		return d, cause
	}
	return mode(cost), cause
}

// Refund is RefundContext with a background context.
func (s *Store) Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	return s.RefundContext(context.Background(), key, cost, at)
}

// RefundContext gives back up to cost of what key was admitted at the
// instant at (the admitting Decision's At), exactly as
// [ratelimit.Store.Refund] does (its documentation gives the amounts per
// algorithm), and returns how much it gave back. A key Redis does not hold
// gives back nothing and is not created. A cost of zero or less is an error
// matching [ratelimit.ErrInvalidCost], and reaches no server; a cost above
// the rule's capacity is capped at it. An at later than the store's time is
// taken as that time.
//
// The refund is made at the store's instant (the Redis server's TIME, or
// the client clock, raised to the key's latest instant as for a check),
// keeping the key's expiry. It is one script, one round trip, atomic with
// the key's checks, on every rule: it never conflicts, however hot the
// key. The store checks its amount and state against the rule's
// [ratelimit.Machine] on the state and instant the script read (an error
// wrapping [ErrMismatch] if they disagree, which would be a bug). It drops
// the key's refusal from this store's deny cache; other processes' caches
// do not know of it (see [WithDenyCache]).
//
// ctx bounds the whole refund; without a deadline, the store's timeout
// does. When Redis fails the error wraps [ErrUnavailable] and nothing is
// given back, except that a failure after the write was sent (a missed
// deadline, a lost connection) leaves it unknown whether the write was
// made: the refund then returns 0 with the error although it may have
// been made. Do not retry a failed refund blindly: a refund made twice
// gives back twice (within the bounds above). A corrupted state is an
// error matching [ratelimit.ErrInvalidState], and nothing is written.
func (s *Store) RefundContext(ctx context.Context, key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	if cost <= 0 {
		_, _, err := s.m.Refund(nil, 0, 0, cost)
		return 0, err
	}
	ctx, cancel := withTimeout(ctx, s.o.timeout)
	defer cancel()
	rk := s.Key(key)
	return s.refundInScript(ctx, key, rk, cost, at)
}

// Settle is SettleContext with a background context.
func (s *Store) Settle(key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	return s.SettleContext(context.Background(), key, charged, actual, at)
}

// SettleContext settles a request admitted for key at the instant at (the
// admitting Decision's At) that was charged an estimate, charged, and
// turned out to cost actual, exactly as [ratelimit.Store.Settle] does (its
// documentation gives the debt bound per algorithm), and returns the
// Decision a [Store.PeekContext] of cost charged would get just after, and
// the request's cost as settled. A cost above charged is charged now, even
// past the limit, into a debt of at most one capacity beyond empty, which
// the key's next checks wait off; a cost below it is a refund of charged -
// actual, as [Store.RefundContext] gives back. A key Redis does not hold
// is created to be charged, and gives nothing back for a refund (the
// settled cost is then charged).
//
// Cost errors are ratelimit.Store.Settle's ([ratelimit.ErrInvalidCost],
// [ratelimit.ErrCostExceedsCapacity]), with no server reached. The
// settlement runs as a refund does: in one script, on every rule, that
// never conflicts, checked against the rule's [ratelimit.Machine].
//
// A charge sets the key's expiry to the returned Decision's ResetAfter
// plus the expiry margin, as a check sets it from its own: at least until
// the settled state is as good as a fresh key's (the Decision, a peek's,
// counts cost charged in when it would be admitted, so it may be later by
// that much); a refund keeps the key's expiry, which covers a state that
// is fresh no later. A refund drops the key's refusal from
// this store's deny cache; a charge replaces a refusal the cache holds by
// the settled state, so that its answers know of the debt. Other
// processes' caches know of neither: a charge only makes refusals last
// longer, so theirs stay refusals, but may report an earlier RetryAfter
// than Redis would (see [WithDenyCache]). Failures are
// RefundContext's: a failure after the write was sent leaves it unknown
// whether the settlement was made (the settled cost is then 0 with the
// error); do not retry such a failure blindly. A corrupted state is an
// error matching [ratelimit.ErrInvalidState], and nothing is written.
func (s *Store) SettleContext(ctx context.Context, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	if d, _, _, err := s.m.Settle(nil, 0, 0, charged, actual); err != nil {
		return d, 0, err
	}
	ctx, cancel := withTimeout(ctx, s.o.timeout)
	defer cancel()
	rk := s.Key(key)
	return s.settleInScript(ctx, key, rk, charged, actual, at)
}

// expiryMs is the expiry a check sets for a state that is as good as a
// fresh key's after reset: reset in whole ms, rounded up, plus the margin
// marginMs, saturating at the largest int64 rather than overflowing.
func expiryMs(reset time.Duration, marginMs int64) int64 {
	ms := ceilMs(reset)
	if marginMs > math.MaxInt64-ms {
		return math.MaxInt64
	}
	return ms + marginMs
}

// ceilMs is d in whole ms, rounded up, for any d >= 0 (0 for d <= 0): the
// quotient and remainder never overflow, where adding a millisecond less
// one before dividing would for the last millisecond of int64.
func ceilMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// Reset is ResetContext with a background context.
func (s *Store) Reset(key string) error {
	return s.ResetContext(context.Background(), key)
}

// ResetContext makes key start again as a fresh key, full, whatever it had
// spent, as [ratelimit.Store.Reset] does: one round trip that replaces the
// key's state, if Redis holds one, by a fresh key's state that keeps only
// the key's clamp on time, its latest instant (a clock that went back is
// still not trusted), expiring after the expiry margin. Resetting a key Redis does not hold
// does nothing. It is atomic with the key's checks, and drops the key's
// refusal from this store's deny cache; other processes' caches do not
// know of it (see [WithDenyCache]).
//
// ctx bounds the call; without a deadline, the store's timeout does. When
// Redis fails the error wraps [ErrUnavailable], and the key may or may not
// have been reset.
func (s *Store) ResetContext(ctx context.Context, key string) error {
	ctx, cancel := withTimeout(ctx, s.o.timeout)
	defer cancel()
	rk := s.Key(key)
	var floor int64
	if s.clock != nil {
		floor = s.floor(rk) // as a check's reading is raised to it
	}
	if _, err := s.op(ctx, rk, 0, "z", strconv.FormatInt(s.marginMs, 10), strconv.FormatInt(floor, 10)); err != nil {
		return err
	}
	if s.deny != nil {
		s.deny.drop(rk)
	}
	return nil
}

// op runs the ops script on the layers' keys that take part in a request
// of cost (see Composite.keys); the others read as fresh keys.
func (c *Composite) op(ctx context.Context, key string, cost ratelimit.Units, args ...any) ([]string, opReply, error) {
	keys, send, now, err := c.taking(key, cost)
	if err != nil {
		return nil, opReply{}, err
	}
	reply, err := c.run(ctx, key, opsScript, send, append([]any{now}, args...))
	if err != nil {
		return nil, opReply{}, err
	}
	r, err := parseOp(reply, len(send))
	if len(send) == 0 && args[0] == "r" {
		r.states = [][]byte{} // a read of no keys: every layer reads as fresh
	}
	if err != nil || r.states == nil {
		return keys, r, err
	}
	states := make([][]byte, len(keys))
	j := 0
	for i := range keys {
		if c.lm.Takes(i, cost) {
			states[i] = r.states[j]
			j++
		}
	}
	r.states = states
	return keys, r, nil
}

// taking returns the layers' Redis keys for a request of cost on key (see
// Composite.keys), those of the layers that take part in it, to send, and
// the client clock's reading (empty for the server's TIME).
func (c *Composite) taking(key string, cost ratelimit.Units) (keys, send []string, now string, err error) {
	keys, err = c.keys(key, cost)
	if err != nil {
		return nil, nil, "", err
	}
	send = make([]string, 0, len(keys))
	for i := range keys {
		if c.lm.Takes(i, cost) {
			send = append(send, keys[i])
		}
	}
	return keys, send, c.reading(), nil
}

// Peek is PeekContext with a background context.
func (c *Composite) Peek(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return c.PeekContext(context.Background(), key, cost)
}

// PeekContext returns the Decision that [Composite.CheckContext] would give
// cost for key now, spending nothing in any layer and writing nothing, as
// [ratelimit.Composite.Peek] does: the same Decision, field for field
// (Shadowed included), as a check at the same instant. No OnShadow is
// called and the observer is not told. It costs one round trip (a read).
// Its errors are CheckContext's; when Redis fails the error wraps
// [ErrUnavailable] and the Decision is the failure policy's.
func (c *Composite) PeekContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	if d, _, _, err := c.lm.Step(make([][]byte, c.lm.Len()), 0, cost, false); err != nil {
		return d, err
	}
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	_, r, err := c.op(ctx, key, cost, "r")
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return degradedPeek(c.o.fallback, key, cost, err, c.failureMode)
		}
		return c.refused(), err
	}
	d, _, _, err := c.lm.Step(r.states, time.Duration(r.instant), cost, false)
	if err != nil {
		return c.refused(), fmt.Errorf("key %q: %w", clipKey(key), err)
	}
	return d, nil
}

// Refund is RefundContext with a background context.
func (c *Composite) Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	return c.RefundContext(context.Background(), key, cost, at)
}

// RefundContext gives back up to cost of what key was admitted at the
// instant at (the admitting Decision's At) in every enforced layer, at one
// instant, as [ratelimit.Composite.Refund] does, and returns the least any
// enforced layer gave back. Shadow layers keep what they spent. Each
// layer's amount is [Store.RefundContext]'s for the layer's own key, at
// the layers' one instant (the store's, raised to the latest instant any
// layer's key holds), and the layers' new states are written together,
// all or none: one script over every layer's key (they share a slot), one
// round trip, atomic with the layers' checks, that never conflicts, however
// hot the key. The Composite checks each layer's amount and state against
// the layer's [ratelimit.Machine] on the states and instant the script
// read (an error wrapping [ErrMismatch] if they disagree, which would be a
// bug). A corrupted state in any layer, a shadow layer's included, is an
// error matching [ratelimit.ErrInvalidState], and nothing is written. A
// cost of zero or less is an error matching [ratelimit.ErrInvalidCost];
// each layer caps a larger cost than it can give back. Its failures are
// the Store's refund's.
func (c *Composite) RefundContext(ctx context.Context, key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	if cost <= 0 {
		_, _, err := c.lm.Machine(0).Refund(nil, 0, 0, cost)
		return 0, err
	}
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	least, err := c.refundInScript(ctx, key, cost, at)
	c.deny.clear()
	if err != nil {
		return 0, err
	}
	return least, nil
}

// Settle is SettleContext with a background context.
func (c *Composite) Settle(key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	return c.SettleContext(context.Background(), key, charged, actual, at)
}

// SettleContext settles a request admitted for key at the instant at,
// charged charged and costing actual, in every enforced layer at one
// instant, as [ratelimit.Composite.Settle] does: each layer's amount and
// state are [Store.SettleContext]'s for the layer's own key, at the
// layers' one instant, and the layers' new states are written together,
// all or none, in one script as [Composite.RefundContext] writes them,
// which never conflicts. Shadow layers keep what they spent. The Decision
// is [Composite.PeekContext]'s for cost charged just after, and the
// settled cost the one furthest from actual of the enforced layers' (the
// least charged, or the least given back); a composite of shadow layers
// only settles nothing and reports charged. A charge sets each enforced
// layer's expiry as [Store.SettleContext] sets a key's, from that layer's
// own settlement; a refund keeps it. Its cost errors are CheckContext's
// for charged, and for an actual of zero or less
// [ratelimit.ErrInvalidCost]; its failures are the Store's settlement's.
func (c *Composite) SettleContext(ctx context.Context, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	empty := make([][]byte, c.lm.Len())
	if d, _, _, err := c.lm.Step(empty, 0, charged, false); err != nil {
		return d, 0, err
	}
	if actual <= 0 {
		d, _, _, err := c.lm.Step(empty, 0, actual, false)
		return d, 0, err
	}
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	d, settled, err := c.settleInScript(ctx, key, charged, actual, at)
	c.deny.clear()
	if err != nil {
		return c.refused(), 0, err
	}
	return d, settled, nil
}

func absUnits(x ratelimit.Units) ratelimit.Units {
	if x < 0 {
		return -x
	}
	return x
}

// Reset is ResetContext with a background context.
func (c *Composite) Reset(key string) error {
	return c.ResetContext(context.Background(), key)
}

// ResetContext makes key start again as a fresh key in every layer, shadow
// layers included, in one script, as [ratelimit.Composite.Reset] does:
// each layer's key that Redis holds is replaced as [Store.ResetContext]
// replaces a key. A layer whose Key maps many keys to one (a global
// limit) resets that one shared key. When Redis fails the error wraps
// [ErrUnavailable], and the keys may or may not have been reset.
func (c *Composite) ResetContext(ctx context.Context, key string) error {
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	_, _, err := c.op(ctx, key, 1, "z", strconv.FormatInt(c.marginMs, 10), "0")
	c.deny.clear()
	return err
}
