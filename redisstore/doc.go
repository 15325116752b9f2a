// Package redisstore is a keyed rate limiter whose state lives in Redis:
// one allowance per key shared by every process that uses the same Redis,
// with exactly the decisions of the in-process [ratelimit.Store] (but for
// the refusals its deny cache answers without asking Redis, which may
// report a longer wait: see [WithDenyCache]).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	s, err := redisstore.New(rdb, ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100})
//	d, err := s.CheckContext(ctx, apiKey, ratelimit.Unit)
//
// The other keyed limits are here too, shared by every process the same
// way: [Composite] (several limits per request), [Lockout] (blocks after
// repeated failures; it fails closed by default) and [InFlight] (requests
// in progress; [InFlight.AcquireWith] takes a slot and a Store's allowance
// in one script). Each has the Decisions of its in-process counterpart.
//
// # How a check runs
//
// A check is one script call, atomic on the server. On a [redis.Client]
// (one server) it is a function of a library the store loads with
// FUNCTION LOAD on first use (Redis 7): the library builds the Lua
// functions of both paths, below, once when it loads, not on every call
// (a script builds the exact path's only on a call that takes it), and a
// check sends the rule's arguments as one text, which the library reads
// once and keeps, rather than one argument each (Redis spends on every
// argument a command carries). A server without
// Redis Functions, a Cluster and a Ring get EVALSHA (or EVAL once after
// the server lost its script cache), running the same Lua. Redis Lua has only doubles,
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
//   - an exact path for everything else: it holds each integer as two
//     doubles, h*10^9 + l, and the windows go through base-10^7 limbs
//     only to divide an instant by a window the fast path's division does
//     not take and for a sliding counter's products past 2^53. It takes spans of months or years, capacities of
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
// never sees time go back. (The in-process [ratelimit.Store] clamps per
// shard, to the latest instant any key of the key's shard was checked at:
// after a client clock steps back, it decides a key later than a check
// here, by at most the step, until the clock passes that instant again;
// see its Time section.) Window boundaries are multiples of the window
// from the Unix epoch.
//
// # Keys and expiry
//
// A key's state is one Redis key, named by [Store.Key]: the prefix, a tag of
// the rule's numbers, and the hex of a hash of the key in braces, which is
// the Cluster hash tag. Keys of any length or bytes are safe. A rule with
// other numbers (a leaky bucket's Delay, CountRefused and a SubWindow's
// Buckets included) uses other Redis keys, so a changed rule starts its
// keys fresh, except under [Plans], which moves a key to its new rule
// (see Plans below). The state is written with an expiry at the instant
// it becomes as good as a fresh key's (the Decision's ResetAfter, rounded up to the
// millisecond) plus a margin for clock skew ([WithExpiryMargin]); losing it
// then loses nothing. A missing key, and a key holding the empty string,
// are a fresh key, as the empty state is for [ratelimit.Machine.Step].
//
// A state is a few dozen bytes of decimals; a key's MEMORY USAGE is that,
// its name and Redis's own per-key overhead, the same order as other Redis
// limiters (BenchmarkPeers in redisstore/bench reports it). The sliding
// log's state holds one entry per instant something was admitted within the
// window and is read whole by every check: keep its limits small.
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
// a Cluster client (see [Layer]), as is a prefix whose '{' would move the
// keys' hash tag apart (see [WithPrefix]); a script that Redis refuses as
// CROSSSLOT all the same is refused with [ErrCrossSlot], never answered by
// the failure policy. As in process, a Composite never spends a refusal,
// CountRefused or not, and reports one on the keys as they stand.
//
// A Composite has what a Store has around its checks, with the same
// meaning: [Composite.Wait] and [Composite.CheckWithin] (below), a deny
// cache ([WithDenyCache]), the circuit breaker ([WithCircuit]; per master
// on a Cluster client, the master of the request's slot) and a fallback
// ([WithFallback]; a [ratelimit.Composite] of the same layers, say). Its
// deny cache keeps, per request key, the states of every layer as Redis's
// refusal read them, and answers a later request that those states refuse
// without a round trip; as the Store's, it never admits and never reports
// a shorter RetryAfter or ResetAfter than Redis would. Other requests
// (another request key that shares a global or per-customer layer's key,
// in this process or another) may have spent on a layer since: a cached
// refusal is reported for the worst case, every layer drained, and
// describes the layer that refuses on the kept states, which is not
// always the one Redis would name. A Composite with a shadow layer has no
// deny cache, since every request must reach the layer's OnShadow.
//
// # Waiting, and a cap on the Delay
//
// [Store.Wait] and [Composite.Wait] sleep out each refusal's RetryAfter on
// the store's clock and check again, as [ratelimit.Store.Wait] does; they
// give up at once, spending nothing, when the request could not go on
// before the context's deadline. [Store.CheckWithin] and
// [Composite.CheckWithin] refuse, spending nothing, a request that would
// wait longer than a cap for its turn, as [ratelimit.Store.CheckWithin]
// does; their Decisions are the in-process ones. Only a leaky bucket has
// a Delay: on every other rule these are checks as [Store.CheckContext]
// makes them. On a leaky bucket (a Composite with an enforced leaky bucket
// layer) the Delay must be known to fit before anything is spent: the
// script is sent the cap (the time left until the deadline, for a Wait)
// with the rule's arguments and itself refuses, writing nothing, an
// admission whose Delay would exceed it. So CheckWithin, and each attempt
// of a Wait with a deadline, is one script call, one round trip, atomic
// with the key's other checks, that never conflicts with them however hot
// the key; its Decision is computed in Go
// ([ratelimit.LayeredMachine.StepWithin]) and checked against what the
// script did, as a check's is. Wait's checks go to Redis, not to the deny
// cache, whose longer RetryAfter would make it sleep longer than it need,
// or give up on a deadline it could meet.
//
// # Plans
//
// [NewPlans] is the Redis counterpart of [ratelimit.NewPlans]: the same
// [ratelimit.PlanSet], plan function and [ratelimit.ContextWithPlan],
// Update with the four [ratelimit.Migration] policies, and the in-process
// Plans' Decisions on the same traces, shared by every replica. Each key
// has a record beside its state, under the same hash tag: the keys of the
// plan that holds its state, that plan's rules as JSON, and what its last
// move carried in. A check of a key its plan holds (or of a key new to
// Redis) is one script call that reads the record and checks. A key whose
// record names another plan, or its plan under other rules, is moved at
// that check: the script returns the record and the states, the move is
// computed in Go by [ratelimit.MoveState] from the rules the record names
// (so a replica on another rule set moves it alike), and a second script
// writes it, compare-and-set on what was read, and checks; a move another
// check beat starts over a few times at most. A plan's keys are named by
// the plan, the layer and the rule, so that replicas on one rule set share
// them, and a rule an Update keeps keeps its keys. In Redis Cluster a
// plan's layers must share the record's slot (a layer with a Key of its
// own needs [WithHashTag], and a global layer a prefix with a tag of its
// own), else the check is refused with [ErrCrossSlot].
// [Plans.CheckWithin] is the in-process Plans' CheckWithin: on a plan with
// a leaky bucket (its rule, or an enforced layer's), the plan's check
// script is sent the cap on the Delay as a Store's or a Composite's is,
// and refuses, writing nothing, an admission that would wait longer.
// [Plans.Wait] waits as [Store.Wait] does, its checks going to Redis, not
// to the deny cache, each attempt with a deadline on such a plan a
// CheckWithin with the time left, so that it never spends a request whose
// Delay outlasts the deadline; a waiter asleep when an Update changes the
// rules wakes and asks again under the new rules. [Plans.CheckLayers]
// gives every enforced layer of the key's plan, as the in-process Plans'
// does, so that httplimit's middleware lists each in its RateLimit fields. [Plans.Peek],
// [Plans.Refund], [Plans.Settle] and [Plans.Reset] are the in-process
// Plans' (see [ratelimit.Plans.Reset]), each one script call on the keys
// of the key's plan after moving the key there as a check would.
//
// # After the fact
//
// [Store.Peek], [Store.Refund], [Store.Settle] and [Store.Reset] are the
// in-process store's (see [ratelimit.Store.Peek], [ratelimit.Store.Refund],
// [ratelimit.Store.Settle] and [ratelimit.Store.Reset]), with the same
// Decisions and amounts, each
// within a deadline as a check is. A peek reads the key's state and the
// instant in one round trip and decides in Go with the rule's Machine,
// writing nothing. A refund is one script, on every rule, that reads the
// key, computes the amount and the new state in exact integer arithmetic
// (base-10^7 limbs, as the check's exact path divides and multiplies,
// whatever the numbers' sizes) and writes it, keeping the key's
// expiry: atomic with the checks around it, so it never conflicts, however
// hot the key. The store then runs the rule's Machine
// ([ratelimit.Machine.Refund]) on the state and instant the script read
// and checks that it gives back and writes the same ([ErrMismatch]
// otherwise). It never gives back twice or on a state it did not read.
//
// A settlement charges the difference between what a request was charged
// and what it turned out to cost ([ratelimit.Machine.Settle]): more is
// charged at once even past the limit, into a debt of at most one capacity
// beyond empty that the key's next checks wait off; less is a refund. It
// runs as a refund does: one script, never a conflict. A charge moves the
// key's expiry on, to at least when the settled state is as good as a
// fresh key's, plus the margin, as a check does; a refund keeps the key's expiry. The check
// scripts, on every path, accept the debts a settlement leaves (up to the
// Machine's bound, not beyond) and decide on them as the Machine does.
//
// A reset replaces the key's state by a fresh key's that keeps the key's
// clamp on time. [Composite.Peek], [Composite.Refund], [Composite.Settle]
// and [Composite.Reset] are the in-process Composite's in the same way,
// over every layer's key in one script (the keys share a slot): a
// composite refund or settlement is settle's script over every layer's
// key, the layers settled at one instant and every enforced layer's new
// state written, all or none, atomic with the checks around it, so it
// never conflicts either; the Composite checks each layer against its
// rule's Machine as a Store does. No operation of a Store or a Composite
// is computed in Go and written with a compare-and-set, so none can
// conflict with other requests on a hot key ([ErrConflict] is never
// returned).
//
// debt). A refund, a settlement's refund or
// a reset drops the key from this store's deny cache, and a settlement's
// charge updates its cached refusal (a Composite's refund, settlement or
// reset drops every refusal its cache holds, since other request keys may
// share the layers' keys); another process's deny cache may
// keep refusing the key until its own cached refusal runs out, and after
// a charge into debt there may report a shorter RetryAfter than Redis
// would (see [WithDenyCache]).
//
// # Leases
//
// One global key that every request of every replica touches costs a round
// trip per request. [NewLeased] wraps a Store so that its hot keys admit
// from leases: a replica takes k units of a key's allowance in one check of
// cost k (the Store's check: same script, deny cache and failure policy),
// spent in Redis when taken, and admits requests from them locally without
// a round trip. What a lease did not use goes back through
// [Store.RefundContext] when it ends: when Hold has passed on the Store's
// clock (a goroutine per live lease waits for that), when the replica
// replaces it with a new one, and at [Leased.Close]. A key leases only when
// it is hot on this replica: its demand (the cost its checks asked for in
// the last period of Hold) is at least twice the request's cost, and k is
// that demand capped at LeaseOptions.Max, so a lease is sized to be used
// within about one Hold; a cold key goes to Redis as on the Store.
//
// [Leased.Peek], [Leased.Refund] and [Leased.Settle] answer from the key's
// live lease, with no round trip, for a request that lease admitted (its
// Decision's At is the lease's): a refund gives back to the lease, which
// admits it again or returns it to Redis when it ends; a settlement's
// extra cost is charged to the lease if it can admit it now. Anything else
// goes to the Store.
//
// Every admission is paid for in Redis before it is made, so the replicas
// together never admit more than the rule allows; the bound stays exact:
//
//   - fixed window, sliding counter, sub-window: a lease admits only within
//     the window (for a sub-window, the bucket) it was spent in, where an
//     admission counts the same whenever it falls: any window holds at most
//     Limit, and the sliding counter's estimate is at most Limit at every
//     admission;
//   - token bucket and GCRA: a lease holds allowance that Redis's bucket
//     no longer has, while that bucket refills as if it were spent. So a
//     lease may have admitted, by any instant, at most what the bucket as
//     its take left it still lacks then; past that it admits nothing more.
//     Then Redis's allowance plus every lease's usable part never exceeds
//     Burst and grows at most at the rate, and the replicas admit at most
//     Burst + Rate x span over any span, as one limiter would. A lease on
//     a bucket near full would decay as fast as it refills, so a bucket key
//     leases only while Redis's last answer for it (its ResetAfter) puts it
//     at least Hold from full.
//
// The leaky bucket (each admission has its own Delay), the sliding log (an
// admission counts from the instant it is recorded, and one recorded early
// would leave the window early) and CountRefused are refused by NewLeased,
// as is a Store with [WithFallback].
//
// What leases cost. Allowance in a lease is spent in Redis but not yet
// admitted: a request to another replica may be refused while it sits
// there. Each replica holds at most one live lease of at most Max per key
// (see below for a give-back in flight), so at most Max x replicas units
// at once. Replicas that always want more than the rule gives, with
// requests of one unit, admit over a run at least what one limiter would
// less that (the tests check it); requests of other costs can leave rests
// too small for them, which go back late. Returning late gives back less,
// as [ratelimit.Store.Refund] does: a
// bucket gets back max(0, rest - Rate x time since the take), a fixed
// window nothing once its window has passed, a sliding counter its rest
// at a lesser weight in the next window, a sub-window nothing once its
// bucket has left the window; a give-back that would return nothing is not
// sent. What is not given back is lost to everyone until it would have
// come back anyway ([LeaseStats] counts it as Unreturned). A take that
// Redis refuses costs the round trip a check alone would: it leases what
// Redis has left, or checks the request alone. A give-back takes one round
// trip (RefundContext's script); when a lease is replaced, the
// request that takes the next one waits for its predecessor's give-back
// first (bounded by the Store's timeout). A lease that reaches its Hold is
// given back by its goroutine, which a new take does not wait for: for
// that round trip the replica holds a new lease and the old one's sealed
// rest on its way back, at most 2 x Max.
//
// A Decision admitted from a lease is the lease's Redis answer counted on
// locally (see [Leased.CheckContext]): Remaining is that answer's plus the
// rest of the lease, and At the instant the lease was spent; a refusal is
// always Redis's. Requests of one key share its lease through atomic
// operations; when it runs out one of them takes the next while the others
// wait for that round trip (up to three takes, then they go alone). A
// Leased tracks at most LeaseOptions.Keys keys. When Redis fails, a lease
// already taken is still spent (it was paid for); a take that fails gets
// the failure policy's answer for the request's own cost, and a give-back
// that fails is an error from Close (its rest stays spent). On the
// server's clock a lease's age is measured on the local monotonic clock
// from when its take was sent, never less than its age in Redis. With a
// client clock ([WithClock]) it is measured on that clock, so a replica
// whose clock runs behind the others' keeps its leases alive longer than
// the time Redis goes by: the bounds above hold on a shared time base,
// which WithClock requires anyway.
//
// BenchmarkLease measures a plain Store beside a Leased one on one hot key
// from 64 goroutines: checks/s, latency quantiles, the share admitted from
// leases and Redis CPU per admitted request. A key far from its limit
// leases and costs Redis a fraction of a round trip per request; a bucket
// near full does not lease (its leases would not last a Hold) and costs as
// the plain Store does. The command:
//
//	go test -run '^$' -bench BenchmarkLease -benchmem -benchtime=100000x -count=2 .
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
// corrupted (a value no check or settlement under the rule could have
// written, or a key of another type, such as a hash or a list, that
// something else wrote under the store's name) is denied with an error
// matching [ratelimit.ErrInvalidState], whatever the policy, by a Store, a
// Composite and a Leased alike; its peeks, refunds and settlements fail
// with that error and write nothing. Redis answered, so it is not a
// failure: it never counts against the circuit breaker nor in
// [Stats].Failures. [Store.Reset] or [Composite.Reset] (or deleting the
// key) resets it.
//
// In Redis Cluster a lost master fails only the checks of keys in its
// slots: the other masters' keys are decided as before (with
// cluster-require-full-coverage no; with the default, the live masters
// refuse every key once the cluster marks the master failed). On a
// [redis.ClusterClient] the circuit breaker is per master (the node the
// client's slot map names for the key's slot): a run of failures on the
// lost master's keys opens the circuit for those keys only, and the live
// masters' keys go on being decided by Redis, never by the failure policy.
// On a [redis.Ring], which spreads keys over shards by its own hashing,
// one breaker counts every shard's failures.
//
// Peeks, refunds and resets go through the same breaker as checks: they
// fail at once with [ErrCircuitOpen] while it is open, and their failures
// and successes count toward it (but not in [Stats], which counts checks).
//
// A check that missed its deadline may still reach the server and run
// there (a paused server runs what it finds queued when it wakes): it then
// spends, although its caller got the failure policy's answer. Likewise
// go-redis retries a command after some network errors (MaxRetries): a
// retried check that had already run is counted twice, which can only deny,
// never admit, more. Set MaxRetries to -1 to count each check once.
package redisstore
