package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed lockout.lua
var lockoutLua string

var lockoutScript = redis.NewScript(lockoutLua)

// Lockout is a [ratelimit.Lockout] whose keys live in Redis, so that every
// process sharing the Redis sees one count of failures and one block per
// key: an address locked out through one replica is locked out on all.
// Its rule, its Decisions and its Fail's started are the in-process
// Lockout's, field for field, on the same trace at the same instants (see
// [ratelimit.LockoutMachine], which decides for both).
//
// [Lockout.Check] is one round trip that writes nothing. [Lockout.Fail]
// reads the key's state and writes the state after the failure only if
// the key still holds the state it read (a compare-and-set in one script),
// else it decides again on the state Redis returns: two round trips, and
// one more for each failure of the same key that another process counted
// in between. So failures are counted one at a time whatever their
// concurrency, and exactly one of them starts a block. A key's state
// expires when it is as good as a fresh key's.
//
// Time is the Redis server's TIME, or the client clock of [WithClock]; each
// key clamps to the latest instant it was stepped at.
//
// Failure policy: a Lockout fails closed by default. When Redis cannot
// decide (an error, a deadline, the open circuit), Check and Fail answer
// that the key is blocked, RetryAfter the circuit's pause, with an error
// wrapping [ErrUnavailable] and [ratelimit.ErrDegraded]: a login gate that
// opens whenever Redis is down would let a guesser through exactly when
// nobody counts the guesses. [WithFailureMode](FailOpen) lets every key
// through instead (the Decision of a fresh key; a failure is then not
// counted anywhere), and [WithLockoutFallback] hands both to an in-process
// Lockout, which counts on each process alone until Redis is back. A
// corrupted state is refused with an error matching
// [ratelimit.ErrInvalidState], whatever the policy.
//
// A Lockout reads [WithPrefix], [WithClock], [WithTimeout],
// [WithExpiryMargin], [WithFailureMode], [WithCircuit] and
// [WithLockoutFallback]. It is safe for concurrent use and has nothing to
// close; the client stays the caller's.
type Lockout struct {
	*remote
	m       *ratelimit.LockoutMachine
	p       ratelimit.Params
	keyHead string
}

// NewLockout returns a [Lockout] for rule on the Redis that rdb talks to.
// rule is validated as by [ratelimit.NewLockout]; a bad rule or option is
// an error.
func NewLockout(rdb redis.UniversalClient, rule ratelimit.LockoutRule, opts ...Option) (*Lockout, error) {
	m, err := ratelimit.NewLockoutMachine(rule)
	if err != nil {
		return nil, err
	}
	r, err := newRemote(rdb, []Option{WithFailureMode(FailClosed)}, opts)
	if err != nil {
		return nil, err
	}
	// The rule's numbers name its keys, as a Store's do: a lockout with
	// other numbers starts its keys fresh rather than read a state it
	// could not have written.
	tag := fmt.Sprintf("lockout %d %d %d %d %d %d", rule.Failures, rule.Within, rule.Block, rule.Growth, rule.MaxBlock, rule.Forget)
	return &Lockout{
		remote:  r,
		m:       m,
		p:       m.Params(),
		keyHead: r.o.prefix + "lockout:" + shortHash(tag) + ":{",
	}, nil
}

// WithLockoutFallback makes a [Lockout] that Redis cannot decide for
// answer with local, an in-process [ratelimit.Lockout] with the same rule:
// each process then counts failures on its own until Redis is back (what
// local counted is not carried over). The error saying Redis failed is
// still returned. It takes precedence over [WithFailureMode]. Stores and
// in-flight limits ignore it.
func WithLockoutFallback(local *ratelimit.Lockout) Option {
	return func(o *options) { o.lockFallback = local }
}

// Key returns the Redis key that holds key's state: the prefix,
// "lockout:", a tag of the rule's numbers, and in braces a hash of key,
// which is also the key's Cluster hash tag.
func (l *Lockout) Key(key string) string { return hashedKey(l.keyHead, key) }

// Check reports whether key is blocked now, as [ratelimit.Lockout.Check]
// does, writing nothing. The error is Redis's failure (the Decision is
// then the failure policy's) or a corrupted state (refused).
func (l *Lockout) Check(ctx context.Context, key string) (ratelimit.Decision, error) {
	reply, err := l.call(ctx, lockoutScript, []string{l.Key(key)}, "r", "", "", "", l.serverTime())
	if isStateError(err) {
		return l.invalidState(key, fmt.Errorf("%w: %v", ratelimit.ErrInvalidState, err))
	}
	if err != nil {
		d, _, err := l.degraded(key, false, err)
		return d, err
	}
	state, at, err := l.read(reply)
	if err != nil {
		return l.refused(), err
	}
	d, _, _, err := l.m.Step([]byte(state), at, false)
	if err != nil {
		return l.invalidState(key, err)
	}
	return d, nil
}

// Fail counts one failure of key now, as [ratelimit.Lockout.Fail] does,
// and returns the key's Decision after it and whether this failure
// started a block. Of failures of one key counted at once, from any
// number of processes, exactly as many start a block as would one after
// another in process. The error is as for Check; a failure that Redis
// did not count is then counted by the fallback, if any, or nowhere. ctx
// (or without a deadline, the timeout) bounds the whole of it, retries
// included.
func (l *Lockout) Fail(ctx context.Context, key string) (ratelimit.Decision, bool, error) {
	// One deadline for the read and every compare-and-set after it.
	ctx, cancel := l.bounded(ctx)
	defer cancel()
	rk := []string{l.Key(key)}
	serverTime := l.serverTime()
	reply, err := l.call(ctx, lockoutScript, rk, "r", "", "", "", serverTime)
	for err == nil {
		var (
			state string
			at    time.Duration
			d     ratelimit.Decision
			next  []byte
			start bool
		)
		if state, at, err = l.read(reply); err != nil {
			return l.refused(), false, err
		}
		if d, next, start, err = l.m.Step([]byte(state), at, true); err != nil {
			d, err = l.invalidState(key, err)
			return d, false, err
		}
		write, ttl := string(next), ""
		if d.ResetAfter <= 0 {
			write = "" // as good as fresh: nothing to keep
		} else {
			ttl = strconv.FormatInt(ceilMs(d.ResetAfter)+ceilMs(l.o.margin), 10)
		}
		reply, err = l.call(ctx, lockoutScript, rk, "w", state, write, ttl, serverTime)
		if err == nil {
			if done, _ := reply[0].(int64); done == 1 {
				return d, start, nil
			}
		}
	}
	if isStateError(err) {
		d, err := l.invalidState(key, fmt.Errorf("%w: %v", ratelimit.ErrInvalidState, err))
		return d, false, err
	}
	return l.degraded(key, true, err)
}

// Reset forgets everything about key, as [ratelimit.Lockout.Reset] does.
// The error is Redis's failure; the key is then unchanged.
func (l *Lockout) Reset(ctx context.Context, key string) error {
	_, err := l.call(ctx, resetScript, []string{l.Key(key)})
	return err
}

var resetScript = redis.NewScript("redis.call('DEL', KEYS[1]) return {}")

// Params returns the rule's compiled parameters (see
// [ratelimit.LockoutMachine.Params]).
func (l *Lockout) Params() ratelimit.Params { return l.p }

// Clock returns the time base of the lockout's Decisions: the client
// clock, or Unix time when the server's clock decides.
func (l *Lockout) Clock() ratelimit.Clock { return l.clock() }

// Stats returns the lockout's counters: calls Redis did not answer,
// those the open circuit refused, and corrupted states refused.
func (l *Lockout) Stats() Stats { return l.stats() }

// serverTime is the script's argument asking for the server's TIME.
func (l *Lockout) serverTime() string {
	if l.o.clock == nil {
		return "1"
	}
	return ""
}

// read parses the script's reply into the state and the instant to
// decide at.
func (l *Lockout) read(reply []any) (string, time.Duration, error) {
	state, ok1 := str(reply, 1)
	server, ok2 := str(reply, 2)
	if !ok1 || !ok2 || len(reply) != 3 {
		return "", 0, fmt.Errorf("%w: %w: unexpected reply %v", ratelimit.ErrDegraded, ErrMismatch, reply)
	}
	if now, ok := l.now(); ok {
		return state, time.Duration(now), nil
	}
	at, err := strconv.ParseInt(server, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w: unexpected time %q", ratelimit.ErrDegraded, ErrMismatch, server)
	}
	return state, time.Duration(clamp(time.Duration(at))), nil
}

// refused is the Decision of a blocked key with no time to tell.
func (l *Lockout) refused() ratelimit.Decision {
	return ratelimit.Decision{Limit: l.p.Limit, Policy: l.p.Policy, Window: time.Duration(l.p.WindowNanos)}
}

// invalidState refuses a key whose state cannot be read.
func (l *Lockout) invalidState(key string, err error) (ratelimit.Decision, error) {
	l.invalid.Add(1)
	return l.refused(), fmt.Errorf("%w: key %q: %w", ratelimit.ErrDegraded, clipKey(key), err)
}

// degraded applies the failure policy to a Check (fail false) or Fail
// that Redis did not decide.
func (l *Lockout) degraded(key string, fail bool, cause error) (ratelimit.Decision, bool, error) {
	cause = fmt.Errorf("%w: %w", ratelimit.ErrDegraded, cause)
	if local := l.o.lockFallback; local != nil {
		if fail {
			d, started := local.Fail(key)
			return d, started, cause
		}
		return local.Check(key), false, cause
	}
	if l.o.mode == FailOpen {
		d, _, _, _ := l.m.Step(nil, l.clock().Now(), false)
		return d, false, cause
	}
	d := l.refused()
	d.RetryAfter = l.o.pause
	return d, false, cause
}
