package ratelimit

import (
	"errors"
	"time"
)

// LockoutRule is the rule of a [Lockout]: a key that fails Failures times
// within any span of Within is blocked for Block. A repeat offender's
// blocks can grow: with Growth g of 2 or more, each block that starts
// less than Forget after the previous one ended is g times as long as that
// one, up to MaxBlock.
//
// Failures is from 1 to 1e15 (the failures within the span are kept in a
// sliding log, one entry per failure, so keep it moderate). Within and
// Block must be positive and less than [MaxTime]. Growth is 0 or 1 for
// blocks that never grow, or the factor by which they do; it then needs a
// positive Forget, so that every streak ends and a key that behaves is
// eventually forgotten. MaxBlock, if not 0, caps every block and must be
// at least Block; without it a block can grow up to MaxTime. Forget is
// ignored without Growth. Every duration is less than MaxTime.
type LockoutRule struct {
	Failures int64
	Within   time.Duration
	Block    time.Duration
	Growth   int64
	MaxBlock time.Duration
	Forget   time.Duration
	Name     string // optional: reported as Decision.Policy
}

// Lockout blocks keys that fail too often, the pattern of fail2ban and of
// account lockouts: a key that has Failures failures within any span of
// Within is blocked for Block from the failure that completed them, and
// with Growth, longer for each repeat. It counts what the caller reports
// with [Lockout.Fail], typically failed logins, and [Lockout.Check] tells
// whether a key is blocked, and exactly until when:
//
//	if d := lockout.Check(addr); !d.Allowed {
//		// refuse; d.RetryAfter is the exact time left of the block
//	}
//	if !passwordOK {
//		lockout.Fail(addr)
//	}
//
// A failure while the key is blocked is not counted and does not extend the
// block. A block clears the key's failures: once it ends, the key has all
// its Failures again. What succeeds never counts; [Lockout.Reset] forgets
// everything about a key, block included.
//
// Check then Fail is not atomic: requests that pass Check at the same time
// are all let through before the failures they report are counted, so a
// lockout alone lets as many concurrent attempts through as arrive at
// once. In front of something worth guessing, also limit the attempts
// themselves (a [SlidingLog] that counts failures only; see httplimit's
// WithCountOnly), so that they are bounded whatever their concurrency.
//
// The Decisions of a Lockout carry the rule's Failures as Limit, Within as
// Window and Name as Policy, and the instant they were made at as At:
//
//   - Allowed: the key is not blocked (for [Lockout.Fail]: after counting
//     this failure).
//   - Remaining: how many more failures the key may have now before it is
//     blocked, the last of them starting the block; 0 while blocked.
//   - RetryAfter: while blocked, exactly the time until the block ends: a
//     Check then passes, one a nanosecond sooner does not. 0 otherwise.
//   - ResetAfter: the time until the key is as good as a fresh one if
//     nothing more happens: no failure within the span, not blocked, and
//     with Growth, its streak of blocks forgotten.
//
// Keys are kept in a [Store] of their own, bounded by [WithMaxKeys] and
// [WithShards] as a Store is, on the clock given by [WithClock]; NewLockout
// reads no other option. A key that is neither blocked nor has failures
// within the span (nor, with Growth, a streak to remember) is as good as a
// fresh key, so the store drops it first when it needs room. A full store
// of blocked keys drops the least recently used: such a key is no longer
// blocked, and [StoreStats].LossyEvictions counts it.
//
// Time is the store's: a clock that goes back is not trusted, and no block
// ends later than MaxTime. A Lockout is safe for concurrent use; Check,
// Fail and Reset on one key are linearizable. The zero Lockout is not
// usable; build one with [NewLockout].
type Lockout struct {
	store *Store
}

// NewLockout validates rule and the options and returns a [Lockout] for
// it. A malformed rule is an error matching [ErrInvalidRule] (a
// [*RuleError] naming the LockoutRule field), an option out of range one
// matching [ErrInvalidOption].
func NewLockout(rule LockoutRule, opts ...Option) (*Lockout, error) {
	alg, err := rule.compile()
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	if _, _, err := storeShape(o.store); err != nil {
		return nil, err
	}
	o.obs = nil // an Observer's outcomes describe requests, not failures
	return &Lockout{store: &Store{core: newStoreCore[lockState](alg, o)}}, nil
}

// Check reports whether key is blocked now, counting nothing and adding no
// key: Allowed false while it is, with RetryAfter exactly the time left.
func (l *Lockout) Check(key string) Decision {
	d, _ := l.store.Peek(key, Unit) // Unit is within the capacity: no error
	return d
}

// Fail counts one failure of key now and returns the key's Decision after
// it, and started, true if this failure started a block: it was the
// Failures-th within the span. Allowed is false if key is blocked after
// the failure, by this one or by an earlier block; RetryAfter is then
// exactly the time until the block ends. A failure while key is blocked is
// not counted.
func (l *Lockout) Fail(key string) (d Decision, started bool) {
	core := l.store.core
	k := core.prepare(key)
	i := core.shardIndex(k)
	now := core.lockShard(i, clampTime(core.clock().Now()))
	// Nothing else is pinned in the shard, so it always has room.
	core.acquire(k, now)
	before := core.stepAt(k, now, int64(Unit), stepPeek)
	d = core.stepAt(k, now, int64(Unit), stepCheck)
	core.unlockShard(i)
	return d, before.Allowed && !d.Allowed
}

// Reset forgets everything about key: its failures, its block if it is
// blocked, and its streak of blocks. It is an administrative action, or
// what a caller does when a key's failures should no longer count (a
// successful login to the account a lockout protects). Resetting the
// failures of a client address on each success lets a client that knows
// one password guess others without end: do it per account, not per
// address.
func (l *Lockout) Reset(key string) { l.store.Reset(key) }

// Clock returns the clock the lockout reads.
func (l *Lockout) Clock() Clock { return l.store.Clock() }

// Stats returns the counters of the lockout's store of keys.
func (l *Lockout) Stats() StoreStats { return l.store.Stats() }

// lockState is a key's lockout state. The zero value is a fresh key.
type lockState struct {
	log   slState // the failures within the span; none while blocked
	until int64   // when the latest block ends; 0 if none ever began
	last  int64   // the latest block's length; 0 once forgotten
}

// lockAlgo is a compiled LockoutRule. Its step is a failure (commit true)
// or a look (commit false) at now; the cost is always Unit, one failure in
// the log. It is an algorithm only so that a Store can hold its keys: it
// is not a Rule, so no Plans moves it, no Machine encodes it and nothing
// refunds it.
type lockAlgo struct {
	log      *slAlgo // SlidingLog{Failures, Within}: the exact count of failures
	block    int64
	growth   int64 // < 2: blocks never grow
	maxBlock int64
	forget   int64 // 0 without growth
	ruleBase
}

// lockoutError is the error for a LockoutRule field.
func lockoutError(field, reason string) error {
	return &RuleError{Rule: "LockoutRule", Field: field, Reason: reason}
}

func (r LockoutRule) compile() (*lockAlgo, error) {
	log, err := SlidingLog{Limit: r.Failures, Window: r.Within, Name: r.Name}.compile()
	if err != nil {
		// The sliding log's own validation, told in the lockout's words.
		var re *RuleError
		if errors.As(err, &re) {
			field := map[string]string{"Limit": "Failures", "Window": "Within"}[re.Field]
			return nil, lockoutError(field, re.Reason)
		}
		return nil, err
	}
	a := &lockAlgo{log: log, block: int64(r.Block), growth: r.Growth, maxBlock: maxSpan, ruleBase: log.ruleBase}
	a.capMilli = int64(Unit)
	switch {
	case r.Block <= 0:
		return nil, lockoutError("Block", "must be positive")
	case int64(r.Block) > maxSpan:
		return nil, lockoutError("Block", "must be less than MaxTime")
	case r.Growth < 0:
		return nil, lockoutError("Growth", "must be 0 or 1 (no growth) or the factor each repeat block grows by")
	case r.MaxBlock < 0 || (r.MaxBlock > 0 && r.MaxBlock < r.Block):
		return nil, lockoutError("MaxBlock", "must be 0 (no cap) or at least Block")
	case int64(r.MaxBlock) > maxSpan:
		return nil, lockoutError("MaxBlock", "must be less than MaxTime")
	case r.Forget < 0:
		return nil, lockoutError("Forget", "must not be negative")
	case int64(r.Forget) > maxSpan:
		return nil, lockoutError("Forget", "must be less than MaxTime")
	case r.Growth >= 2 && r.Forget == 0:
		return nil, lockoutError("Forget", "must be positive with Growth, so that a streak of blocks ends")
	}
	if r.MaxBlock > 0 {
		a.maxBlock = int64(r.MaxBlock)
	}
	if r.Growth >= 2 {
		a.forget = int64(r.Forget)
	}
	return a, nil
}

// next returns the length of a block that follows one of length last in
// the same streak (last 0: the first of a streak), saturating at maxBlock.
func (a *lockAlgo) next(last int64) int64 {
	switch {
	case last == 0 || a.growth < 2:
		return min(a.block, a.maxBlock)
	case last > a.maxBlock/a.growth:
		return a.maxBlock
	}
	return last * a.growth
}

func (a *lockAlgo) step(s *lockState, now, _ int64, m stepMode) Decision {
	d := a.pol.decision()
	d.At = time.Duration(now)
	if now < s.until {
		d.RetryAfter = time.Duration(s.until - now)
		d.ResetAfter = a.resetAfter(s, now)
		return d
	}
	// The failures are counted exactly by the sliding log of Failures per
	// Within. It never holds Failures of them: the failure that makes
	// Failures starts a block and clears it. So a look always admits one
	// more, and a failure is always admitted into it.
	f := a.log.step(&s.log, now, int64(Unit), m)
	switch {
	case !m.commits():
		d.Allowed = true
		if f.Allowed {
			d.Remaining = f.Remaining + 1 // the look counted one failure more
		}
	case f.Allowed && f.Remaining > 0:
		d.Allowed = true
		d.Remaining = f.Remaining
	default:
		// The Failures-th failure within the span: a block starts now. It
		// continues the streak if it starts less than forget after the
		// previous block ended.
		if s.last > 0 && now >= s.until+a.forget {
			s.last = 0
		}
		s.last = a.next(s.last)
		s.until = min(now+s.last, int64(MaxTime)) // both below 2^62: no overflow
		s.log = slState{}
		if now < s.until {
			d.RetryAfter = time.Duration(s.until - now)
		} else {
			// At MaxTime, where time stops, a block ends as it starts.
			d.Allowed = true
			d.Remaining = a.pol.limit
		}
	}
	d.ResetAfter = a.resetAfter(s, now)
	return d
}

// resetAfter is the time from now until s is fresh (see fresh).
func (a *lockAlgo) resetAfter(s *lockState, now int64) time.Duration {
	var end int64
	if n := len(s.log.buf); n > 0 {
		end = s.log.at(n-1).t + a.log.window
	}
	if s.last > 0 {
		end = max(end, s.until+a.forget)
	}
	return time.Duration(max(0, end-now))
}

// fresh: not blocked, no failure within the span, and no streak of blocks
// to remember.
func (a *lockAlgo) fresh(s *lockState, now int64) bool {
	return a.resetAfter(s, now) == 0
}

// The rest of the algorithm interface, which a Lockout never calls (see
// lockAlgo): its failures are its spending, and nothing is given back,
// charged after the fact or encoded.

func (a *lockAlgo) spentAt(s *lockState, now int64) int64 { return a.log.spentAt(&s.log, now) }

func (a *lockAlgo) wholeAt(s *lockState, now int64) int64 { return a.log.wholeAt(&s.log, now) }

func (a *lockAlgo) withSpent(s *lockState, now, x, until int64) {
	a.log.withSpent(&s.log, now, x, until)
}

func (a *lockAlgo) refund(*lockState, int64, int64, int64) int64 { return 0 }

func (a *lockAlgo) charge(*lockState, int64, int64) int64 { return 0 }

func (a *lockAlgo) decodeAt([]int64, *lockState, int64) error {
	return errors.New("ratelimit: a lockout's state is not encoded")
}

func (a *lockAlgo) encode(dst []byte, _ *lockState) []byte { return dst }

func (a *lockAlgo) params() Params { return a.pol.params(a.capMilli) }
