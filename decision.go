package ratelimit

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Units counts allowance in thousandths of one request. A plain request costs
// [Unit]; a bulk call that counts as ten requests costs 10*Unit, and a cheap
// call may cost Unit/4. Like [time.Duration], the type reads naturally in
// arithmetic: 10*ratelimit.Unit, ratelimit.Unit/2.
//
// Costs are always positive: a cost of zero or less is rejected with
// [ErrInvalidCost].
type Units int64

// Unit is the cost of one ordinary request: 1000 milli-units.
const Unit Units = 1000

// String formats u in whole units with up to three decimals, such as "1",
// "0.25" or "-3.5".
func (u Units) String() string {
	n := int64(u)
	neg := n < 0
	var mag uint64
	if neg {
		mag = uint64(-(n + 1)) + 1 // no overflow for math.MinInt64
	} else {
		mag = uint64(n)
	}
	s := strconv.FormatUint(mag/1000, 10)
	if frac := mag % 1000; frac != 0 {
		f := strconv.FormatUint(frac+1000, 10)[1:] // three digits, leading zeros kept
		for f[len(f)-1] == '0' {
			f = f[:len(f)-1]
		}
		s += "." + f
	}
	if neg {
		s = "-" + s
	}
	return s
}

// Decision is the outcome of one check. Every field has the same meaning for
// every algorithm, so a caller (or a reference model) can rely on it without
// knowing which rule produced it.
type Decision struct {
	// Allowed reports whether the request was admitted. An admitted request
	// has spent its cost; a denied one has spent nothing, except under a
	// rule that counts refusals as a penalty ([SlidingCounter] and
	// [SubWindow] with CountRefused), where a denied Check spends its cost
	// too and the other fields describe the key after that. Callers that
	// never count a refusal (Wait, CheckWithin, a [Composite], a plan)
	// describe the key as it stands.
	Allowed bool

	// Shadowed reports that a limit in shadow mode would have denied this
	// request (see [Shadow]): Allowed is true only because that limit
	// watches without enforcing. The limit's own answer, RetryAfter
	// included, goes to its [ShadowFunc].
	Shadowed bool

	// Limit is the rule's capacity in whole units: Burst for a token bucket
	// or GCRA, Capacity for a leaky bucket, Limit for the window algorithms.
	Limit int64

	// Remaining is the largest cost, in whole units rounded down, that could
	// be admitted at this same instant after this decision: 0 while the key
	// is in debt, having been charged past its limit by [Store.Settle].
	Remaining int64

	// RetryAfter is, for a denied request, the exact wait until this same
	// request would be admitted if nothing else arrives in between, rounded
	// up to the nanosecond. It is 0 when the request was allowed. An
	// in-flight limit ([InFlight]) cannot know when a request in progress
	// will end: its refusals have RetryAfter 0, meaning unknown, not now.
	RetryAfter time.Duration

	// ResetAfter is how long until the key is as good as a fresh one if
	// nothing else arrives: Remaining equals Limit again and, for the window
	// algorithms, nothing admitted still counts. It is rounded up to the
	// nanosecond, and 0 for a key that is already fresh.
	ResetAfter time.Duration

	// Delay is set by the leaky bucket alone: how long an admitted request
	// must wait before it goes on (its place in the queue). It is rounded up
	// to the nanosecond, so a request that waits Delay never leaves early.
	// Every other algorithm leaves it 0.
	Delay time.Duration

	// Policy is the name of the rule that made this decision (its Name
	// field), or "" for an unnamed rule. A composite limit reports the name
	// of its most constraining part.
	Policy string

	// At is the instant the decision was made at, on the limiter's clock
	// (its Now, clamped so that it never goes back): the instant an
	// admitted cost was spent, which [Store.Refund] and the other refunds
	// need to know what of it can still be given back. It is 0 on a cost
	// error, and for a [Composite] the one instant all its layers decided
	// at.
	At time.Duration

	// Window is the time span that Limit is a quota for: the window of a
	// window algorithm, and for the buckets the time to earn the whole
	// capacity at the rule's rate (rounded up to the nanosecond). Together
	// with Limit it describes the policy, as HTTP's RateLimit-Policy does.
	Window time.Duration
}

// Errors returned by [Limiter.Check] and by the constructors. Match them with
// [errors.Is]; the errors returned may wrap them with more detail.
var (
	// ErrInvalidCost is returned for a cost of zero or less.
	ErrInvalidCost = errors.New("ratelimit: cost must be positive")

	// ErrCostExceedsCapacity is returned for a cost larger than the rule's
	// capacity: such a request could never be admitted, however long it
	// waited. An HTTP layer should answer it with 400 or 413, not 429.
	ErrCostExceedsCapacity = errors.New("ratelimit: cost exceeds the rule's capacity")

	// ErrInvalidRule is returned by the constructors for a rule that is
	// malformed or whose arithmetic could overflow. The error is a
	// [*RuleError] naming the rule and the field.
	ErrInvalidRule = errors.New("ratelimit: invalid rule")
)

// CostError is the error for a cost that can never be admitted: zero or
// less, matching [ErrInvalidCost] with [errors.Is], or above the rule's
// capacity, matching [ErrCostExceedsCapacity]. It says the numbers:
// "ratelimit: cost 21 exceeds the capacity 20 of rule "api"".
type CostError struct {
	Cost     Units  // the cost asked for
	Capacity Units  // the rule's capacity, Limit whole units
	Policy   string // the rule's Name, or "" for an unnamed rule
}

// Error describes the cost, the capacity and the rule.
func (e *CostError) Error() string {
	rule := "the rule"
	if e.Policy != "" {
		rule = "rule " + strconv.Quote(e.Policy)
	}
	if e.Cost <= 0 {
		return "ratelimit: cost " + e.Cost.String() + " is not positive (for " + rule + ")"
	}
	return "ratelimit: cost " + e.Cost.String() + " exceeds the capacity " + e.Capacity.String() + " of " + rule +
		": it can never be admitted (a plain request costs Unit, 1000)"
}

// Is reports whether target is a CostError with the same fields.
func (e *CostError) Is(target error) bool {
	t, ok := target.(*CostError)
	return ok && *t == *e
}

// Unwrap returns [ErrInvalidCost] or [ErrCostExceedsCapacity].
func (e *CostError) Unwrap() error {
	if e.Cost <= 0 {
		return ErrInvalidCost
	}
	return ErrCostExceedsCapacity
}

// RuleError describes a rule rejected by a constructor. It matches
// [ErrInvalidRule] with [errors.Is].
type RuleError struct {
	Rule   string // the rule type, such as "TokenBucket"
	Field  string // the offending field, such as "Burst" or "Rate.Per"
	Reason string // what is wrong with it
}

// Error returns "ratelimit: invalid <Rule>: <Field> <Reason>".
func (e *RuleError) Error() string {
	return fmt.Sprintf("ratelimit: invalid %s: %s %s", e.Rule, e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidRule].
func (e *RuleError) Unwrap() error { return ErrInvalidRule }
