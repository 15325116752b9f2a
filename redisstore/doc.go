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
// the sliding counter's products go far beyond. The script therefore has
// two paths that decide alike:
//
//   - a fast path in plain doubles, taken when a range check proves that
//     every quantity it touches stays exact: times are split into seconds
//     and nanoseconds and used only as distances from the key's clamped
//     now, at most 2^22 s (48 days) away; the rule's constants, costs,
//     counts and spans are below 2^51; windows (a SubWindow's buckets)
//     are whole microseconds or divide a second. Rules of everyday sizes
//     (up to weeks, up to billions of units) run here;
//   - an exact path for everything else: the buckets (which only add,
//     subtract and compare) hold each integer as two doubles, h*10^9 + l;
//     the windows (which also divide and multiply) split integers into
//     base-10^7 limbs. It takes spans of months or years, capacities of
//     2^51 milli-units or more, windows such as 1.5 µs, a sliding log
//     holding entries more than 48 days old, and every state that is not
//     well formed (which it refuses).
//
// The script returns the key's old state, the instant it used and the new
// state it wrote, and the Decision is computed in Go by the rule's
// [ratelimit.Machine] from that old state and instant; the Machine's new
// state must equal the script's, or the check is denied with [ErrMismatch].
// Whichever path ran, the Decision is the in-process limiter's: the tests
// force each path and compare both with it, on either side of every range
// check.
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
// other numbers (a leaky bucket's Delay, CountRefused and a SubWindow's
// Buckets included) uses other Redis keys, so a changed rule starts its
// keys fresh. The state is written with an expiry at the instant it becomes as
// good as a fresh key's (the Decision's ResetAfter, rounded up to the
// millisecond) plus a margin for clock skew ([WithExpiryMargin]); losing it
// then loses nothing. A missing key, and a key holding the empty string,
// are a fresh key, as the empty state is for [ratelimit.Machine.Step].
//
// A state is a few dozen bytes of decimals; MEMORY USAGE reports about 150
// bytes per key for the buckets and windows on Redis 7.0 (the key's name,
// its string value and Redis's own per-key overhead), the same order as
// other Redis limiters. The sliding log's state holds one entry per
// instant something was admitted within the window and is read whole by
// every check: keep its limits small.
//
// Anything that makes Redis drop a key before it expires makes that key
// start fresh, with its whole allowance: eviction under maxmemory with an
// allkeys-* or volatile-* policy (every state has an expiry, so volatile-*
// policies may pick them), a FLUSHDB, a restart of a Redis without
// persistence (or with an fsync policy that can lose the last second's
// writes), or a failover to a replica that had not yet received the last
// writes, replication being asynchronous. That is the same as an
// in-process store evicting a partly spent key: a lossy eviction that can
// only admit more, never deny what it should have admitted. Under
// maxmemory-policy noeviction, a full Redis refuses the write instead: the
// check fails and the failure policy answers. Size Redis for the number of
// live keys (a key lives at most its rule's reset time plus the margin)
// rather than relying on eviction.
//
// # Several limits per request
//
// [NewComposite] checks every request against several limits (a global
// cap, a per-customer plan, a per-route limit) as [ratelimit.Composite]
// does in process, with the same Decisions: one script reads every layer's
// state, decides each at one instant with its layer's step, and writes
// only if every enforced layer admits, so a request refused by one layer
// spends nothing from the others, whichever process sent it. In Redis
// Cluster all the keys of one script must share a slot: layers whose keys
// share a hash tag ([WithHashTag]) work anywhere, while a global key beside
// per-customer keys cannot, and is refused when the Composite is built on
// a Cluster client (see [Layer]). As in process, a Composite never spends
// a refusal, CountRefused or not.
//
// # After the fact
//
// [Store.Peek], [Store.Refund] and [Store.Reset] are the in-process
// store's (see [ratelimit.Store.Peek], [ratelimit.Store.Refund] and
// [ratelimit.Store.Reset]), with the same Decisions and amounts, each
// within a deadline as a check is. A peek reads the key's state and the
// instant in one round trip and decides in Go with the rule's Machine,
// writing nothing. A refund reads the same, computes the amount and the new
// state in Go ([ratelimit.Machine.Refund]), and writes it with a
// compare-and-set that keeps the key's expiry: if checks changed the key in
// between it reads again, a bounded number of times, then fails with
// [ErrConflict]; it never gives back twice or on a state it did not read.
// A reset replaces the key's state by a fresh key's that keeps the key's
// clamp on time. A refund or reset drops the key from this store's deny
// cache; another process's deny cache may keep refusing the key until its
// own cached refusal runs out (see [WithDenyCache]).
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
// In Redis Cluster a lost master fails only the checks of keys in its
// slots: the other masters' keys are decided as before (with
// cluster-require-full-coverage no; with the default, the live masters
// refuse every key once the cluster marks the master failed). The circuit
// breaker, though, counts a Store's failures whatever master they came
// from: a run of failures on the lost master's keys opens it for every
// key, and until a probe succeeds the live masters' keys get the failure
// policy's answer too. Where that matters (fail open admits them as fresh
// keys), raise the circuit's failure count ([WithCircuit]) so that it
// opens only when far more checks fail than one master's share.
//
// A check that missed its deadline may still reach the server and run
// there (a paused server runs what it finds queued when it wakes): it then
// spends, although its caller got the failure policy's answer. Likewise
// go-redis retries a command after some network errors (MaxRetries): a
// retried check that had already run is counted twice, which can only deny,
// never admit, more. Set MaxRetries to -1 to count each check once.
package redisstore
