package ratelimit

import "time"

// SubWindow is a sliding window kept as k sub-window counters, k being
// Buckets: time is cut into buckets [jG, (j+1)G) of the limiter's clock,
// G = Window/k, and a check at now counts the cost admitted in the k
// buckets that begin in (now - Window, now], that is buckets c-k+1 to c
// where c = floor(now/G) is the current one. A request of cost x is admitted
// iff that count plus x is at most Limit. With one bucket it is a
// [FixedWindow]; more buckets make the window slide in steps of G.
//
// Limit is in whole units, from 1 to 1e15; Window must be positive, less
// than [MaxTime] and a whole multiple of Buckets nanoseconds (so that every
// bucket is exactly Window/Buckets long); Buckets is from 1 to
// [MaxSubWindowBuckets]. Bucket boundaries are multiples of G from the
// clock's origin.
//
// A denied request's RetryAfter is the start of the first bucket at which
// enough of the oldest buckets have left the window for it to fit, and
// ResetAfter the start of the bucket at which the newest bucket holding
// anything leaves it. Both are whole-bucket steps: the count only changes
// at bucket boundaries.
//
// How far it can overshoot, against the exact window (n, any span of
// Window, at most Limit; [SlidingLog]): the buckets counted at any instant
// span at most Window, so the check never counts anything older than
// Window, but it forgets each bucket whole. Any span of Window - G + 1 ns
// (that is (k-1)W/k + 1 ns) lies inside k consecutive buckets, and the
// cost admitted in k consecutive buckets is at most Limit: the last
// admission in them was checked against a window holding all of them that
// were then non-empty. So the exact limit holds over every span of
// (k-1)/k of the window. A span of the whole Window touches up to k+1
// buckets, and holds at most 2 x Limit: Limit in its k newest buckets plus
// what its oldest, partly covered bucket admitted, which is at most Limit.
// That is reached for every k (Limit at the very end of a bucket, Limit
// again W - G + 1 ns later, as that bucket leaves the window), so the
// worst-case overshoot is Limit whatever k is; what k buys is that it takes
// a burst packed into the last instants of one bucket, and that the span
// over which the limit is exact grows from nothing (k = 1, a fixed window)
// to (k-1)/k of the window. More generally a span that touches m buckets
// holds at most ceil(m/k) x Limit. Traffic spread evenly over the buckets,
// at most Limit/k each, overshoots by at most Limit/k.
//
// With CountRefused the cost of a denied request is counted too, in the
// current bucket, as a penalty for sending into a full window: a client
// that keeps sending while refused keeps its own window full and is refused
// until it stops for long enough, instead of getting a share of every new
// bucket. A denied request then spends, and its Decision (Remaining,
// RetryAfter, ResetAfter) describes the key after that. A bucket's count
// stops at Limit, since a bucket at Limit refuses everything while it is in
// the window whatever more it holds (and a count above Limit, a debt left
// by [Store.Settle], takes no more). Only a check counts a refusal, and
// only a caller that counts one reports it as counted, as
// [SlidingCounter] describes: Wait, CheckWithin, a [Composite] and a plan
// of layers of a [Plans] report a refusal on the key as it stands.
//
// Per-key state is the current bucket's index and one int64 counter per
// bucket, inline in a fixed array with no pointers: 56 bytes for up to 6
// buckets, 136 bytes for up to 16 and 488 bytes for up to 60.
type SubWindow struct {
	Limit        int64
	Window       time.Duration
	Buckets      int  // k, from 1 to MaxSubWindowBuckets; Window must be a multiple of it
	CountRefused bool // count the cost of denied requests too (see above)
	Name         string
}

// MaxSubWindowBuckets is the largest Buckets a [SubWindow] takes: its
// counters are kept inline in the key's state.
const MaxSubWindowBuckets = 60

// swCounts are the state's counter arrays: one size for each range of
// Buckets, so that a rule of few buckets keeps a small state.
type swCounts interface {
	~[6]int64 | ~[16]int64 | ~[60]int64
}

// swState is a SubWindow key: the index of the latest bucket counted into,
// and n[j%k], the milli-units counted in bucket j for j in (last-k, last].
// The zero value is a fresh key.
type swState[A swCounts] struct {
	last int64
	n    A
}

// swAlgo is a compiled SubWindow rule.
type swAlgo[A swCounts] struct {
	g       int64 // bucket length in ns
	k       int64 // buckets per window
	refused bool  // CountRefused
	ruleBase
}

func (r SubWindow) compile() (ruleBase, int64, error) {
	b, w, err := compileWindow("SubWindow", r.Name, r.Limit, r.Window)
	if err != nil {
		return ruleBase{}, 0, err
	}
	switch {
	case r.Buckets < 1 || r.Buckets > MaxSubWindowBuckets:
		return ruleBase{}, 0, &RuleError{Rule: "SubWindow", Field: "Buckets", Reason: "must be from 1 to 60"}
	case w%int64(r.Buckets) != 0:
		return ruleBase{}, 0, &RuleError{Rule: "SubWindow", Field: "Window", Reason: "must be a whole multiple of Buckets nanoseconds"}
	}
	return b, w, nil
}

func (r SubWindow) bind() (binding, error) {
	b, w, err := r.compile()
	if err != nil {
		return nil, err
	}
	k := int64(r.Buckets)
	switch {
	case k <= 6:
		return bindRule[swState[[6]int64]](&swAlgo[[6]int64]{g: w / k, k: k, refused: r.CountRefused, ruleBase: b}, nil)
	case k <= 16:
		return bindRule[swState[[16]int64]](&swAlgo[[16]int64]{g: w / k, k: k, refused: r.CountRefused, ruleBase: b}, nil)
	}
	return bindRule[swState[[60]int64]](&swAlgo[[60]int64]{g: w / k, k: k, refused: r.CountRefused, ruleBase: b}, nil)
}

// at returns the current bucket's index and now, both clamped to the
// state's latest bucket: a now before it is moved to that bucket's start.
func (a *swAlgo[A]) at(s *swState[A], now int64) (c, t int64) {
	c = now / a.g
	if c < s.last {
		return s.last, s.last * a.g
	}
	return c, now
}

// count returns what bucket j holds as seen from bucket c >= s.last: zero
// for a bucket the state no longer keeps or has not reached.
func (a *swAlgo[A]) count(s *swState[A], c, j int64) int64 {
	if j < 0 || j > s.last || j <= s.last-a.k || j <= c-a.k {
		return 0
	}
	return s.n[j%a.k]
}

// sum returns the window's count at bucket c, or 2 capMilli+1 if it is
// larger (k counts of up to 2 capMilli each, in debt, could overflow).
func (a *swAlgo[A]) sum(s *swState[A], c int64) int64 {
	var t int64
	for j := max(c-a.k+1, s.last-a.k+1, 0); j <= min(c, s.last); j++ {
		if t += s.n[j%a.k]; t > 2*a.capMilli {
			return 2*a.capMilli + 1
		}
	}
	return t
}

func (a *swAlgo[A]) step(s *swState[A], now, cost int64, m stepMode) Decision {
	c, now := a.at(s, now)
	d := a.pol.decision()
	d.At = time.Duration(now)
	sum := a.sum(s, c)
	cur := a.count(s, c, c)
	add := int64(0)
	if sum+cost <= a.capMilli { // sum <= capMilli+1, cost <= capMilli: no overflow
		d.Allowed = true
		add = cost
	} else if a.refused && m.counts() {
		// Up to the limit; a count above it, in debt, takes no more.
		add = max(min(cur+cost, a.capMilli)-cur, 0)
	}
	if add > 0 && m.commits() {
		a.put(s, c, cur+add)
	}
	sum, cur = min(sum+add, 2*a.capMilli+1), cur+add
	if sum < a.capMilli {
		d.Remaining = (a.capMilli - sum) / int64(Unit)
	}
	// Walking from the newest bucket back, the first bucket j at which the
	// cost counted from j to c no longer leaves room for cost must leave the
	// window before the request fits: it leaves at bucket j+k. The newest
	// non-empty bucket leaves at its own j+k, and then the key is fresh.
	// (j+k)G <= now + Window <= MaxTime + maxSpan fits in int64.
	var acc int64
	reset := int64(-1)
	for j := c; j > c-a.k && j >= 0; j-- {
		n := cur
		if j != c {
			n = a.count(s, c, j)
		}
		if n > 0 && reset < 0 {
			reset = j
		}
		acc += n // <= capMilli before, <= 3*capMilli after (a bucket in debt holds up to 2): fits
		if !d.Allowed && acc+cost > a.capMilli {
			d.RetryAfter = time.Duration((j+a.k)*a.g - now)
			break
		}
		if d.Allowed && reset >= 0 {
			break
		}
	}
	if reset >= 0 {
		d.ResetAfter = time.Duration((reset+a.k)*a.g - now)
	}
	return d
}

// put sets bucket c's count to n, moving the state on to bucket c first.
func (a *swAlgo[A]) put(s *swState[A], c, n int64) {
	if c > s.last {
		// Buckets last+1 to c start empty; past k of them, all do.
		for j := s.last + 1; j <= min(c, s.last+a.k); j++ {
			s.n[j%a.k] = 0
		}
		s.last = c
	}
	s.n[c%a.k] = n
}

func (a *swAlgo[A]) fresh(s *swState[A], now int64) bool {
	c, _ := a.at(s, now)
	return a.sum(s, c) == 0
}

// countsRefused reports whether the rule counts refused cost (see
// storeCore.refused).
func (a *swAlgo[A]) countsRefused() bool { return a.refused }
