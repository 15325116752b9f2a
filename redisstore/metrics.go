package redisstore

import (
	"maps"
	"slices"
	"time"

	"github.com/ratekit/ratelimit"
)

// The limiters' counters as metrics collectors read them: ratelimitprom's
// and ratelimitotel's AddBackend take any of these. An entry's Plan and
// Layer become the collectors' plan and layer labels, its Policy their
// policy label.

// BackendStats returns the store's rule and counters, one entry.
func (s *Store) BackendStats() []ratelimit.BackendStats {
	return []ratelimit.BackendStats{backendStats(s.p.Policy, s.p.Limit, s.p.Window, s.Stats())}
}

// BackendStats returns the lockout's rule (Limit is Failures, Window is
// Within) and counters, one entry.
func (l *Lockout) BackendStats() []ratelimit.BackendStats {
	return []ratelimit.BackendStats{backendStats(l.p.Policy, l.p.Limit, time.Duration(l.p.WindowNanos), l.stats())}
}

// BackendStats returns the in-flight limit's Limit, Name and counters,
// one entry (Window 0: it is not a quota over time).
func (f *InFlight) BackendStats() []ratelimit.BackendStats {
	return []ratelimit.BackendStats{backendStats(f.pol.Policy, f.limit, 0, f.stats())}
}

// BackendStats returns, one entry per layer in layer order (shadow layers
// included, Layer their index), each layer's rule; the composite's
// counters, which count its calls and not its layers, are on the first
// entry, and the others' are zero.
func (c *Composite) BackendStats() []ratelimit.BackendStats {
	return c.layerStats("", "", c.Stats())
}

// layerStats returns c's layers' entries under plan, naming unnamed rules
// policy, with st on the first.
func (c *Composite) layerStats(plan, policy string, st Stats) []ratelimit.BackendStats {
	out := make([]ratelimit.BackendStats, len(c.layers))
	for i, l := range c.layers {
		out[i] = backendStats(orName(l.p.Policy, policy), l.p.Limit, l.p.Window, st)
		out[i].Plan, out[i].Layer = plan, i
		st = Stats{}
	}
	return out
}

// BackendStats returns its Store's rule and counters, one entry: every
// call that reaches Redis, a lease's take and give-back included, is the
// Store's. The lease's own counters ([LeaseStats]) are not among them:
// what a lease admits locally Redis decided when the lease was taken.
func (l *Leased) BackendStats() []ratelimit.BackendStats { return l.s.BackendStats() }

// BackendStats returns, for the rule set in force when it is called (so
// that an Update shows at the next scrape), one entry per plan and per
// layer of the plan, plans in the order of their names and each plan's
// layers in order (shadow layers included): Plan is the plan's name,
// Layer the layer's index (0 for a plan of one rule), and Policy the
// rule's Name, or the plan's name for an unnamed rule, as in a Decision.
// The collectors label an entry plan, layer and policy by these.
//
// Counters count calls, not layers. A plan's own (refusals of its deny
// cache, its corrupted states and mismatches) are on its first layer's
// entry; those of the rule set as a whole (calls Redis did not decide,
// refusals of the open circuit, corrupted records) are on the default
// plan's first layer's entry; every other entry's are zero. Their sum is
// [Plans.Stats] without Moves and Conflicts. A plan's own counters start
// again from zero when an Update replaces the rule set.
func (p *Plans) BackendStats() []ratelimit.BackendStats {
	g := p.gen.Load()
	var out []ratelimit.BackendStats
	for _, name := range slices.Sorted(maps.Keys(g.plans)) {
		rp := g.plans[name]
		var st Stats
		if rp.single != nil {
			st = rp.single.Stats()
		} else {
			st = rp.comp.Stats()
		}
		if rp == g.def {
			st = addStats(st, p.r.stats())
		}
		if rp.single != nil {
			e := backendStats(orName(rp.single.p.Policy, name), rp.single.p.Limit, rp.single.p.Window, st)
			e.Plan = name
			out = append(out, e)
			continue
		}
		out = append(out, rp.comp.layerStats(name, name, st)...)
	}
	return out
}

// orName is policy, or name for an unnamed rule.
func orName(policy, name string) string {
	if policy == "" {
		return name
	}
	return policy
}

// addStats returns the sum of a and b.
func addStats(a, b Stats) Stats {
	return Stats{
		Failures: a.Failures + b.Failures, CircuitRefusals: a.CircuitRefusals + b.CircuitRefusals,
		InvalidStates: a.InvalidStates + b.InvalidStates, Mismatches: a.Mismatches + b.Mismatches,
		LocalDenials: a.LocalDenials + b.LocalDenials,
	}
}

func backendStats(policy string, limit int64, window time.Duration, st Stats) ratelimit.BackendStats {
	return ratelimit.BackendStats{
		Policy: policy, Limit: limit, Window: window,
		Failures: st.Failures, CircuitRefusals: st.CircuitRefusals, InvalidStates: st.InvalidStates,
		Mismatches: st.Mismatches, LocalDenials: st.LocalDenials,
	}
}
