package ratelimit

// TokenBucket is the classic token bucket: it holds up to Burst units,
// refills continuously at Rate, and admits a request of cost c iff it holds
// at least c, which the request then takes. A fresh bucket is full.
//
// Burst is in whole units, from 1 to 1e15; Burst/Rate, the time to refill
// an empty bucket, must be less than [MaxTime].
//
// Its decisions equal [GCRA]'s for every trace, weighted costs included,
// and it is kept as GCRA's state: one theoretical arrival time, the instant
// the bucket will be full again if nothing more is taken (what is missing,
// Burst - tokens, is that instant less now, times Rate). So it costs what a
// GCRA costs, per key in a [Store] and per Check, and its single-key
// limiter is lock-free wherever GCRA's is (and elsewhere holds its mutex
// as briefly). The tests check it against a
// reference token bucket written from the definition above.
type TokenBucket struct {
	Rate  Rate
	Burst int64
	Name  string // optional: reported as Decision.Policy
}

func (r TokenBucket) compile() (*gcraAlgo, error) {
	return compileGCRA("TokenBucket", r.Name, r.Rate, r.Burst)
}

func (r TokenBucket) bind() (binding, error) { return bindGCRA(r.compile()) }
