// Package redisstore is a keyed rate limiter whose state lives in Redis:
// one allowance per key shared by every process that uses the same Redis,
// with exactly the decisions of the in-process [ratelimit.Store].
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	s, err := redisstore.New(rdb, ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100})
//	d, err := s.CheckContext(ctx, apiKey, ratelimit.Unit)
//
// # How a check runs
//
// A check is one script call (EVALSHA, or EVAL once after the server lost
// its script cache), atomic on the server. Redis Lua has only doubles,
// exact to 2^53, while nanosecond Unix times, capacities in milli-units and
// the sliding counter's products go far beyond; the script therefore does
// all its arithmetic on integers split into base-10^7 limbs, exactly. It
// returns the key's old state, the instant it used and the new state it
// wrote, and the Decision is computed in Go by the rule's
// [ratelimit.Machine] from that old state and instant; the Machine's new
// state must equal the script's, or the check is denied with [ErrMismatch].
//
// # Time
//
// By default a check runs at the Redis server's TIME, read once by the
// script, so that every client shares one clock. [WithClock] passes a client
// clock instead (Unix nanoseconds; a [ratelimit.ManualClock] in tests).
// Either way each key clamps to the latest instant it was checked at, so it
// never sees time go back. Window boundaries are multiples of the window
// from the Unix epoch.
//
// # Keys and expiry
//
// A key's state is one Redis key, named by [Store.Key]: the prefix, a tag of
// the rule's numbers, and the hex of a hash of the key in braces, which is
// the Cluster hash tag. Keys of any length or bytes are safe. A rule with
// other numbers uses other Redis keys, so a changed rule starts its keys
// fresh. The state is written with an expiry at the instant it becomes as
// good as a fresh key's (the Decision's ResetAfter, rounded up to the
// millisecond) plus a margin for clock skew ([WithExpiryMargin]); losing it
// then loses nothing. A state is a few dozen bytes, except the sliding
// log's, which holds one entry per instant something was admitted within
// the window and is read whole by every check: keep its limits small.
//
// # When Redis fails
//
// Every check has a deadline: the caller's context's, else [WithTimeout]'s
// (100 ms by default). When Redis errs or misses the deadline, the check
// returns an error wrapping [ErrUnavailable] and the cause, and the Decision
// of the failure policy: fail open (the default: a fresh key's Decision),
// fail closed ([WithFailureMode]), or a local in-process limiter
// ([WithFallback]). After repeated failures a circuit breaker
// ([WithCircuit]) stops trying Redis, so that checks no longer wait out a
// deadline each, and lets one check probe Redis after a pause; checks
// resume by themselves once it answers. A key whose stored state is
// corrupted is denied with an error matching [ratelimit.ErrInvalidState],
// whatever the policy; deleting the key resets it.
//
// A check that missed its deadline may still reach the server and run
// there (a paused server runs what it finds queued when it wakes): it then
// spends, although its caller got the failure policy's answer. Likewise
// go-redis retries a command after some network errors (MaxRetries): a
// retried check that had already run is counted twice, which can only deny,
// never admit, more. Set MaxRetries to -1 to count each check once.
package redisstore
