package ratelimit

import "time"

// BackendStats are the counters of one limit whose keys live outside the
// process (in redisstore: a Store, a Lockout, an InFlight), as metrics
// collectors read them: the limit's rule, and the calls its backend did
// not decide. Its keys are the backend's, and not counted here.
type BackendStats struct {
	Policy string        // the rule's Name (Decision.Policy)
	Limit  int64         // the rule's capacity in whole units (Decision.Limit)
	Window time.Duration // the span the limit is a quota for (Decision.Window); 0 if none

	// Failures counts calls the backend did not decide (errors, timeouts,
	// refusals of an open circuit), each answered by the failure policy.
	Failures uint64
	// CircuitRefusals counts the calls among Failures that did not try the
	// backend because its circuit was open.
	CircuitRefusals uint64
	// InvalidStates counts calls refused because a key's stored state was
	// corrupted.
	InvalidStates uint64
	// Mismatches counts replies that disagreed with the rule's [Machine];
	// it should stay zero.
	Mismatches uint64
	// LocalDenials counts refusals answered without a round trip (a
	// deny cache).
	LocalDenials uint64
}
