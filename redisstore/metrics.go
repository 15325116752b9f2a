package redisstore

import (
	"time"

	"github.com/ratekit/ratelimit"
)

// The limiters' counters as metrics collectors read them: ratelimitprom's
// and ratelimitotel's AddBackend take any of these.

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

func backendStats(policy string, limit int64, window time.Duration, st Stats) ratelimit.BackendStats {
	return ratelimit.BackendStats{
		Policy: policy, Limit: limit, Window: window,
		Failures: st.Failures, CircuitRefusals: st.CircuitRefusals, InvalidStates: st.InvalidStates,
		Mismatches: st.Mismatches, LocalDenials: st.LocalDenials,
	}
}
