package ratelimit

import "time"

// BackendStats are the counters of one limit whose keys live outside the
// process (in redisstore: a Store, a Lockout, an InFlight, a Leased, each
// layer of a Composite, each layer of each plan of a Plans), as metrics
// collectors read them: the limit's rule, where it stands among its
// limiter's layers, and the calls its backend did not decide. Its keys are
// the backend's, and not counted here.
//
// The counters count a limiter's calls, not its layers: a limiter of
// several entries reports them on the first entry of what keeps them (a
// Composite's first layer; a plan's first layer), and zero on the others,
// so that a sum over a limiter's entries counts each call once.
type BackendStats struct {
	// Plan is the name of the plan whose rule this is, for a limiter of
	// plans (a rule set); "" otherwise.
	Plan string
	// Layer is the index of the rule among its limiter's layers (or its
	// plan's), shadow layers included; 0 for a limiter of one rule.
	Layer int

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
