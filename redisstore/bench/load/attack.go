package load

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// DecidedBy is the response field in which redisstore/examples/server, run
// with -decided-by, says which path decided a request.
const DecidedBy = "X-Ratelimit-Decided-By"

// Plan is one attack: Rate requests a second for Duration, spread round
// robin over URLs, each GET Path with its key in X-API-Key.
//
// Keys are numbered 0 to Keys-1. The first Hot of them are hot: HotPercent
// of the requests go to them in turn, the rest to the other keys in turn,
// so that every key is used at a steady rate and each cold key within the
// first (Keys-Hot)/(Rate x (100-HotPercent)/100) seconds.
type Plan struct {
	Name       string // tells the attack's keys apart from other attacks' (a prefix)
	URLs       []string
	Path       string
	Rate       int
	Duration   time.Duration
	Keys       int
	Hot        int
	HotPercent int
	Timeout    time.Duration // per request; 10 s if zero
	// OnStart, if not nil, is called with the instant the attack begins,
	// from which Record.Sent counts, before the first request.
	OnStart func(began time.Time)
}

// Record is one request's outcome.
type Record struct {
	Sent    time.Duration // since the attack began
	Latency time.Duration
	Key     int32
	Replica int16
	Code    uint16 // 0: no HTTP answer (Err)
	By      string // DecidedBy's value, if the server sent it
	Err     string
}

// End is when the answer arrived, since the attack began.
func (r Record) End() time.Duration { return r.Sent + r.Latency }

// Result is an attack's records, in the order the answers arrived.
type Result struct {
	Plan    Plan
	Began   time.Time
	Records []Record
}

// key returns the key of the i-th request (counted from 0).
func (p Plan) key(i uint64) int {
	cold := p.Keys - p.Hot
	if p.Hot > 0 && p.HotPercent > 0 {
		// Bresenham: request i is hot when the running count of hot
		// requests, i x HotPercent / 100, steps up at it.
		hotBefore := i * uint64(p.HotPercent) / 100
		if (i+1)*uint64(p.HotPercent)/100 != hotBefore {
			return int(hotBefore % uint64(p.Hot))
		}
		coldBefore := i - hotBefore
		return p.Hot + int(coldBefore%uint64(max(cold, 1)))
	}
	return p.Hot + int(i%uint64(max(cold, 1)))
}

// KeyName is the X-API-Key of key k.
func (p Plan) KeyName(k int) string { return p.Name + "-" + strconv.Itoa(k) }

// Attack runs p until its duration ends or ctx does, and returns every
// request's record.
func Attack(ctx context.Context, p Plan) (*Result, error) {
	if len(p.URLs) == 0 || p.Rate <= 0 || p.Duration <= 0 || p.Keys <= p.Hot || p.Hot < 0 {
		return nil, fmt.Errorf("load: a plan needs URLs, a rate, a duration and more keys than hot keys: %+v", p)
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	// One http.Request template per (replica, key) would be a lot of
	// memory at 10,000 keys; the targeter builds each target instead.
	replicas := make(map[string]int16, len(p.URLs))
	for i, u := range p.URLs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		replicas[pu.Host] = int16(i)
	}
	var seq atomic.Uint64
	targeter := func(t *vegeta.Target) error {
		i := seq.Add(1) - 1
		k := p.key(i)
		t.Method = http.MethodGet
		t.URL = p.URLs[i%uint64(len(p.URLs))] + p.Path + "?k=" + strconv.Itoa(k)
		t.Header = http.Header{"X-Api-Key": []string{p.KeyName(k)}}
		return nil
	}
	atk := vegeta.NewAttacker(
		vegeta.Timeout(timeout),
		vegeta.KeepAlive(true),
		vegeta.Workers(32),
		vegeta.MaxWorkers(2000),
		vegeta.Connections(256),
		vegeta.MaxBody(0),
	)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	began := time.Now()
	if p.OnStart != nil {
		p.OnStart(began)
	}
	res := &Result{Plan: p, Began: began}
	res.Records = make([]Record, 0, p.Rate*int(p.Duration/time.Second+1))
	for r := range atk.Attack(vegeta.Targeter(targeter), vegeta.ConstantPacer{Freq: p.Rate, Per: time.Second}, p.Duration, p.Name) {
		rec := Record{
			Sent:    r.Timestamp.Sub(began),
			Latency: r.Latency,
			Key:     -1,
			Replica: -1,
			Code:    r.Code,
		}
		if r.Code == 0 {
			rec.Err = r.Error
			if rec.Err == "" {
				rec.Err = "no answer"
			}
		}
		if u, err := url.Parse(r.URL); err == nil {
			if k, err := strconv.Atoi(u.Query().Get("k")); err == nil {
				rec.Key = int32(k)
			}
			if i, ok := replicas[u.Host]; ok {
				rec.Replica = i
			}
		}
		if r.Headers != nil {
			rec.By = r.Headers.Get(DecidedBy)
		}
		res.Records = append(res.Records, rec)
	}
	return res, ctx.Err()
}
