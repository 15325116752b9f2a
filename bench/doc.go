// Package bench measures github.com/ratekit/ratelimit side by side with
// other Go rate limiters, on the same machine in the same run, so that the
// figures that matter are ratios rather than absolute times.
//
// It is a module of its own, so that the library's go.mod never lists the
// peers. Its go.mod replaces the library with the working tree above it:
// the benchmarks measure the code next to them, not a released version.
//
// Run everything, and regenerate docs/performance.md and
// docs/performance.svg, with
//
//	bench/run.sh
//
// # Subjects
//
// Every subject is driven through the same kind of closure (a func that
// reports whether the request was admitted), so call overhead is the same
// for all. This library is measured with [ratelimit.SystemClock], as every
// peer reads the system clock too.
//
//   - ratelimit.* : six of this library's seven rules (all but SubWindow);
//     GCRA-frac, TokenBucket-frac
//     and LeakyBucket-frac are those rules at a rate (7 per 3 µs, or 7 per
//     3 h) that is not a whole number of nanoseconds per milli-unit (the
//     single-key GCRA and token bucket then keep a fraction of a
//     nanosecond in their lock-free word).
//   - x-time-rate: golang.org/x/time/rate; keyed, a map of limiters behind
//     one sync.Mutex.
//   - throttled: github.com/throttled/throttled/v2, GCRA on memstore
//     (unbounded map); throttled-lru is the same with memstore's LRU bound.
//   - go-limiter: github.com/sethvargo/go-limiter, memorystore.
//   - ulule: github.com/ulule/limiter/v3, memory store.
//   - juju: github.com/juju/ratelimit; keyed, a map of buckets behind one
//     sync.Mutex.
//   - uber: go.uber.org/ratelimit (single key only: Take blocks rather than
//     denies, so it appears only where requests are admitted).
//   - mennanov: github.com/mennanov/limiters, token bucket on its in-memory
//     backend; keyed, in its Registry.
//   - floor-clock and floor-map: one monotonic clock read, and one lookup in
//     a bare map[string]int64, the floors of single-key and keyed checks.
//     floor-map-clock is the map lookup plus one clock read: in a tight loop
//     the CPU overlaps the cache misses of consecutive bare lookups, and a
//     clock read (an ordered TSC read) stops that, as it does in every
//     limiter here.
//
// HTTP middlewares, whole, on the same handler ([Admitted]) and keyed by the
// client's address ([HTTPSubjects]):
//
//   - ratelimit.httplimit: this library's httplimit.Middleware on a GCRA
//     Store, with its default key (ClientIP).
//   - httprate: github.com/go-chi/httprate, its in-memory sliding window
//     counter, keyed as its KeyByIP does.
//   - go-limiter: github.com/sethvargo/go-limiter's httplimit on its
//     memorystore, keyed by its IPKeyFunc.
//
// BenchmarkPace puts this library's single-key GCRA, TokenBucket and
// LeakyBucket at paces of every shape (whole nanoseconds per milli-unit,
// a small denominator such as 7 per 3 µs, and denominators too wide for
// the lock-free word such as 1,000,003 per hour) beside uber's Take, from
// one goroutine and from every core.
//
// # Configurations
//
// "Allowed" scenarios use limits no benchmark can exhaust (1e6 per second
// with a burst of 1e12 where the peer takes a rate and a burst), "denied"
// ones 1 per hour with a burst of 1, after spending that one. Every
// benchmark reports admitted/op, the fraction of checks admitted, so a
// configuration that does not take the path it claims shows at once.
// Where a peer needs a configuration other than the common one to take the
// path, [SingleSubjects] says why. throttled's GCRA returns an error rather
// than a decision when its compare-and-swap on the memstore fails 10 times
// in a row, which happens now and then with every core on one key; such a
// check counts as not admitted.
package bench
