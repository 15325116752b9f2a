package ratelimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// threeClasses are the classes of the examples: critical may fill the
// whole limit, default 90% of it, sheddable 70%.
var threeClasses = []ratelimit.ShedClass{{Name: "critical", Share: 100}, {Name: "default", Share: 90}, {Name: "sheddable", Share: 70}}

const (
	critical ratelimit.Priority = iota
	defaultClass
	sheddable
)

func TestShedRulesRejected(t *testing.T) {
	fleet := []struct {
		name string
		l    ratelimit.FleetLimit
	}{
		{"no limit", ratelimit.FleetLimit{Classes: threeClasses}},
		{"limit too large", ratelimit.FleetLimit{Limit: 1e9 + 1, Classes: threeClasses}},
		{"no classes", ratelimit.FleetLimit{Limit: 10}},
		{"empty name", ratelimit.FleetLimit{Limit: 10, Classes: []ratelimit.ShedClass{{Share: 100}}}},
		{"same name", ratelimit.FleetLimit{Limit: 10, Classes: []ratelimit.ShedClass{{Name: "a", Share: 100}, {Name: "a", Share: 50}}}},
		{"share 0", ratelimit.FleetLimit{Limit: 10, Classes: []ratelimit.ShedClass{{Name: "a", Share: 0}}}},
		{"share 101", ratelimit.FleetLimit{Limit: 10, Classes: []ratelimit.ShedClass{{Name: "a", Share: 101}}}},
		{"shares increase", ratelimit.FleetLimit{Limit: 10, Classes: []ratelimit.ShedClass{{Name: "a", Share: 50}, {Name: "b", Share: 60}}}},
		{"share under one request", ratelimit.FleetLimit{Limit: 3, Classes: []ratelimit.ShedClass{{Name: "a", Share: 100}, {Name: "b", Share: 30}}}},
		{"negative retry", ratelimit.FleetLimit{Limit: 10, Classes: threeClasses, RetryAfter: -1}},
	}
	for _, tc := range fleet {
		t.Run("fleet/"+tc.name, func(t *testing.T) {
			s, err := ratelimit.NewFleetShedder(tc.l)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.Nil(t, s)
		})
	}
	worker := []struct {
		name string
		l    ratelimit.WorkerLimit
	}{
		{"no limit", ratelimit.WorkerLimit{Classes: threeClasses}},
		{"no classes", ratelimit.WorkerLimit{Limit: 10}},
		{"hysteresis negative", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Hysteresis: -1}},
		{"hysteresis reaches a share", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Hysteresis: 70}},
		{"negative hold", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Hold: -time.Second}},
		{"limit below min", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 11}}},
		{"limit above max", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MaxLimit: 9}}},
		{"min share under one request", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 1}}},
		{"tolerance under 100", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 2, Tolerance: 99}}},
		{"smoothing over 100", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 2, Smoothing: 101}}},
		{"negative window", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 2, Window: -1}}},
		{"negative queue", ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Adaptive: &ratelimit.Gradient{MinLimit: 2, Queue: -1}}},
	}
	for _, tc := range worker {
		t.Run("worker/"+tc.name, func(t *testing.T) {
			s, err := ratelimit.NewWorkerShedder(tc.l)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.Nil(t, s)
		})
	}
}

// admitAll admits n requests of class p and returns their Releases and the
// last Decision.
func admitAll(t *testing.T, s ratelimit.Shedder, p ratelimit.Priority, n int) ([]ratelimit.Release, ratelimit.Decision) {
	t.Helper()
	var rels []ratelimit.Release
	var d ratelimit.Decision
	for range n {
		rel, dd, err := s.Admit(context.Background(), p)
		require.NoError(t, err)
		d = dd
		if d.Allowed {
			rels = append(rels, rel)
		}
	}
	return rels, d
}

func TestFleetShedderShares(t *testing.T) {
	tests := []struct {
		name  string
		class ratelimit.Priority
		fill  int // requests of critical class already in progress
		allow bool
		left  int64
	}{
		{"sheddable below its share", sheddable, 68, true, 1},
		{"sheddable at its share", sheddable, 70, false, 0},
		{"default above sheddable's share", defaultClass, 70, true, 19},
		{"default at its share", defaultClass, 90, false, 0},
		{"critical in the kept tenth", critical, 90, true, 9},
		{"critical at the limit", critical, 100, false, 0},
		{"out of range is the least important", ratelimit.Priority(7), 70, false, 0},
		{"negative is the least important", ratelimit.Priority(-1), 69, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 100, Classes: threeClasses, Name: "fleet"})
			require.NoError(t, err)
			_, _ = admitAll(t, s, critical, tc.fill)
			_, d, err := s.Admit(context.Background(), tc.class)
			require.NoError(t, err)
			assert.Equal(t, tc.allow, d.Allowed)
			assert.Equal(t, tc.left, d.Remaining)
			assert.Equal(t, "fleet", d.Policy)
			if !tc.allow {
				assert.Equal(t, time.Second, d.RetryAfter)
			}
		})
	}
}

// releaseOne releases one of held, drawn, twice (the second call must
// change nothing), and drops it from held; it skips the action if nothing
// is held.
func releaseOne(t *rapid.T, held *[]ratelimit.Release) {
	if len(*held) == 0 {
		t.Skip("nothing held")
	}
	i := rapid.IntRange(0, len(*held)-1).Draw(t, "slot")
	(*held)[i]()
	(*held)[i]() // idempotent
	*held = append((*held)[:i], (*held)[i+1:]...)
}

// fleetModel is a plain model of a FleetShedder: a count, and each class's
// share of the limit worked out with floats far from any rounding edge.
type fleetModel struct {
	limit  int64
	shares []int
	inUse  int64
}

func (m *fleetModel) admit(i int) (bool, int64) {
	capacity := int64(float64(m.shares[i]) * float64(m.limit) / 100)
	if m.inUse >= capacity {
		return false, 0
	}
	m.inUse++
	return true, capacity - m.inUse
}

func TestFleetShedderModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(10, 200).Draw(t, "limit")
		a := rapid.IntRange(10, 100).Draw(t, "shareA")
		b := rapid.IntRange(10, a).Draw(t, "shareB")
		classes := []ratelimit.ShedClass{{Name: "a", Share: a}, {Name: "b", Share: b}}
		s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: limit, Classes: classes})
		if err != nil {
			t.Fatal(err)
		}
		m := &fleetModel{limit: limit, shares: []int{a, b}}
		var held []ratelimit.Release
		t.Repeat(map[string]func(*rapid.T){
			"admit": func(t *rapid.T) {
				i := rapid.IntRange(0, 1).Draw(t, "class")
				rel, d, err := s.Admit(context.Background(), ratelimit.Priority(i))
				if err != nil {
					t.Fatal(err)
				}
				ok, left := m.admit(i)
				if d.Allowed != ok || d.Remaining != left {
					t.Fatalf("class %d: got allowed %v remaining %d, model %v %d", i, d.Allowed, d.Remaining, ok, left)
				}
				if ok {
					held = append(held, rel)
				}
			},
			"release": func(t *rapid.T) {
				releaseOne(t, &held)
				m.inUse--
			},
			"": func(t *rapid.T) {
				n, err := s.InUse(context.Background())
				if err != nil || n != m.inUse {
					t.Fatalf("in use %d (%v), model %d", n, err, m.inUse)
				}
			},
		})
	})
}

// workerModel is a plain model of a fixed-limit WorkerShedder: one flag per
// class, set when the work in progress reaches the class's share and
// cleared when it falls hysteresis points below it (after hold; a class
// of share 100 as soon as it is below the limit), a class being readmitted
// only once every more important class is.
type workerModel struct {
	limit   int64
	shares  []int
	hyst    int
	hold    time.Duration
	inUse   int64
	refused []bool
	since   []time.Duration
	now     time.Duration
}

func (m *workerModel) update() {
	pct := float64(m.inUse) * 100 / float64(m.limit)
	for i, sh := range m.shares {
		if !m.refused[i] && pct >= float64(sh) {
			m.refused[i], m.since[i] = true, m.now
		}
	}
	for i, sh := range m.shares {
		hyst, hold := m.hyst, m.hold
		if sh == 100 {
			hyst, hold = 0, 0
		}
		if m.refused[i] && (i == 0 || !m.refused[i-1]) && pct < float64(sh-hyst) && m.now-m.since[i] >= hold {
			m.refused[i] = false
		}
	}
}

func (m *workerModel) admit(i int) bool {
	m.update()
	if m.refused[i] || m.inUse >= m.limit {
		return false
	}
	m.inUse++
	m.update()
	return true
}

func (m *workerModel) release() {
	m.update()
	m.inUse--
	m.update()
}

func TestWorkerShedderModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 40).Draw(t, "limit")
		n := rapid.IntRange(1, 4).Draw(t, "classes")
		shares := make([]int, n)
		classes := make([]ratelimit.ShedClass, n)
		prev := 100
		for i := range shares {
			low := max(1, int((100+limit-1)/limit)) // at least one request
			if low > prev {
				t.Skip("no share fits")
			}
			shares[i] = rapid.IntRange(low, prev).Draw(t, "share")
			prev = shares[i]
			classes[i] = ratelimit.ShedClass{Name: string(rune('a' + i)), Share: shares[i]}
		}
		hyst := rapid.IntRange(1, shares[n-1]).Draw(t, "hysteresis") - 1
		if hyst == 0 {
			hyst = 10
			if hyst >= shares[n-1] {
				t.Skip("the default hysteresis does not fit")
			}
		}
		hold := time.Duration(rapid.IntRange(0, 3).Draw(t, "holdSeconds")) * time.Second
		clk := ratelimit.NewManualClock(0)
		s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: limit, Classes: classes, Hysteresis: hyst, Hold: hold}, ratelimit.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		m := &workerModel{limit: limit, shares: shares, hyst: hyst, hold: hold, refused: make([]bool, n), since: make([]time.Duration, n)}
		var held []ratelimit.Release
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				d := time.Duration(rapid.IntRange(0, 2000).Draw(t, "ms")) * time.Millisecond
				m.now = clk.Advance(d)
			},
			"admit": func(t *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(t, "class")
				rel, d, err := s.Admit(context.Background(), ratelimit.Priority(i))
				if err != nil {
					t.Fatal(err)
				}
				ok := m.admit(i)
				if d.Allowed != ok {
					t.Fatalf("class %d at %d in use: allowed %v, model %v (refused %v)", i, m.inUse, d.Allowed, ok, m.refused)
				}
				if ok {
					held = append(held, rel)
				}
			},
			"release": func(t *rapid.T) {
				releaseOne(t, &held)
				m.release()
			},
			"": func(t *rapid.T) {
				if got := s.InUse(); got != m.inUse || got > limit {
					t.Fatalf("in use %d, model %d, limit %d", got, m.inUse, limit)
				}
				// Refusals are a suffix: never a class refused while a
				// less important one is admitted.
				p, refusing := s.Refusing()
				m.update()
				for i := range m.refused {
					if m.refused[i] != (refusing && i >= int(p)) {
						t.Fatalf("refusing from %d (%v), model %v", p, refusing, m.refused)
					}
				}
			},
		})
	})
}

func TestWorkerShedderOrderAndHysteresis(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Hold: 2 * time.Second, Name: "workers"},
		ratelimit.WithClock(clk))
	require.NoError(t, err)
	ctx := context.Background()

	rels, d := admitAll(t, s, sheddable, 10)
	require.Len(t, rels, 7, "sheddable fills 70%")
	assert.False(t, d.Allowed)
	assert.Equal(t, int64(7), d.Limit)
	more, _ := admitAll(t, s, defaultClass, 5)
	require.Len(t, more, 2, "default fills up to 90%")
	rels = append(rels, more...)
	more, _ = admitAll(t, s, critical, 5)
	require.Len(t, more, 1, "critical takes the last place")
	rels = append(rels, more...)
	p, refusing := s.Refusing()
	require.True(t, refusing)
	assert.Equal(t, critical, p)

	// Readmission, most important first: critical (Share 100) as soon as
	// there is room; default below 80% (7 in progress) and after Hold;
	// sheddable below 60% (5).
	rels[0]()
	rel, d, _ := s.Admit(ctx, critical)
	assert.True(t, d.Allowed, "9 in progress: critical at once, no hysteresis at the limit")
	rel()
	_, d, _ = s.Admit(ctx, defaultClass)
	assert.False(t, d.Allowed, "9 in progress: default refused")
	rels[1]()
	_, d, _ = s.Admit(ctx, defaultClass)
	assert.False(t, d.Allowed, "hysteresis: 8 in progress is not below 90% - 10")
	rels[2]()
	_, d, _ = s.Admit(ctx, defaultClass)
	assert.False(t, d.Allowed, "7 in progress, but Hold keeps default refused for 2 s")
	clk.Advance(2 * time.Second)
	rel, d, _ = s.Admit(ctx, defaultClass)
	assert.True(t, d.Allowed, "7 in progress after Hold: default again")
	rel()
	_, d, _ = s.Admit(ctx, sheddable)
	assert.False(t, d.Allowed, "sheddable needs below 60%")
	rels[3]()
	_, d, _ = s.Admit(ctx, sheddable)
	assert.False(t, d.Allowed, "6 in progress is not below 60%")
	rels[4]()
	rel, d, _ = s.Admit(ctx, sheddable)
	assert.True(t, d.Allowed, "5 in progress: everything again")
	rel()
	for _, r := range rels {
		r()
	}
	assert.Zero(t, s.InUse())
	_, refusing = s.Refusing()
	assert.False(t, refusing)
}

func TestShedContextEnded(t *testing.T) {
	fleet, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 10, Classes: threeClasses})
	require.NoError(t, err)
	worker, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, s := range []ratelimit.Shedder{fleet, worker} {
		rel, d, err := s.Admit(ctx, critical)
		assert.ErrorIs(t, err, context.Canceled)
		assert.False(t, d.Allowed)
		rel()
	}
	n, _ := fleet.InUse(context.Background())
	assert.Zero(t, n)
	assert.Zero(t, worker.InUse())
}

// A slot is given back when the work returns, panics, or ends with its
// context.
func TestShedReleaseOnReturnPanicCancel(t *testing.T) {
	worker, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses})
	require.NoError(t, err)
	work := func(ctx context.Context, body func(context.Context)) {
		rel, d, err := worker.Admit(ctx, defaultClass)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		defer rel()
		body(ctx)
	}
	work(context.Background(), func(context.Context) { assert.Equal(t, int64(1), worker.InUse()) })
	assert.Zero(t, worker.InUse(), "return")
	func() {
		defer func() { assert.NotNil(t, recover()) }()
		work(context.Background(), func(context.Context) { panic("boom") })
	}()
	assert.Zero(t, worker.InUse(), "panic")
	ctx, cancel := context.WithCancel(context.Background())
	done, started := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		work(ctx, func(ctx context.Context) {
			close(started)
			<-ctx.Done()
		})
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the work did not start")
	}
	assert.Equal(t, int64(1), worker.InUse())
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the work did not end with its context")
	}
	assert.Zero(t, worker.InUse(), "cancel")
}

type failingCounter struct{}

var errCounter = errors.New("counter down")

func (failingCounter) Acquire(context.Context, int64) (ratelimit.Release, ratelimit.Decision, error) {
	return func() {}, ratelimit.Decision{}, errCounter
}
func (failingCounter) InUse(context.Context) (int64, error) { return 0, errCounter }

func TestFleetCounterFailure(t *testing.T) {
	rec := newRecorder()
	s, err := ratelimit.NewFleetShedder(ratelimit.FleetLimit{Limit: 10, Classes: threeClasses, Counter: failingCounter{}, Name: "fleet"},
		ratelimit.WithObserver(rec))
	require.NoError(t, err)
	_, d, err := s.Admit(context.Background(), critical)
	assert.ErrorIs(t, err, errCounter)
	assert.False(t, d.Allowed)
	assert.Len(t, rec.failures, 1)
}

// classRecorder is a ShedObserver counting decisions by class.
type classRecorder struct {
	*recorder
	mu      sync.Mutex
	byClass map[string][2]int // refused, allowed
}

func (c *classRecorder) Shed(policy, class string, o ratelimit.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.byClass[policy+"/"+class]
	if o == ratelimit.OutcomeAllowed {
		v[1]++
	} else {
		v[0]++
	}
	c.byClass[policy+"/"+class] = v
}

func TestShedObserverByClass(t *testing.T) {
	rec := &classRecorder{recorder: newRecorder(), byClass: map[string][2]int{}}
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Name: "workers"}, ratelimit.WithObserver(rec))
	require.NoError(t, err)
	_, _ = admitAll(t, s, sheddable, 8)
	_, _ = admitAll(t, s, critical, 1)
	assert.Equal(t, map[string][2]int{"workers/sheddable": {1, 7}, "workers/critical": {0, 1}}, rec.byClass)
	assert.Equal(t, 8, rec.counts()[outcomeKey{"workers", ratelimit.OutcomeAllowed}])
	assert.Equal(t, 1, rec.counts()[outcomeKey{"workers", ratelimit.OutcomeRefused}])
}

// runWindow admits n requests of the default class, advances the clock by
// latency, releases them, and moves on to the end of a window of one
// second; it returns the limit then in force.
func runWindow(t *testing.T, s *ratelimit.WorkerShedder, clk *ratelimit.ManualClock, n int, latency time.Duration) int64 {
	t.Helper()
	start := clk.Now()
	rels, _ := admitAll(t, s, critical, n)
	clk.Advance(latency)
	for _, r := range rels {
		r()
	}
	clk.Set(start + time.Second)
	return s.Limit()
}

func TestGradientLimit(t *testing.T) {
	newShedder := func() (*ratelimit.WorkerShedder, *ratelimit.ManualClock) {
		clk := ratelimit.NewManualClock(0)
		s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 20, Classes: threeClasses,
			Adaptive: &ratelimit.Gradient{MinLimit: 10, MaxLimit: 100}}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		return s, clk
	}
	trace := func() []int64 {
		s, clk := newShedder()
		var limits []int64
		for range 5 { // steady: the limit probes upward, 0.8 a window
			limits = append(limits, runWindow(t, s, clk, int(s.Limit()), 10*time.Millisecond))
		}
		for range 10 { // five times slower: it comes down
			limits = append(limits, runWindow(t, s, clk, int(s.Limit()), 50*time.Millisecond))
		}
		for range 10 { // recovered: it climbs back
			limits = append(limits, runWindow(t, s, clk, int(s.Limit()), 10*time.Millisecond))
		}
		for range 3 { // little traffic: it holds
			limits = append(limits, runWindow(t, s, clk, 2, 10*time.Millisecond))
		}
		return limits
	}
	got := trace()
	assert.Equal(t, got, trace(), "the same trace moves the limit the same way")
	t.Log(got)
	assert.Equal(t, []int64{20, 21, 22, 23, 24}, got[:5], "first window sets the long-term latency; then +0.8 a window")
	assert.Less(t, got[14], got[4]*2/3, "the slowdown brings the limit down")
	assert.Greater(t, got[24], got[14], "recovery raises it again")
	assert.Equal(t, got[24], got[27], "no growth while traffic is below half the limit")
}

// Gradient's zero value is usable with classes whose shares of 1 are less
// than a request: MinLimit defaults to the least limit at which every
// class has room for one.
func TestGradientDefaults(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 20, Classes: threeClasses, Adaptive: &ratelimit.Gradient{}},
		ratelimit.WithClock(clk))
	require.NoError(t, err)
	runWindow(t, s, clk, int(s.Limit()), 10*time.Millisecond)
	lowest := s.Limit()
	for range 60 { // 50 times slower
		lowest = min(lowest, runWindow(t, s, clk, int(s.Limit()), time.Second/2))
	}
	assert.InDelta(t, 8, lowest, 1, "the gradient's floor of 1/2 makes the limit settle near 2 x Queue")
	assert.Greater(t, s.Limit(), lowest, "as the long-term latency catches up, the slow latency is the new normal")
	_, d, err := s.Admit(context.Background(), sheddable)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "sheddable still has a place at the least limit")
}

func TestGradientBounds(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 20, Classes: threeClasses,
		Adaptive: &ratelimit.Gradient{MinLimit: 15, MaxLimit: 22, Smoothing: 100}}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	for range 5 {
		runWindow(t, s, clk, int(s.Limit()), 10*time.Millisecond)
	}
	assert.Equal(t, int64(22), s.Limit(), "held at MaxLimit")
	for range 5 {
		runWindow(t, s, clk, int(s.Limit()), time.Second/2)
	}
	assert.Equal(t, int64(15), s.Limit(), "held at MinLimit")
	// Time going backwards is clamped, and moves nothing.
	clk.Set(0)
	assert.Equal(t, int64(15), s.Limit())
}

// A refusal's RetryAfter is the rule's hint, or longer while Hold keeps
// the class refused: a retry sooner is sure to be refused again. A class
// is readmitted only after the classes above it, so their Hold counts too.
func TestWorkerShedderRetryAfterCoversHold(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	s, err := ratelimit.NewWorkerShedder(ratelimit.WorkerLimit{Limit: 10, Classes: threeClasses, Hold: 5 * time.Second},
		ratelimit.WithClock(clk))
	require.NoError(t, err)
	ctx := context.Background()
	rels, d := admitAll(t, s, sheddable, 8) // sheddable refused from 7 in progress
	require.Len(t, rels, 7)
	assert.Equal(t, 5*time.Second, d.RetryAfter, "all of Hold is left")
	clk.Advance(3 * time.Second)
	more, d := admitAll(t, s, defaultClass, 3) // default refused from 9, 3 s after sheddable
	require.Len(t, more, 2)
	assert.Equal(t, 5*time.Second, d.RetryAfter, "default's own Hold")
	_, d, err = s.Admit(ctx, sheddable)
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, d.RetryAfter, "sheddable waits for default, refused 3 s after it")
	for _, r := range append(rels, more...) {
		r()
	}
	clk.Advance(4500 * time.Millisecond) // default's Hold has 500 ms left
	_, d, err = s.Admit(ctx, sheddable)
	require.NoError(t, err)
	require.False(t, d.Allowed, "Hold keeps default, and so sheddable, refused")
	assert.Equal(t, time.Second, d.RetryAfter, "the hint, longer than what is left of Hold")
	clk.Advance(500 * time.Millisecond)
	_, d, err = s.Admit(ctx, sheddable)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Zero(t, d.RetryAfter)
}
