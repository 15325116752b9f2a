// Package ratelimit is an embeddable, exact rate limiter.
//
// Seven algorithms are used through one [Limiter] interface: [TokenBucket],
// [GCRA], [LeakyBucket], [FixedWindow], [SlidingLog], [SlidingCounter] and
// [SubWindow].
// A rule is a plain value; [New] validates it and returns a limiter for one
// key, [NewStore] a bounded [Store] with one allowance per key. Time comes
// from an injected monotonic [Clock] ([ManualClock] for virtual time in
// tests), allowance is counted in integer milli-units ([Units]), rates are
// exact rationals ([Rate]), and every check returns a [Decision].
//
//	lim, err := ratelimit.New(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 20})
//	if err != nil {
//		return err // a malformed rule: errors.Is(err, ratelimit.ErrInvalidRule)
//	}
//	d, err := lim.Check(ratelimit.Unit) // one request: Unit, not 1
//	if err == nil && !d.Allowed {
//		// refused: tell the client to come back after d.RetryAfter
//	}
//
// Costs are in thousandths of a request: Check(1) asks for a thousandth of
// one, so write costs as multiples of [Unit].
//
// Check decides at once. [Limiter.Wait] blocks instead until the request is
// admitted, sleeping for exactly the wait each denial names, and gives up
// at once, spending nothing, if the context's deadline would pass first: the
// way to pace outbound calls. A [LeakyBucket] request is admitted into the
// queue first and then waits its Delay; if the context ends during that
// Delay it stays spent, for a single key, a [Store] and a [Composite] alike.
// [Store.CheckWithin] and [Composite.CheckWithin] admit only a request that
// would go on within a given delay, spending nothing otherwise, and [Sleep]
// waits on a limiter's clock ([Store.Clock]). Package
// [github.com/ratekit/ratelimit/httplimit] puts a [Store] in front of any
// [net/http.Handler], with 429 answers, Retry-After and the RateLimit fields.
// [Compose] puts several limits on each request (a global cap, a plan per
// customer, a tighter limit for an expensive route): a request passes only
// if every layer admits it, and one refused by any layer spends nothing.
// [Plans] picks each key's rule at check time from named plans (a rule per
// customer), and [Plans.Update] changes rules while checks run: each key
// moves to its new rule on its next check, keeping what a [Migration]
// policy says, never a fresh allowance unless asked. [Shadow] and [ShadowKeyed] run a rule on live traffic without refusing
// anything, reporting what it would have refused. [RuleSpec] reads rules
// from JSON configuration, strictly, and writes them back losslessly.
// [InFlight] is a limit that is not a rate: at most N requests of a key in
// progress at once, each holding a slot until its [Release] is called
// (idempotently), with an optional MaxHold that takes back the slots of
// holders that never release. [InFlight.AcquireWith] takes a slot and asks
// rate limits in one turn, all or nothing: a request refused by either
// spends nothing of the other.
// [WorkerShedder] and [FleetShedder] shed load rather than limit a client:
// requests in priority classes ([ShedClass]) set by the application, the
// least important refused first as the work in progress nears a limit
// (fixed, or following latency with [Gradient]), so that room is kept for
// critical work; httplimit and grpclimit answer a request shed 503 or
// UNAVAILABLE, apart from a rate limit's 429 or RESOURCE_EXHAUSTED.
// [ContextChecker] is the keyed check that takes a context, the form of a
// limiter whose state lives elsewhere; Store, Composite and Plans implement
// it.
// For those writing such a backend, [NewMachine] returns a rule's state
// transition on an encoded state ([Machine]) and its exact compiled
// integers ([Params]), so that the backend decides exactly as this package
// does.
//
// # Which algorithm?
//
// The buckets limit a rate and allow a burst on top of it; the window rules
// count what was admitted in a window of time. State is what one key costs
// the algorithm (a [Store] adds its own overhead per key); t is any span of
// time, W the rule's Window.
//
//	                burst               state per key     most admitted in t        RetryAfter
//	TokenBucket     Burst, then Rate    16 bytes (GCRA's) Burst + Rate x t          exact: tokens earned
//	GCRA            as TokenBucket      16 bytes          as TokenBucket            as TokenBucket
//	LeakyBucket     queued up to        16 bytes          as TokenBucket, but they  exact: room in the queue
//	                Capacity, each                        go on at Rate, one after
//	                waits its Delay                       another
//	FixedWindow     Limit               16 bytes          2 x Limit (t = W across   end of the window
//	                                                      a boundary)
//	SlidingLog      Limit               40 bytes + a log  Limit (t = W): exact      exact: oldest cost leaves
//	                                    of what is still
//	                                    in W (see there)
//	SlidingCounter  Limit               16 bytes (24 for  an estimate: nearly       exact for the estimate
//	                                    a Limit over      2 x Limit (t = W) when
//	                                    2,147,483)        traffic is uneven
//	SubWindow       Limit, counted in   56 bytes (k <= 6) Limit in any t <= W-W/k;  start of the bucket at
//	                k buckets of W/k    136 (k <= 16) or  2 x Limit (t = W) for     which enough has left
//	                                    488 (k <= 60),    any k, from a burst at
//	                                    inline            the end of one bucket
//
// In short:
//   - [GCRA] is the default for an API: a sustained rate with a burst
//     allowance, constant memory, exact retry times. [TokenBucket] makes
//     the same decisions and reads more familiarly; GCRA's state is smaller
//     (16 bytes, two words), and for rates of a whole number of nanoseconds
//     per milli-unit (10/s, 100/min, ...) its single-key limiter keeps one
//     word and needs no lock.
//   - [LeakyBucket] when the work behind the limit must arrive smoothly (a
//     fragile upstream, outbound calls to a partner): it queues rather than
//     refuses, up to Capacity, and Delay says how long each request waits.
//     NGINX's limit_req "rate=r burst=b" is LeakyBucket{Rate: r, Capacity:
//     b+1}.
//   - [SlidingLog] when "at most N in any window of W" is a promise (a
//     contract, a partner's hard quota). Its memory grows with N, so keep N
//     moderate.
//   - [FixedWindow] when quotas reset at window boundaries and twice the
//     limit across a boundary is acceptable: the cheapest, and the easiest
//     to explain.
//   - [SlidingCounter] for a sliding window in constant memory, if an
//     estimate will do: it assumes the previous window's traffic was spread
//     evenly. A burst at the end of one window followed by steady traffic
//     gets close to twice the limit through in a sliding window. With
//     CountRefused, refusals count too, as a penalty on clients that keep
//     sending into a full window.
//   - [SubWindow] for a sliding window that never estimates: k counters of
//     W/k each, the window sliding in steps of W/k (k = 1 is a fixed
//     window). It is exact over any span up to W - W/k; a burst packed into
//     the last instants of one bucket can still see up to twice the limit
//     pass in a span of W, whatever k. Its state is k counters, inline, so
//     it costs more memory per key the finer it slides.
//   - [LeakyBucket] with Delay for NGINX's two-stage limiting ("burst=b
//     delay=d"): the first requests of a burst go on at once, the next are
//     paced, the rest refused.
//
// go run ./examples/playground runs all seven on the same traffic and prints
// what each admits.
//
// # Units, rates and limits
//
// A request's cost is in [Units], thousandths of one request's allowance:
// [Unit] is one request, 10*Unit a bulk call that counts as ten, Unit/4 a
// cheap one. Burst, Capacity and Limit are whole units, from 1 to 1e15. A
// [Rate] is Count units per Per, kept as an exact fraction: PerMinute(100)
// is exactly 100 per 60 s, not 1.67 per second, and rates such as 7 per 3 s
// or 1,000,003 per hour are exact too. Rate.Count is at most 1e15, and every
// duration a rule implies (its period, its window, the time to refill or
// drain its whole capacity) must be less than [MaxTime], about 146 years.
//
// # Decisions, exactness and rounding
//
// Every field of a [Decision] has one definition for every algorithm:
//   - Allowed: whether the request was admitted. An admitted request spends
//     its cost; a refused one spends nothing, except under a rule that
//     counts refusals on purpose (CountRefused of [SlidingCounter] and
//     [SubWindow]), where a Check's other fields then describe the key
//     after it. Wait, CheckWithin, composites and plans never count a
//     refusal, and describe the key as it stands.
//   - Remaining: the largest cost, in whole units rounded down, that could
//     be admitted at the same instant after this decision: 0 while the key
//     is in debt (see [Settle]).
//   - RetryAfter (refused only): the smallest wait after which this same
//     request would be admitted if nothing else arrives, rounded up to the
//     nanosecond. A request sent exactly RetryAfter later passes; one sent
//     a nanosecond earlier does not.
//   - ResetAfter: how long until the key is as good as a fresh one if
//     nothing else arrives (Remaining back at Limit and, for the window
//     rules, nothing admitted still counting), rounded up; 0 for a fresh key.
//   - Delay (leaky bucket only): how long the admitted request waits before
//     it goes on, rounded up so that it never leaves early.
//   - Limit, Policy and Window describe the rule: its capacity in whole
//     units, its Name, and the span Limit is a quota for (the window, or
//     for a bucket the time to earn the whole capacity).
//   - At: the instant on the limiter's clock the decision was made at,
//     which a refund of an admitted cost needs (see below).
//
// Decisions are computed in integers only: time in nanoseconds, allowance
// in milli-units, rates as fractions, with 128-bit intermediates where a
// product could overflow and the remainder of every division carried, so
// nothing drifts over years of virtual time. There is no floating point in
// any decision. Each algorithm is tested against a reference model: in
// math/big rationals for six of them, and for the sliding log an exact
// int64 list of every admitted event. A fresh key starts full.
//
// # Clocks and time
//
// A [Clock] returns monotonic time since an origin of its choosing.
// [SystemClock], the default, reads Go's monotonic clock and so never sees
// wall-clock steps. [ManualClock] is virtual time that moves only when told
// to ([ManualClock.Set], [ManualClock.Advance]): build the limiter under
// test with [WithClock] and a test never sleeps and gives the same result
// every run. Goroutines in Wait sleep on the ManualClock's own time, and
// [ManualClock.BlockUntilSleepers] and [ManualClock.NextWake] let a test
// move the clock to the moment they wake. Limiters do not trust a clock: a reading earlier than the
// latest one already used is taken as that latest instant, a negative one
// as 0 and one beyond MaxTime as MaxTime.
//
// The window rules cut time into windows [kW, (k+1)W) from the clock's
// origin. For SystemClock that is when the process started, not the top of
// a wall-clock minute or hour.
//
// # Concurrency
//
// Limiters and stores are safe for concurrent use, and concurrent checks
// are linearizable: they behave as if made one at a time, in an order
// consistent with real time, so 1,000 concurrent requests against a limit
// of 100 admit exactly 100. Rules are immutable values. Nothing in the
// package starts a goroutine or needs closing, and Check does not
// allocate, except that a sliding log grows its log as admissions
// accumulate, a [Store] grows its tables as keys arrive, and a key longer
// than [MaxKeyLen] costs one allocation per Check for its digest.
//
// # Many keys
//
// A [Store] keeps one allowance per key (a client, an API key, an address)
// under one rule, with exactly the single-key semantics for each key. It
// is bounded ([WithMaxKeys], [DefaultMaxKeys] by default) and never holds
// more keys: when full it first drops keys whose state is as good as a
// fresh key's, which loses nothing, then the least recently used. Dropping
// a partly spent key hands it a fresh allowance when it comes back;
// [StoreStats].LossyEvictions counts those, and a count that keeps growing
// means the store is too small for its traffic. A key costs the store a
// slot of a word and its state, and a copy of its bytes (see [Store];
// docs/tail.md measures the bytes per key): no pointer per key, so that the
// garbage collector has only the store's arrays to mark. It grows in
// segments of at most 32 KiB, so that no Check copies more than one, and a
// Store's Check that must allocate for its key lets go of the shard's lock
// while it does, so that no other check waits for that allocation (the
// paths that hold several shards, or a shard across a wait, allocate under
// it);
// [WithPreallocation] allocates them all when the store is built, so that
// hardly any Check allocates.
//
// # Lockouts
//
// A [Lockout] blocks keys that fail too often, the pattern of fail2ban and
// account lockouts: [Lockout.Fail] counts a failure the caller saw (a
// wrong password), and a key with [LockoutRule].Failures of them within
// any span of Within is blocked for Block, Growth times longer for each
// repeat that comes less than Forget after the previous block ended, up to
// MaxBlock. [Lockout.Check] tells whether a key is blocked, with RetryAfter
// exactly the time left. Failures are counted by a sliding log, and keys
// are kept in a bounded [Store] of their own. Attempts that run at once
// all pass Check before any of their failures counts, so bound the
// attempts too: httplimit's WithCountOnly charges only the requests whose
// responses count, before they run.
//
// # After the fact
//
// Four things can be done besides checking, on every limiter of this
// package: the single-key limiter through [Peek], [Reset], [Refund] and
// [Settle], and a [Store], [Composite] or [Plans] through its methods of
// those names.
//
//   - Peek returns the Decision a cost would get now, spending nothing: the
//     same Decision as a Check at that instant, with nothing changed and no
//     key added (a key not held is judged fresh).
//   - Reset starts a key again fresh, an administrative action.
//   - Refund gives back admitted cost, given the admitting Decision's At:
//     at most what the key still holds of that admission (a bucket that
//     has refilled since, or a window that has passed, gives nothing back).
//     Check(c) followed at once by Refund(c) leaves the key exactly as it
//     was, and no refund leaves a key with more allowance than if the cost
//     had never been admitted. See [Store.Refund] for each algorithm.
//   - Settle charges the real cost of a request admitted on an estimate,
//     once it is known: the difference is spent at once, even past the
//     limit, or refunded by Refund's rules. A key can go into debt by at
//     most one capacity (twice its capacity in use), which its next
//     requests wait off; what that bound stops is not charged, and the
//     cost Settle reports as settled says so. See [Store.Settle] for where
//     each algorithm keeps the debt.
//
// # Errors
//
// A refusal is not an error: it is a Decision with Allowed false. Check
// returns an error only for a request that could never pass: a cost of
// zero or less ([ErrInvalidCost]) or one larger than the rule's capacity
// ([ErrCostExceedsCapacity]), as a [*CostError] that says the cost, the
// capacity and the rule; an HTTP layer answers those with 400 or 413, not
// 429. Constructors return an error matching [ErrInvalidRule] (a
// [*RuleError] naming the rule and field) for a malformed rule, and
// [NewStore] one matching [ErrInvalidOption] for an option out of range:
// bad input is an error, never a panic. Match errors with [errors.Is].
package ratelimit
