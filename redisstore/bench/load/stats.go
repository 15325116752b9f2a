package load

import (
	"math/big"
	"slices"
	"time"
)

// Summary is what an attack's answers show as a whole.
type Summary struct {
	Requests int
	Asked    int     // the rate asked for, per second
	Sent     float64 // requests sent per second: all of them over the span of their send times
	Answered float64 // answers per second: all of them over the span from the first send to the last answer
	Answers
	P50, P99  time.Duration
	P999, Max time.Duration
}

// Answers counts requests by how they were answered.
type Answers struct {
	OK        int // 200
	Refused   int // 429
	Server5xx int // 500-599
	Other     int // any other status
	Errors    int // no HTTP answer (timeouts, refused connections)
	By        map[string]int
}

// count adds rec to a.
func (a *Answers) count(rec Record) {
	switch c := rec.Code; {
	case c == 0:
		a.Errors++
	case c == 200:
		a.OK++
	case c == 429:
		a.Refused++
	case c >= 500 && c <= 599:
		a.Server5xx++
	default:
		a.Other++
	}
	if rec.By != "" {
		a.By[rec.By]++
	}
}

// Summarize sums up r.
func Summarize(r *Result) Summary {
	s := Summary{Requests: len(r.Records), Asked: r.Plan.Rate, Answers: Answers{By: map[string]int{}}}
	if len(r.Records) == 0 {
		return s
	}
	lat := make([]time.Duration, 0, len(r.Records))
	first, lastSent, lastEnd := r.Records[0].Sent, r.Records[0].Sent, r.Records[0].End()
	for _, rec := range r.Records {
		first = min(first, rec.Sent)
		lastSent = max(lastSent, rec.Sent)
		lastEnd = max(lastEnd, rec.End())
		lat = append(lat, rec.Latency)
		s.count(rec)
	}
	if lastSent > first {
		s.Sent = float64(len(r.Records)-1) / (lastSent - first).Seconds()
	}
	if lastEnd > first {
		s.Answered = float64(len(r.Records)) / (lastEnd - first).Seconds()
	}
	slices.Sort(lat)
	s.P50, s.P99, s.P999 = Quantile(lat, 500), Quantile(lat, 990), Quantile(lat, 999)
	s.Max = lat[len(lat)-1]
	return s
}

// Quantile returns the q-th thousandth of sorted by nearest rank: the
// smallest value that at least q/1000 of them do not exceed.
func Quantile(sorted []time.Duration, q int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (len(sorted)*q + 999) / 1000 // ceil(n q / 1000)
	return sorted[max(rank, 1)-1]
}

// Rule is a token bucket's numbers: at most Burst + Count x t / Per
// admitted in any span of length t.
type Rule struct {
	Burst int64
	Count int64
	Per   time.Duration
}

// Bound returns the most the rule admits in a span of length t, exactly:
// Burst + floor(Count x t / Per).
func (r Rule) Bound(t time.Duration) int64 {
	q := new(big.Int).Mul(big.NewInt(r.Count), big.NewInt(int64(t)))
	q.Quo(q, big.NewInt(int64(r.Per)))
	return r.Burst + q.Int64()
}

// KeyBounds is how the admissions of each key compare with its rule's
// exact bound.
type KeyBounds struct {
	Keys        int     // keys with at least one admission
	Over        int     // keys admitted more than their bound
	MaxOver     int64   // the largest excess (0 if none)
	MaxAdmitted int64   // the most admitted for one key
	MaxBound    int64   // that key's bound
	Ratio       float64 // the largest admitted/bound over keys
	Refused     int     // keys refused at least once: the bound was reached
	MinSlack    int64   // for those keys, the least bound - admitted (how close the limiter came)
}

// Bounds compares each key's admissions (200s) with rule's bound over the
// span from the send of its first admitted request to the answer of its
// last: every admission was decided within that span, by a server whose
// clock runs with this one's.
//
// If counts is not nil, only the admissions it returns true for count
// (such as those Redis decided, leaving out the failure policy's).
func Bounds(r *Result, rule Rule, counts func(Record) bool) KeyBounds {
	type span struct {
		n          int64
		first, end time.Duration
		refused    bool
	}
	keys := map[int32]*span{}
	for _, rec := range r.Records {
		sp := keys[rec.Key]
		if sp == nil {
			sp = &span{first: -1}
			keys[rec.Key] = sp
		}
		switch rec.Code {
		case 200:
			if counts != nil && !counts(rec) {
				continue
			}
			if sp.n == 0 || rec.Sent < sp.first {
				sp.first = rec.Sent
			}
			sp.end = max(sp.end, rec.End())
			sp.n++
		case 429:
			sp.refused = true
		}
	}
	var b KeyBounds
	b.MinSlack = -1
	for _, sp := range keys {
		if sp.n == 0 {
			continue
		}
		b.Keys++
		bound := rule.Bound(sp.end - sp.first)
		if sp.n > bound {
			b.Over++
			b.MaxOver = max(b.MaxOver, sp.n-bound)
		}
		if ratio := float64(sp.n) / float64(bound); ratio > b.Ratio || b.MaxAdmitted == 0 {
			b.Ratio, b.MaxAdmitted, b.MaxBound = ratio, sp.n, bound
		}
		if sp.refused {
			b.Refused++
			if slack := bound - sp.n; b.MinSlack < 0 || slack < b.MinSlack {
				b.MinSlack = slack
			}
		}
	}
	return b
}

// Second is one second of an attack, by send time.
type Second struct {
	Answers
	P99, Max time.Duration
}

// Timeline splits r by the second the requests were sent in.
func Timeline(r *Result) []Second {
	var secs []Second
	var lats [][]time.Duration
	for _, rec := range r.Records {
		i := int(rec.Sent / time.Second)
		for len(secs) <= i {
			secs = append(secs, Second{Answers: Answers{By: map[string]int{}}})
			lats = append(lats, nil)
		}
		s := &secs[i]
		s.count(rec)
		lats[i] = append(lats[i], rec.Latency)
	}
	for i := range secs {
		slices.Sort(lats[i])
		secs[i].P99 = Quantile(lats[i], 990)
		if n := len(lats[i]); n > 0 {
			secs[i].Max = lats[i][n-1]
		}
	}
	return secs
}

// Recovery is how the replicas came back after Redis did.
type Recovery struct {
	// First is, per replica, from Redis answering again to the first
	// admission that Redis decided, of a request sent after the kill
	// (negative: before the restarted server answered the harness's PING;
	// -1 when there was none).
	First []time.Duration
	// Late counts, per replica, the failure policy's answers to requests
	// sent more than a second after Redis answered again: checks that
	// missed their deadline on a live Redis, not the outage.
	Late []int
	// DuringOutage counts answers marked "redis" to requests sent while
	// Redis was down: refusals the deny cache repeated.
	DuringOutage int
}

// Recover measures, from r, how the replicas came back: Redis was killed
// at killed and answered again at back, both since the attack began.
func Recover(r *Result, replicas int, killed, back time.Duration) Recovery {
	rc := Recovery{First: make([]time.Duration, replicas), Late: make([]int, replicas)}
	found := make([]bool, replicas)
	for _, rec := range r.Records {
		if rec.Replica < 0 || int(rec.Replica) >= replicas || rec.Sent < killed {
			continue
		}
		i := rec.Replica
		switch {
		case rec.By == "redis" && rec.Code == 200:
			if d := rec.End() - back; !found[i] || d < rc.First[i] {
				rc.First[i], found[i] = d, true
			}
		case rec.By != "" && rec.By != "redis" && rec.Sent > back+time.Second:
			rc.Late[i]++
		}
		if rec.By == "redis" && rec.End() < back {
			rc.DuringOutage++
		}
	}
	for i := range found {
		if !found[i] {
			rc.First[i] = -1
		}
	}
	return rc
}

// Slope returns the least-squares slope of ys over xs; ok is false for
// fewer than two distinct xs.
func Slope(xs, ys []float64) (slope float64, ok bool) {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0, false
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}
