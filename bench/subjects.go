package bench

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	juju "github.com/juju/ratelimit"
	"github.com/mennanov/limiters"
	"github.com/ratekit/ratelimit"
	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	uber "go.uber.org/ratelimit"
	xrate "golang.org/x/time/rate"
)

// Scenario is the path a single-key benchmark sends its checks down.
type Scenario int

const (
	// Allowed: a limit the benchmark cannot exhaust, so every check admits.
	Allowed Scenario = iota
	// Denied: 1 per hour with a burst of 1, already spent, so every check
	// is refused.
	Denied
)

// The common limits. An allowed limit is 1e6 per second with a burst of
// 1e12: the burst alone covers more checks than any benchmark sends.
const (
	allowRate  = 1_000_000
	allowBurst = 1_000_000_000_000
)

// Check is one check of a subject: it reports whether the request was
// admitted.
type Check func() bool

// KeyedCheck is one check of a keyed subject for a key.
type KeyedCheck func(key string) bool

// Single is a single-key subject.
type Single struct {
	Name string
	Ours bool // one of this library's rules
	// Floor marks a reference point rather than a rate limiter.
	Floor bool
	// New builds a fresh limiter for the scenario, and a func that releases
	// it. It returns a nil Check for a scenario the subject cannot take.
	New func(Scenario) (Check, func())
	// Sleeps, when set, counts the times the subject slept instead of
	// returning at once (uber's Take blocks instead of refusing).
	Sleeps *atomic.Int64
}

// Keyed is a keyed subject: one allowance per key, all under the allowed
// limit.
type Keyed struct {
	Name  string
	Ours  bool
	Floor bool
	// New builds an empty store and a func that releases it.
	New func() (KeyedCheck, func())
}

// ourRules are this library's rules for a scenario.
func ourRules(sc Scenario) []struct {
	name string
	rule ratelimit.Rule
} {
	type nr = struct {
		name string
		rule ratelimit.Rule
	}
	if sc == Denied {
		hour := ratelimit.PerHour(1)
		return []nr{
			{"GCRA", ratelimit.GCRA{Rate: hour, Burst: 1}},
			{"GCRA-frac", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Hour}, Burst: 1}},
			{"TokenBucket", ratelimit.TokenBucket{Rate: hour, Burst: 1}},
			{"TokenBucket-frac", ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Hour}, Burst: 1}},
			{"LeakyBucket", ratelimit.LeakyBucket{Rate: hour, Capacity: 1}},
			{"LeakyBucket-frac", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Hour}, Capacity: 1}},
			{"FixedWindow", ratelimit.FixedWindow{Limit: 1, Window: time.Hour}},
			{"SlidingLog", ratelimit.SlidingLog{Limit: 1, Window: time.Hour}},
			{"SlidingCounter", ratelimit.SlidingCounter{Limit: 1, Window: time.Hour}},
		}
	}
	rate := ratelimit.PerSecond(allowRate)
	return []nr{
		{"GCRA", ratelimit.GCRA{Rate: rate, Burst: allowBurst}},
		// 7 per 3 µs: the same order of rate, but not a whole number of
		// nanoseconds per milli-unit.
		{"GCRA-frac", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Burst: allowBurst}},
		{"TokenBucket", ratelimit.TokenBucket{Rate: rate, Burst: allowBurst}},
		{"TokenBucket-frac", ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Burst: allowBurst}},
		{"LeakyBucket", ratelimit.LeakyBucket{Rate: rate, Capacity: allowBurst}},
		{"LeakyBucket-frac", ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: 7, Per: 3 * time.Microsecond}, Capacity: allowBurst}},
		{"FixedWindow", ratelimit.FixedWindow{Limit: allowBurst, Window: time.Second}},
		// A sliding log keeps every admission inside its window: a 1 ms
		// window holds a few ten thousand at benchmark speed, well under
		// the limit (1e9 per second).
		{"SlidingLog", ratelimit.SlidingLog{Limit: 1_000_000, Window: time.Millisecond}},
		{"SlidingCounter", ratelimit.SlidingCounter{Limit: allowBurst, Window: time.Second}},
	}
}

// ourKeyedRules are this library's rules for the keyed benchmarks: all
// admit everything a benchmark sends.
func ourKeyedRules() []struct {
	name string
	rule ratelimit.Rule
} {
	rate := ratelimit.PerSecond(allowRate)
	return []struct {
		name string
		rule ratelimit.Rule
	}{
		{"GCRA", ratelimit.GCRA{Rate: rate, Burst: allowBurst}},
		{"TokenBucket", ratelimit.TokenBucket{Rate: rate, Burst: allowBurst}},
		{"LeakyBucket", ratelimit.LeakyBucket{Rate: rate, Capacity: allowBurst}},
		{"FixedWindow", ratelimit.FixedWindow{Limit: allowBurst, Window: time.Second}},
		// Each key is checked about once per million checks: its log holds
		// one or two admissions.
		{"SlidingLog", ratelimit.SlidingLog{Limit: allowBurst, Window: time.Second}},
		{"SlidingCounter", ratelimit.SlidingCounter{Limit: allowBurst, Window: time.Second}},
	}
}

// StoreMaxKeys is the bound of this library's stores in the keyed
// benchmarks: room for every key, so nothing is evicted while they run.
const StoreMaxKeys = 1 << 21

// uberSleeps counts uber's sleeps (see [Single].Sleeps).
var uberSleeps atomic.Int64

// countingClock is uber's clock (time.Now, time.Sleep) with its sleeps
// counted.
type countingClock struct{ sleeps *atomic.Int64 }

func (countingClock) Now() time.Time { return time.Now() }

func (c countingClock) Sleep(d time.Duration) {
	c.sleeps.Add(1)
	time.Sleep(d)
}

var origin = time.Now()

func nop() {}

// SingleSubjects returns the single-key subjects.
//
// Peer configurations, where they differ from the common one:
//
//   - go-limiter's memorystore refills a bucket once per Interval with
//     Interval/Tokens tokens (its fillRate times the ticks elapsed), so for
//     Tokens*Tokens > Interval in nanoseconds it under-refills: 1e6 per
//     second gets 1,000 tokens back per second. The allowed configuration
//     is therefore 1e12 tokens per 1e6 seconds (the common rate): no
//     interval ends while a benchmark runs, and every check takes from the
//     first interval's tokens.
//   - uber's Take never refuses: it sleeps until the request may go. It is
//     benchmarked at 1e9 per second (1 ns per request, the highest rate it
//     accepts without rounding the interval to zero), so that it almost
//     never sleeps; sleeps/op reports how often it did.
//   - mennanov's token bucket takes its refill as a time.Duration per
//     token: 1 µs is the common rate.
func SingleSubjects() []Single {
	var out []Single
	out = append(out, Single{Name: "floor-clock", Floor: true, New: func(Scenario) (Check, func()) {
		// One monotonic clock read, as every limiter here needs at least one.
		return func() bool { return time.Since(origin) >= 0 }, nop
	}})
	names := ourRules(Allowed)
	for i := range names {
		name := "ratelimit." + names[i].name
		out = append(out, Single{Name: name, Ours: true, New: func(sc Scenario) (Check, func()) {
			lim, err := ratelimit.New(ourRules(sc)[i].rule, ratelimit.WithClock(ratelimit.SystemClock()))
			if err != nil {
				panic(err)
			}
			return func() bool {
				d, _ := lim.Check(ratelimit.Unit)
				return d.Allowed
			}, nop
		}})
	}
	out = append(out,
		Single{Name: "x-time-rate", New: func(sc Scenario) (Check, func()) {
			lim := xrate.NewLimiter(allowRate, allowBurst)
			if sc == Denied {
				lim = xrate.NewLimiter(xrate.Every(time.Hour), 1)
			}
			return lim.Allow, nop
		}},
		Single{Name: "throttled", New: func(sc Scenario) (Check, func()) {
			q := throttled.RateQuota{MaxRate: throttled.PerSec(allowRate), MaxBurst: allowBurst}
			if sc == Denied {
				q = throttled.RateQuota{MaxRate: throttled.PerHour(1), MaxBurst: 0}
			}
			return throttledCheck(0, q)
		}},
		Single{Name: "go-limiter", New: func(sc Scenario) (Check, func()) {
			check, done := goLimiterCheck(sc)
			return func() bool { return check("k") }, done
		}},
		Single{Name: "ulule", New: func(sc Scenario) (Check, func()) {
			check := ululeCheck(sc)
			return func() bool { return check("k") }, nop
		}},
		Single{Name: "juju", New: func(sc Scenario) (Check, func()) {
			b := juju.NewBucketWithRate(allowRate, allowBurst)
			if sc == Denied {
				b = juju.NewBucketWithRate(1.0/3600, 1)
			}
			return func() bool { return b.TakeAvailable(1) == 1 }, nop
		}},
		Single{Name: "uber", Sleeps: &uberSleeps, New: func(sc Scenario) (Check, func()) {
			if sc == Denied {
				return nil, nop // Take never refuses
			}
			lim := uber.New(1_000_000_000, uber.WithClock(countingClock{&uberSleeps}))
			return func() bool { lim.Take(); return true }, nop
		}},
		Single{Name: "mennanov", New: func(sc Scenario) (Check, func()) {
			tb := mennanovBucket(sc)
			ctx := context.Background()
			return func() bool {
				_, err := tb.Limit(ctx)
				return err == nil
			}, nop
		}},
	)
	return out
}

// throttledCheck returns a single-key check on a throttled GCRA over a
// memstore bounded at maxKeys (0: an unbounded map).
func throttledCheck(maxKeys int, q throttled.RateQuota) (Check, func()) {
	check := throttledKeyed(maxKeys, q)
	return func() bool { return check("k") }, nop
}

func throttledKeyed(maxKeys int, q throttled.RateQuota) KeyedCheck {
	st, err := memstore.NewCtx(maxKeys)
	if err != nil {
		panic(err)
	}
	lim, err := throttled.NewGCRARateLimiterCtx(st, q)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	return func(key string) bool {
		limited, _, err := lim.RateLimitCtx(ctx, key, 1)
		return err == nil && !limited
	}
}

func goLimiterCheck(sc Scenario) (KeyedCheck, func()) {
	st, done := goLimiterStore(sc)
	ctx := context.Background()
	return func(key string) bool {
		_, _, _, ok, err := st.Take(ctx, key)
		return ok && err == nil
	}, done
}

// goLimiterStore returns go-limiter's memorystore for the scenario (see
// [SingleSubjects]), and a func that stops it.
func goLimiterStore(sc Scenario) (golimiter.Store, func()) {
	cfg := &memorystore.Config{Tokens: allowBurst, Interval: allowBurst / allowRate * time.Second}
	if sc == Denied {
		cfg = &memorystore.Config{Tokens: 1, Interval: time.Hour}
	}
	st, err := memorystore.New(cfg)
	if err != nil {
		panic(err)
	}
	return st, func() {
		if err := st.Close(context.Background()); err != nil && !errors.Is(err, golimiter.ErrStopped) {
			panic(err)
		}
	}
}

func ululeCheck(sc Scenario) KeyedCheck {
	r := ulule.Rate{Period: time.Second, Limit: allowBurst}
	if sc == Denied {
		r = ulule.Rate{Period: time.Hour, Limit: 1}
	}
	lim := ulule.New(ululemem.NewStore(), r)
	ctx := context.Background()
	return func(key string) bool {
		c, err := lim.Get(ctx, key)
		return err == nil && !c.Reached
	}
}

// mennanov's locker, clock and logger hold no state: every bucket shares
// them.
var (
	mennanovLock   = limiters.NewLockNoop()
	mennanovClock  = limiters.NewSystemClock()
	mennanovLogger = limiters.NewStdLogger()
)

func mennanovBucket(sc Scenario) *limiters.TokenBucket {
	capacity, refill := int64(allowBurst), time.Second/allowRate
	if sc == Denied {
		capacity, refill = 1, time.Hour
	}
	return limiters.NewTokenBucket(capacity, refill, mennanovLock,
		limiters.NewTokenBucketInMemory(), mennanovClock, mennanovLogger)
}

// lockedMap is the keyed store a library without one needs: a map of
// per-key limiters behind one mutex, each made on first use.
type lockedMap[T any] struct {
	mu   sync.Mutex
	m    map[string]T
	make func() T
}

func (l *lockedMap[T]) get(key string) T {
	l.mu.Lock()
	v, ok := l.m[key]
	if !ok {
		v = l.make()
		l.m[key] = v
	}
	l.mu.Unlock()
	return v
}

// KeyedSubjects returns the keyed subjects.
func KeyedSubjects() []Keyed {
	var out []Keyed
	out = append(out, Keyed{Name: "floor-map", Floor: true, New: func() (KeyedCheck, func()) {
		// Not safe for concurrent writes: the benchmarks insert serially
		// and then only read.
		m := make(map[string]int64)
		var n int64
		return func(key string) bool {
			if _, ok := m[key]; !ok {
				n++
				m[key] = n
			}
			return true
		}, nop
	}})
	out = append(out, Keyed{Name: "floor-map-clock", Floor: true, New: func() (KeyedCheck, func()) {
		// The same lookup and one monotonic clock read, which every limiter
		// needs: the clock read (an ordered TSC read in the vDSO) waits for
		// the lookup's cache misses, so consecutive lookups no longer
		// overlap their misses as bare ones do.
		m := make(map[string]int64)
		var n int64
		return func(key string) bool {
			now := int64(time.Since(origin))
			v, ok := m[key]
			if !ok {
				n++
				m[key] = n
			}
			return v+now >= 0
		}, nop
	}})
	for _, r := range ourKeyedRules() {
		out = append(out, Keyed{Name: "ratelimit." + r.name, Ours: true, New: func() (KeyedCheck, func()) {
			s, err := ratelimit.NewStore(r.rule, ratelimit.WithMaxKeys(StoreMaxKeys),
				ratelimit.WithClock(ratelimit.SystemClock()))
			if err != nil {
				panic(err)
			}
			return func(key string) bool {
				d, _ := s.Check(key, ratelimit.Unit)
				return d.Allowed
			}, nop
		}})
	}
	allowQuota := throttled.RateQuota{MaxRate: throttled.PerSec(allowRate), MaxBurst: allowBurst}
	out = append(out,
		Keyed{Name: "x-time-rate", New: func() (KeyedCheck, func()) {
			m := &lockedMap[*xrate.Limiter]{m: make(map[string]*xrate.Limiter),
				make: func() *xrate.Limiter { return xrate.NewLimiter(allowRate, allowBurst) }}
			return func(key string) bool { return m.get(key).Allow() }, nop
		}},
		Keyed{Name: "throttled", New: func() (KeyedCheck, func()) {
			return throttledKeyed(0, allowQuota), nop
		}},
		Keyed{Name: "throttled-lru", New: func() (KeyedCheck, func()) {
			return throttledKeyed(StoreMaxKeys, allowQuota), nop
		}},
		Keyed{Name: "go-limiter", New: func() (KeyedCheck, func()) {
			return goLimiterCheck(Allowed)
		}},
		Keyed{Name: "ulule", New: func() (KeyedCheck, func()) {
			return ululeCheck(Allowed), nop
		}},
		Keyed{Name: "juju", New: func() (KeyedCheck, func()) {
			m := &lockedMap[*juju.Bucket]{m: make(map[string]*juju.Bucket),
				make: func() *juju.Bucket { return juju.NewBucketWithRate(allowRate, allowBurst) }}
			return func(key string) bool { return m.get(key).TakeAvailable(1) == 1 }, nop
		}},
		Keyed{Name: "mennanov", New: func() (KeyedCheck, func()) {
			reg := limiters.NewRegistry()
			ctx := context.Background()
			mk := func() any { return mennanovBucket(Allowed) }
			return func(key string) bool {
				tb := reg.GetOrCreate(key, mk, time.Hour, time.Now()).(*limiters.TokenBucket)
				_, err := tb.Limit(ctx)
				return err == nil
			}, nop
		}},
	)
	return out
}
