package ratelimit

// TokenBucket is the classic token bucket: it holds up to Burst units,
// refills continuously at Rate, and admits a request of cost c iff it holds
// at least c, which the request then takes. A fresh bucket is full.
//
// Burst is in whole units, from 1 to 1e15; Burst/Rate, the time to refill
// an empty bucket, must be less than [MaxTime]. Its decisions equal [GCRA]'s for every trace.
type TokenBucket struct {
	Rate  Rate
	Burst int64
	Name  string // optional: reported as Decision.Policy
}

// tbState keeps what the bucket is missing rather than what it holds, so
// that the zero value is a full (fresh) bucket. Missing is miss + frac/p
// milli-units as of time last.
type tbState struct {
	last int64
	miss int64
	frac uint64
}

// tbAlgo is a compiled TokenBucket rule.
type tbAlgo struct {
	pace
	ruleBase
}

func (r TokenBucket) compile() (*tbAlgo, error) {
	// The meter validates exactly what the bucket needs: the rate, the
	// burst, and that refilling the burst fits in MaxTime.
	m, err := newMeter("TokenBucket", r.Name, "Rate", "Burst", r.Rate, r.Burst)
	if err != nil {
		return nil, err
	}
	return &tbAlgo{pace: m.pace, ruleBase: m.ruleBase}, nil
}

func (r TokenBucket) bind() (binding, error) { return bindRule[tbState](r.compile()) }

// refill returns what the bucket misses at now: miss + frac/p milli-units.
func (a *tbAlgo) refill(s *tbState, now int64) (int64, uint64) {
	if now <= s.last || (s.miss == 0 && s.frac == 0) {
		return s.miss, s.frac
	}
	// earned = (now-last)*n/p milli-units, as q + r/p.
	q, r, ok := a.earned(uint64(now - s.last))
	if !ok || q > uint64(s.miss) {
		return 0, 0
	}
	miss, frac := s.miss-int64(q), s.frac
	if frac < r {
		if miss == 0 {
			return 0, 0
		}
		miss, frac = miss-1, frac+a.p
	}
	return miss, frac - r
}

func (a *tbAlgo) step(s *tbState, now, cost int64, commit bool) Decision {
	if now < s.last {
		now = s.last // never refill from, or record, an earlier time
	}
	miss, frac := a.refill(s, now)
	d := a.pol.decision()
	// Holding capMilli - miss - frac/p >= cost, with cost whole.
	owed := miss
	if frac != 0 {
		owed++
	}
	if owed+cost <= a.capMilli {
		d.Allowed = true
		miss += cost
		if commit {
			*s = tbState{last: now, miss: miss, frac: frac}
		}
		owed += cost
	} else {
		// Wait until the missing amount falls to capMilli - cost.
		d.RetryAfter = a.timeCeil(uint64(miss+cost-a.capMilli), frac) // >= 0 here
	}
	d.ResetAfter = a.timeCeil(uint64(miss), frac)
	d.Remaining = (a.capMilli - owed) / int64(Unit)
	return d
}

func (a *tbAlgo) fresh(s *tbState, now int64) bool {
	miss, frac := a.refill(s, now)
	return miss == 0 && frac == 0
}
