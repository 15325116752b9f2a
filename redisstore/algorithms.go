package redisstore

import (
	"strconv"
	"strings"
	"time"

	"github.com/ratekit/ratelimit"
)

// The one table of the algorithms the store runs in Redis: for each, the
// step of the check's script it runs, the arguments that step takes, and
// whether and how it leases. Every path (Store, Composite, InFlight's rate,
// refunds and settlements, Leased) reads it, and the script's Lua reads
// the codes and argument positions from it (see expandLua): adding an
// algorithm is an entry here and its step in the Lua.
var algorithms = []algorithm{
	{name: "token_bucket", step: &meterStep, lease: &leasing{meter: true}},
	{name: "gcra", step: &meterStep, lease: &leasing{meter: true}},
	// A leaky bucket's state, and so its step, are the token bucket's. Its
	// Delay is the Decision's, which the Machine computes in Go; a check
	// bounded on it (CheckWithin, a Wait's attempt) sends the step the
	// bound (argMaxDelay), so that the script itself refuses an admission
	// that would wait too long. It cannot lease: each admission has its
	// own Delay.
	{name: "leaky_bucket", step: &meterStep, delays: true},
	{name: "fixed_window", step: &fixedStep, lease: &leasing{span: windowSpan, spans: oneSpan}},
	// It cannot lease: an admission counts from the instant it is
	// recorded, so one recorded early would leave the window early.
	{name: "sliding_log", step: &logStep},
	{name: "sliding_counter", step: &counterStep, lease: &leasing{span: windowSpan, spans: twoSpans}},
	{name: "sub_window", step: &subStep, lease: &leasing{span: bucketSpan, spans: bucketCount}},
}

// algorithm is an entry of the table.
type algorithm struct {
	name  string      // the rule's [ratelimit.Params].Algorithm
	step  *scriptStep // the step of the check's script it runs
	lease *leasing    // how it leases (see NewLeased); nil: it cannot
	// delays says its admissions may carry a Delay (see
	// Composite.CheckLayers): a check bounded on it sends its step the
	// step's bound arguments (see appendBound).
	delays bool
}

// scriptStep is a step of the check's script (step.lua, fast.lua, and
// pairs.lua or limbs.lua), which several algorithms may share.
type scriptStep struct {
	// code is what ARGV[ARG_ALG] holds for it; its Lua name is
	// ALG_<lua>, which the script's sources read, settle.lua's (its
	// refunds and settlements) included.
	code, lua string
	// slots are the arguments it takes after the four every step takes,
	// in order from argRule.
	slots []*slot
	// exact is the Lua function of its exact path, defined in pairs.lua,
	// that the script's exact function calls for it; "" for the limbs
	// (limbs.lua), which the exact function runs last.
	exact string
	// bound are the arguments that a check bounded on its Delay sends
	// after slots (see appendBound), and a check without a bound does not
	// send (the step reads them as nil); none for a step whose algorithms
	// never delay.
	bound []*slot
}

// slot is one argument of the check's step: its index in the arguments
// (ARGV[at+1] in Lua, where the script's sources name it ARG_<name>), and
// for a rule's own, its value from the rule's parameters. A slot has one
// index in every step that takes it.
type slot struct {
	at   int
	name string
	rule func(p ratelimit.Params) string // nil: the check sets it
}

// The arguments every step takes.
var (
	argAlg    = &slot{at: 0, name: "ALG"}    // the step's code
	argNow    = &slot{at: 1, name: "NOW"}    // now in ns since the Unix epoch, or '' for the server's TIME
	argCost   = &slot{at: 2, name: "COST"}   // the cost in milli-units
	argMargin = &slot{at: 3, name: "MARGIN"} // the expiry margin in ms
)

// stepHead are the arguments every step takes, in order.
var stepHead = []*slot{argAlg, argNow, argCost, argMargin}

// argRule is the index of a rule's first argument.
const argRule = 4

// A bucket rule's arguments.
var (
	argPace     = &slot{at: 4, name: "PACE", rule: func(p ratelimit.Params) string { return u(p.RateUnits) }}   // n, the pace's milli-units
	argTau      = &slot{at: 5, name: "TAU", rule: func(p ratelimit.Params) string { return u(p.TauNanos) }}     // the capacity's span: ns
	argTauFrac  = &slot{at: 6, name: "TAU_FRAC", rule: func(p ratelimit.Params) string { return u(p.TauFrac) }} // and frac/n
	argCostSpan = &slot{at: 7, name: "COST_SPAN"}                                                               // the cost's span: ns
	argCostFrac = &slot{at: 8, name: "COST_FRAC"}                                                               // and frac/n
)

// A bucket's check bounded on its Delay (a leaky bucket's CheckWithin, and
// each attempt of its Wait with a deadline) sends these two more: the
// least queue ahead of the request, ns and frac/n, at which its Delay would
// be over the bound (see appendBound). The step then refuses an admission
// that finds at least that much queued ahead, and writes nothing for a
// request it does not admit.
var (
	argMaxDelay     = &slot{at: 9, name: "MAX_DELAY"}
	argMaxDelayFrac = &slot{at: 10, name: "MAX_DELAY_FRAC"}
)

// A window rule's arguments.
var (
	argWindow   = &slot{at: 4, name: "WINDOW", rule: func(p ratelimit.Params) string { return strconv.FormatInt(p.WindowNanos, 10) }}
	argCapacity = &slot{at: 5, name: "CAPACITY", rule: func(p ratelimit.Params) string { return strconv.FormatInt(int64(p.Capacity), 10) }}
	// argRefused is "1" for a rule with CountRefused (a refusal spends),
	// "0" for one without, and refusedLook for a check whose refusal must
	// spend nothing even so.
	argRefused = &slot{at: 6, name: "REFUSED", rule: func(p ratelimit.Params) string {
		if p.CountRefused {
			return "1"
		}
		return "0"
	}}
	argBuckets = &slot{at: 7, name: "BUCKETS", rule: func(p ratelimit.Params) string { return strconv.FormatInt(p.Buckets, 10) }}
)

// refusedLook is argRefused for a check of a rule with CountRefused whose
// refusal spends nothing (a Composite's layer, a Wait's check): the step
// reads the rule's states but counts no refused cost (see stepArgs.look).
const refusedLook = "2"

// The steps.
var (
	meterStep = scriptStep{code: "m", lua: "METER", exact: "pmeter", slots: []*slot{argPace, argTau, argTauFrac, argCostSpan, argCostFrac},
		bound: []*slot{argMaxDelay, argMaxDelayFrac}}
	fixedStep   = scriptStep{code: "f", lua: "FIXED", slots: []*slot{argWindow, argCapacity}}
	logStep     = scriptStep{code: "l", lua: "LOG", slots: []*slot{argWindow, argCapacity}}
	counterStep = scriptStep{code: "c", lua: "COUNTER", slots: []*slot{argWindow, argCapacity, argRefused}}
	subStep     = scriptStep{code: "s", lua: "SUB", slots: []*slot{argWindow, argCapacity, argRefused, argBuckets}}
)

// leasing is how an algorithm leases (see NewLeased and Leased.expired).
type leasing struct {
	// meter says a lease's allowance decays, as a bucket's refills (see
	// Leased.covers); a refund gives nothing back once the bucket has
	// refilled it.
	meter bool
	// span is the window or bucket a lease may not outlive, ns; spans how
	// many of them on from an admission's a refund of it gives nothing
	// back.
	span, spans func(p ratelimit.Params) int64
}

func windowSpan(p ratelimit.Params) int64  { return p.WindowNanos }
func bucketSpan(p ratelimit.Params) int64  { return p.WindowNanos / p.Buckets }
func oneSpan(ratelimit.Params) int64       { return 1 }
func twoSpans(ratelimit.Params) int64      { return 2 }
func bucketCount(p ratelimit.Params) int64 { return p.Buckets }

// algorithmFor returns the table's entry for a rule's algorithm.
func algorithmFor(name string) (*algorithm, bool) {
	for i := range algorithms {
		if algorithms[i].name == name {
			return &algorithms[i], true
		}
	}
	return nil, false
}

// takes reports whether the step takes the argument sl.
func (st *scriptStep) takes(sl *slot) bool {
	for _, x := range st.slots {
		if x == sl {
			return true
		}
	}
	return false
}

// stepArgs are a rule's arguments to the check's step, with the slots a
// check sets (argNow, argCost and the cost's span) left empty: see
// appendCheck.
type stepArgs []any

// newStepArgs returns the arguments of rule p's step st with the expiry
// margin marginMs.
func newStepArgs(st *scriptStep, p ratelimit.Params, marginMs int64) stepArgs {
	a := make(stepArgs, argRule+len(st.slots))
	a[argAlg.at], a[argNow.at], a[argCost.at] = st.code, "", ""
	a[argMargin.at] = strconv.FormatInt(marginMs, 10)
	for _, sl := range st.slots {
		a[sl.at] = ""
		if sl.rule != nil {
			a[sl.at] = sl.rule(p)
		}
	}
	return a
}

// look returns a rule's arguments for a check whose refusal spends
// nothing even under CountRefused: a's, with argRefused refusedLook for a
// rule with the option.
func (a stepArgs) look(p ratelimit.Params) stepArgs {
	if !p.CountRefused {
		return a
	}
	b := append(stepArgs(nil), a...)
	b[argRefused.at] = refusedLook
	return b
}

// appendCheck appends to dst the arguments of one check of cost at now
// (a Unix time in ns, or "" for the server's TIME) by step st of the
// rule m runs.
func (a stepArgs) appendCheck(dst []any, st *scriptStep, m *ratelimit.Machine, now string, cost ratelimit.Units) []any {
	i := len(dst)
	dst = append(dst, a...)
	args := dst[i:]
	args[argNow.at] = now
	args[argCost.at] = strconv.FormatInt(int64(cost), 10)
	if st.takes(argCostSpan) {
		ns, frac := m.Span(cost)
		args[argCostSpan.at], args[argCostFrac.at] = u(ns), u(frac)
	}
	return dst
}

// appendBound appends to dst, a check's arguments for the meter step of
// rule p, a leaky bucket's, the arguments that bound its Delay (the step's
// bound, see argMaxDelay) for a request that may wait at most budget. An
// admission goes on once the queue ahead of it beyond the rule's Delay
// span has drained, so its Delay is over budget exactly when the queue
// ahead is at least budget plus that span plus 1/n. Every admission finds
// less than the capacity's span queued ahead (its own cost must fit too),
// so a longer bound is sent as that span, which keeps it in the fast
// path's range whenever the rule is; a negative budget, which no request
// fits, is sent as 0.
func appendBound(dst []any, p ratelimit.Params, budget time.Duration) []any {
	ns, frac := p.TauNanos, p.TauFrac
	switch {
	case budget < 0:
		ns, frac = 0, 0
	case uint64(budget) <= p.TauNanos:
		// Below 2^63 each, so the sum cannot overflow. A longer budget
		// is at least a whole ns beyond the capacity's span.
		bn, bf := p.DelayNanos+uint64(budget), p.DelayFrac+1
		if bf == p.RateUnits {
			bn, bf = bn+1, 0
		}
		if bn < ns || (bn == ns && bf < frac) {
			ns, frac = bn, bf
		}
	}
	return append(dst, u(ns), u(frac)) // argMaxDelay, argMaxDelayFrac
}

// packedText is the arguments of a check of cost (see appendCheck) as the
// step's library takes them (packed.lua): the text of every argument but
// now, in order, each after a space but the first. A check sends it and
// now (or the text alone for the server's TIME) rather than one argument
// per slot: Redis spends on each argument.
func (a stepArgs) packedText(st *scriptStep, m *ratelimit.Machine, cost ratelimit.Units) string {
	args := a.appendCheck(make([]any, 0, len(a)), st, m, "", cost)
	b := make([]byte, 0, 96)
	for i, v := range args {
		if i == argNow.at {
			continue
		}
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = append(b, v.(string)...)
	}
	return string(b)
}

// packedArgs says args are a check's packed arguments: its text, and
// now unless it is the server's TIME (see packedText).
func packedArgs(args []any) bool { return len(args) <= 2 }

// unpackArgs returns packed arguments (see packedText) as the script
// takes them, one per slot.
func unpackArgs(args []any) []any {
	var text string
	var now any = ""
	if len(args) > 0 {
		text, _ = args[0].(string)
	}
	if len(args) > 1 {
		now = args[1]
	}
	fields := strings.Split(text, " ")
	out := make([]any, 0, len(fields)+1)
	for i, f := range fields {
		if i == argNow.at {
			out = append(out, now)
		}
		out = append(out, f)
	}
	return out
}
