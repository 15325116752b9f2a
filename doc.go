// Package ratelimit is an embeddable, exact rate limiter.
//
// Six algorithms are used through one [Limiter] interface: [TokenBucket],
// [GCRA], [LeakyBucket], [FixedWindow], [SlidingLog] and [SlidingCounter].
// Time comes from an injected monotonic [Clock] ([ManualClock] for virtual
// time in tests), allowance is counted in integer milli-units ([Units]), rates
// are exact rationals ([Rate]), and every check returns a [Decision].
package ratelimit
