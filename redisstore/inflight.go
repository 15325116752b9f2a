package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	_ "embed"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed inflight.lua
var inflightLua string

var (
	// inflightScript takes, gives back and counts slots.
	inflightSource = expandLua("local layerstep = nil\n" + inflightLua)
	inflightScript = redis.NewScript(inflightSource)
	// inflightWithScript is inflightScript with the rate step of a Store
	// (layerstep, as a Composite's layers run it), for AcquireWith.
	inflightWithSource = layerStepSource("") + "\n" + expandLua(inflightLua)
	inflightWithScript = redis.NewScript(inflightWithSource)
)

// InFlight is a [ratelimit.InFlight] whose slots live in Redis, so that a
// limit of N is N across every process sharing the Redis, not N each. Its
// contract is the in-process InFlight's: [InFlight.Acquire] takes a slot
// if fewer than Limit are held and never waits; the [ratelimit.Release] it
// returns gives the slot back and is idempotent; with MaxHold, a slot not
// released within MaxHold of its acquisition is taken back, so the slots
// of a process that crashed while holding them come back after MaxHold;
// and [InFlight.AcquireWith] asks a Redis rate limit too, all or nothing.
// Its Decisions are the in-process InFlight's, field for field, on the
// same trace at the same instants.
//
// Each acquisition and each release is one script call. A key's slots are
// one sorted set holding, for each slot, the instant MaxHold takes it back
// and a random id; the instants are compared as fixed-width decimals, so
// MaxHold is exact to the nanosecond. The set expires MaxHold (plus the
// expiry margin) after its latest acquisition, and goes as soon as its
// last slot is released. Without MaxHold, a slot whose release never comes
// (a process that crashed) is held for good: set MaxHold when several
// processes share the limit.
//
// Time is the Redis server's TIME, or the client clock of [WithClock]; each
// key clamps to the latest instant a slot was taken at.
//
// Keys: two in-flight limits with the same prefix and the same Name share
// their slots, whatever their Limit and MaxHold (so that a changed limit,
// rolled out one process after another, still counts the slots taken
// before). The key's hash tag is a [Store]'s for the same key, so that
// AcquireWith runs in one slot of a Cluster.
//
// Failure policy: an InFlight fails open by default, as a Store does: when
// Redis cannot decide, the request goes on holding no slot, and the error
// (wrapping [ErrUnavailable] and [ratelimit.ErrDegraded]) says so. An
// in-flight limit guards capacity, and refusing every request while Redis
// is down would take the service down with it. [WithFailureMode](FailClosed)
// refuses instead, and [WithInFlightFallback] takes a slot of an in-process
// InFlight: give it Limit divided by the number of processes, so that all
// together stay within the limit until Redis is back.
//
// An InFlight reads [WithPrefix], [WithClock], [WithTimeout],
// [WithExpiryMargin], [WithFailureMode], [WithCircuit] and
// [WithInFlightFallback]. It is safe for concurrent use and has nothing to
// close; the client stays the caller's.
type InFlight struct {
	*remote
	limit   int64
	hold    time.Duration
	pol     ratelimit.Decision // Limit and Policy, for every Decision
	keyHead string
}

// NewInFlight returns an [InFlight] for l on the Redis that rdb talks to.
// l is validated as by [ratelimit.NewInFlight]; a bad limit or option is
// an error.
func NewInFlight(rdb redis.UniversalClient, l ratelimit.InFlightLimit, opts ...Option) (*InFlight, error) {
	if _, err := ratelimit.NewInFlight(l, ratelimit.WithShards(1)); err != nil {
		return nil, err
	}
	r, err := newRemote(rdb, nil, opts)
	if err != nil {
		return nil, err
	}
	return &InFlight{
		remote:  r,
		limit:   l.Limit,
		hold:    l.MaxHold,
		pol:     ratelimit.Decision{Limit: l.Limit, Policy: l.Name},
		keyHead: r.o.prefix + "inflight:" + shortHash(l.Name) + ":{",
	}, nil
}

// WithInFlightFallback makes an [InFlight] that Redis cannot decide for
// take a slot of local, an in-process [ratelimit.InFlight], instead: each
// process then limits its own requests until Redis is back. The error
// saying Redis failed is still returned. It takes precedence over
// [WithFailureMode]. Stores and lockouts ignore it.
func WithInFlightFallback(local *ratelimit.InFlight) Option {
	return func(o *options) { o.inflightFallback = local }
}

// Key returns the Redis key that holds key's slots: the prefix,
// "inflight:", a tag of the limit's Name, and in braces a hash of key,
// the key's Cluster hash tag, the same as a [Store]'s.
func (f *InFlight) Key(key string) string { return hashedKey(f.keyHead, key) }

// Acquire is AcquireContext with a background context: the timeout bounds
// it.
func (f *InFlight) Acquire(key string) (ratelimit.Release, ratelimit.Decision, error) {
	return f.AcquireContext(context.Background(), key)
}

// AcquireContext takes a slot for key if fewer than Limit are held across
// every process, at once: it never waits for one. The Decision says
// whether it did (see [ratelimit.InFlight]); the Release gives the slot
// back, and does nothing for a refusal. When Redis cannot decide, the
// error wraps [ErrUnavailable] and the Decision and Release are the
// failure policy's.
func (f *InFlight) AcquireContext(ctx context.Context, key string) (ratelimit.Release, ratelimit.Decision, error) {
	return f.acquire(ctx, key, nil, 0)
}

// AcquireWith takes a slot for key only if rate also admits cost for key,
// all or nothing, as [ratelimit.InFlight.AcquireWith] does: rate is asked
// only if a slot is free, and the slot is kept only if rate admits.
//
// With a [*Store] on the same Redis (the same client, or one of the same
// servers) as rate, that is one script: it looks for a free slot, then,
// only if there is one, checks rate exactly as rate's own Check does
// (writing its state), and takes the slot only if rate admits, so no other
// process ever sees a slot taken for a request that rate refuses, nor an
// allowance spent for one refused a slot. The in-flight limit's instant
// decides both: give both the same clock (or both the server's).
// Any other rate (a [Composite], a dispatcher over plans, an in-process
// limiter) is asked only after a slot is taken, and the slot is released
// at once if rate refuses or fails: a request refused a slot still spends
// nothing, and one rate refuses still holds no slot once AcquireWith
// returns, but for that moment another process may see the slot held and
// be refused. The Decision is rate's when rate was asked, as in process;
// when no slot was free it is the in-flight refusal. rate's errors are its
// own: a cost it can never admit is one, with no slot taken; a corrupted
// state of a Store's key is refused with an error matching
// [ratelimit.ErrInvalidState]. When Redis cannot decide, the in-flight
// limit's failure policy applies: a fallback InFlight acquires with rate
// (which then applies its own policy), fail open asks rate alone and
// admits what it admits, holding no slot, and fail closed refuses. A nil
// rate is an error matching [ratelimit.ErrInvalidRule].
func (f *InFlight) AcquireWith(ctx context.Context, key string, rate ratelimit.KeyedLimiter, cost ratelimit.Units) (ratelimit.Release, ratelimit.Decision, error) {
	if rate == nil {
		return noRelease, f.refusal(0), fmt.Errorf("%w: InFlight.AcquireWith given a nil rate limiter; use Acquire for the in-flight limit alone", ratelimit.ErrInvalidRule)
	}
	s, ok := rate.(*Store)
	if !ok || s == nil {
		return f.acquireThen(ctx, key, rate, cost)
	}
	if cost <= 0 || cost > s.p.Capacity {
		// As in process, rate is asked only if a slot is free: a cost it
		// can never admit is an error only then.
		n, at, err := f.count(ctx, key)
		if err == nil && n >= f.limit {
			return noRelease, f.refusal(at), nil
		}
		d, _, err := s.m.Step(nil, 0, cost, false)
		return noRelease, d, err
	}
	return f.acquire(ctx, key, s, cost)
}

// acquireThen is AcquireWith for a rate that is not a Store: the slot
// first, then rate, and the slot given back unless rate admits.
func (f *InFlight) acquireThen(ctx context.Context, key string, rate ratelimit.KeyedLimiter, cost ratelimit.Units) (ratelimit.Release, ratelimit.Decision, error) {
	rel, d, err := f.acquire(ctx, key, nil, 0)
	if !d.Allowed {
		return rel, d, err
	}
	var rerr error
	if cc, ok := rate.(ratelimit.ContextChecker); ok {
		d, rerr = cc.CheckContext(ctx, key, cost)
	} else {
		d, rerr = rate.Check(key, cost)
	}
	if !d.Allowed || (rerr != nil && !errors.Is(rerr, ratelimit.ErrDegraded)) {
		rel()
		return noRelease, d, rerr
	}
	return rel, d, errors.Join(err, rerr)
}

// InUse returns how many slots key holds now across every process, slots
// past MaxHold not counted.
func (f *InFlight) InUse(ctx context.Context, key string) (int64, error) {
	n, _, err := f.count(ctx, key)
	return n, err
}

// count returns how many slots key holds now, and the instant.
func (f *InFlight) count(ctx context.Context, key string) (int64, int64, error) {
	reply, err := f.call(ctx, inflightScript, []string{f.Key(key)}, "n", f.nowArg())
	if err != nil {
		return 0, 0, err
	}
	n, ok := reply[2].(int64)
	instant, _ := str(reply, 1)
	at, perr := strconv.ParseInt(instant, 10, 64)
	if !ok || perr != nil {
		return 0, 0, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	return n, at, nil
}

// Limit returns the most slots a key may hold.
func (f *InFlight) Limit() int64 { return f.limit }

// Clock returns the time base of the limit: the client clock, or Unix time
// when the server's clock decides.
func (f *InFlight) Clock() ratelimit.Clock { return f.clock() }

// Stats returns the limit's counters: calls Redis did not answer (releases
// included), those the open circuit refused, and corrupted states of a
// rate limit's keys refused.
func (f *InFlight) Stats() Stats { return f.stats() }

// noRelease is the Release of an acquisition that took no slot.
func noRelease() {}

// maxTimeDigits is MaxTime in the script's 19 digits.
var maxTimeDigits = fmt.Sprintf("%019d", int64(ratelimit.MaxTime))

// nowArg is the script's instant: the client clock's, or "" for TIME.
func (f *InFlight) nowArg() string {
	if now, ok := f.now(); ok {
		return strconv.FormatInt(now, 10)
	}
	return ""
}

// acquire is every acquisition: rate nil for the in-flight limit alone.
func (f *InFlight) acquire(ctx context.Context, key string, rate *Store, cost ratelimit.Units) (ratelimit.Release, ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return noRelease, f.refusal(0), err
	}
	var id [12]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand's contract)
	hs, hn, ttl := "", "", ""
	if f.hold > 0 {
		hs = strconv.FormatInt(int64(f.hold/time.Second), 10)
		hn = strconv.FormatInt(int64(f.hold%time.Second), 10)
		ttl = strconv.FormatInt(ceilMs(f.hold)+ceilMs(f.o.margin), 10)
	}
	rk := f.Key(key)
	keys := []string{rk}
	args := []any{"a", f.nowArg(), strconv.FormatInt(f.limit, 10), hs, hn, hex.EncodeToString(id[:]), ttl, maxTimeDigits}
	script := inflightScript
	if rate != nil {
		keys = append(keys, rate.Key(key))
		args = append(args, rate.args(cost, 0, false)...)
		script = inflightWithScript
	}
	reply, err := f.call(ctx, script, keys, args...)
	if err != nil {
		if isStateError(err) {
			// A corrupted state (the rate's, or a slot key of another
			// type) refuses whatever the failure policy.
			f.invalid.Add(1)
			d := f.refusal(0)
			if rate != nil {
				d = rate.refused()
			}
			return noRelease, d, fmt.Errorf("%w: %w: key %q: %v", ratelimit.ErrDegraded, ratelimit.ErrInvalidState, clipKey(key), err)
		}
		return f.degraded(ctx, key, rate, cost, err)
	}
	taken, _ := reply[0].(int64)
	instant, ok1 := str(reply, 1)
	held, ok2 := reply[2].(int64)
	member, ok3 := str(reply, 3)
	at, perr := strconv.ParseInt(instant, 10, 64)
	if !ok1 || !ok2 || !ok3 || perr != nil {
		return noRelease, f.refusal(0), fmt.Errorf("%w: %w: unexpected reply %v", ratelimit.ErrDegraded, ErrMismatch, reply)
	}
	var d ratelimit.Decision
	if len(reply) == 8 {
		// rate was asked: its Decision, verified as its own Check's.
		var err error
		d, _, _, err = rate.verify(key, cost, reply[4:], false)
		rate.observe(d, cost, err)
		if err != nil {
			return noRelease, d, degradedError(err)
		}
		if taken != 1 {
			return noRelease, d, nil
		}
	} else if taken != 1 {
		return noRelease, f.refusal(at), nil
	} else {
		d = f.pol
		d.Allowed = true
		d.Remaining = f.limit - held
		d.At = time.Duration(at)
	}
	var once sync.Once
	return func() { once.Do(func() { f.release(rk, member) }) }, d, nil
}

// release gives back the slot member of the key rk. A release that fails
// is counted, and its slot comes back after MaxHold.
func (f *InFlight) release(rk, member string) {
	_, _ = f.call(context.Background(), inflightScript, []string{rk}, "r", "", member)
}

// refusal is the in-flight refusal at the instant at.
func (f *InFlight) refusal(at int64) ratelimit.Decision {
	d := f.pol
	d.At = time.Duration(at)
	return d
}

// degraded applies the failure policy to an acquisition Redis did not
// decide.
func (f *InFlight) degraded(ctx context.Context, key string, rate *Store, cost ratelimit.Units, cause error) (ratelimit.Release, ratelimit.Decision, error) {
	cause = fmt.Errorf("%w: %w", ratelimit.ErrDegraded, cause)
	now := clamp(f.clock().Now())
	if local := f.o.inflightFallback; local != nil {
		var (
			rel ratelimit.Release
			d   ratelimit.Decision
			err error
		)
		if rate != nil {
			rel, d, err = local.AcquireWith(context.WithoutCancel(ctx), key, rate, cost)
		} else {
			rel, d, err = local.AcquireContext(context.WithoutCancel(ctx), key)
		}
		if err != nil && !errors.Is(err, ratelimit.ErrDegraded) {
			return rel, d, errors.Join(cause, err)
		}
		return rel, d, cause
	}
	if f.o.mode == FailClosed {
		d := f.refusal(now)
		d.RetryAfter = f.o.pause
		return noRelease, d, cause
	}
	if rate != nil {
		// The rate limit's own check, and its own policy if its Redis is
		// down too.
		d, err := rate.CheckContext(ctx, key, cost)
		if err != nil && !errors.Is(err, ratelimit.ErrDegraded) {
			return noRelease, d, errors.Join(cause, err)
		}
		return noRelease, d, cause
	}
	d := f.pol
	d.Allowed = true
	d.Remaining = f.limit - 1
	d.At = time.Duration(now)
	return noRelease, d, cause
}
