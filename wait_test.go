package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// Wait is checked against the reference models on virtual time: a waiter
// must wake at exactly the earliest instant the model admits its request
// (plus, for the leaky bucket, the model's Delay), return the model's
// Decision for that instant, and leave the limiter exactly as the model
// that admitted it. A waiter that gives up must leave it exactly as the
// model that never saw it.

// limitCase is a drawn valid rule of any algorithm and a way to build its
// reference model.
type limitCase struct {
	kind     string
	rule     ratelimit.Rule
	newModel func() refmodel.Model
	capMilli int64
	scale    time.Duration // a period or a window: the time scale of gaps
	name     string
	window   time.Duration // every Decision's Window
}

// drawLimitCase draws a valid rule of the algorithm, with small capacities
// most of the time so that traces reach the limit.
func drawLimitCase(t *rapid.T, a testedAlgorithm) limitCase {
	return drawLimitCaseWhere(t, a, func(ratelimit.Rate) bool { return true })
}

// drawLimitCaseWhere is drawLimitCase with the buckets' rates limited to
// those for which ok holds.
func drawLimitCaseWhere(t *rapid.T, a testedAlgorithm, ok func(ratelimit.Rate) bool) limitCase {
	s := settings{name: drawName(t)}
	s.capacity = rapid.OneOf(rapid.Int64Range(1, 8), rapid.Int64Range(1, 1000)).Draw(t, "capacity")
	if a.bucket {
		// At most a day per period, so that everything a test waits for
		// stays far from MaxTime.
		s.rate = drawRate(t)
		for s.rate.Per > day || !spanFits(s.rate, s.capacity) || !ok(s.rate) {
			s.rate = drawRate(t)
		}
	} else {
		s.window = drawWindow(t)
		for s.window > day {
			s.window = drawWindow(t)
		}
	}
	return limitCase{
		kind:     a.name,
		rule:     a.rule(s),
		newModel: func() refmodel.Model { return a.model(s) },
		capMilli: s.capacity * 1000,
		scale:    a.scale(s),
		name:     s.name,
		window:   a.decisionWindow(s),
	}
}

// want completes a model's Decision with the rule's Policy and Window.
func (lc limitCase) want(d ratelimit.Decision) ratelimit.Decision {
	d.Policy, d.Window = lc.name, lc.window
	return d
}

// drawCostWithin draws a cost from 1 milli-unit to capMilli, favouring
// whole units.
func drawCostWithin(t *rapid.T, capMilli int64, label string) ratelimit.Units {
	return ratelimit.Units(rapid.OneOf(
		rapid.Just(int64(1000)),
		rapid.Map(rapid.Int64Range(1, max(capMilli/1000, 1)), func(n int64) int64 { return min(n*1000, capMilli) }),
		rapid.Int64Range(1, capMilli),
	).Draw(t, label))
}

// admission is an admitted request in a trace: what a model replays.
type admission struct {
	at   int64
	cost int64
}

// replayModel returns a fresh model that has seen the admissions.
func replayModel(newModel func() refmodel.Model, hist []admission) refmodel.Model {
	m := newModel()
	for _, a := range hist {
		m.Step(a.at, a.cost)
	}
	return m
}

// waitTrace drives a limiter and its model through a random history of
// checks and returns the admissions. Both end at the same state.
func waitTrace(t *rapid.T, lc limitCase, clk *ratelimit.ManualClock, lim ratelimit.Limiter, model refmodel.Model) []admission {
	var hist []admission
	for i, n := 0, rapid.IntRange(0, 12).Draw(t, "history"); i < n; i++ {
		clk.Advance(time.Duration(rapid.OneOf(
			rapid.Just(int64(0)),
			rapid.Int64Range(0, 3),
			rapid.Int64Range(0, int64(lc.scale)),
		).Draw(t, "gap")))
		cost := drawCostWithin(t, lc.capMilli, "historyCost")
		got, err := lim.Check(cost)
		require.NoError(t, err)
		now := int64(clk.Now())
		require.Equal(t, lc.want(model.Step(now, int64(cost))), got)
		if got.Allowed {
			hist = append(hist, admission{now, int64(cost)})
		}
	}
	return hist
}

// waitResult is what a waiting goroutine reports.
type waitResult struct {
	d   ratelimit.Decision
	err error
	at  time.Duration // the clock's reading when Wait returned
}

// startWait runs Wait in a goroutine; the channel delivers its result.
func startWait(ctx context.Context, lim ratelimit.Limiter, clk ratelimit.Clock, cost ratelimit.Units) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		d, err := lim.Wait(ctx, cost)
		out <- waitResult{d, err, clk.Now()}
	}()
	return out
}

// nextWake waits until the waiter is either asleep on clk (returning the
// instant it waits for) or finished (returning its result).
func nextWake(t require.TestingT, clk *ratelimit.ManualClock, res <-chan waitResult) (time.Duration, *waitResult) {
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	asleep := make(chan error, 1)
	go func() { asleep <- clk.BlockUntilSleepers(ctx, 1) }()
	select {
	case r := <-res:
		cancel()
		<-asleep
		return 0, &r
	case err := <-asleep:
		require.NoError(t, err, "the waiter neither slept nor returned")
		at, ok := clk.NextWake()
		require.True(t, ok)
		return at, nil
	}
}

// expectedWait computes, from the model, when a Wait for cost sent at t0
// is admitted, when it goes on, and with which Decision.
func expectedWait(lc limitCase, hist []admission, t0, cost int64) (admitAt, goOn int64, d ratelimit.Decision) {
	d = replayModel(lc.newModel, hist).Step(t0, cost)
	admitAt = t0
	if !d.Allowed {
		admitAt = t0 + int64(d.RetryAfter)
		d = replayModel(lc.newModel, hist).Step(admitAt, cost)
	}
	return admitAt, admitAt + int64(d.Delay), lc.want(d)
}

func TestWaitAdmitsAtTheEarliestInstant(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				lc := drawLimitCase(t, a)
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(lc.rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				model := lc.newModel()
				hist := waitTrace(t, lc, clk, lim, model)
				cost := drawCostWithin(t, lc.capMilli, "cost")
				t0 := int64(clk.Now())
				admitAt, goOn, want := expectedWait(lc, hist, t0, int64(cost))
				require.True(t, want.Allowed, "the model never admits cost %d", cost)

				res := startWait(context.Background(), lim, clk, cost)
				var wakes []time.Duration
				var r *waitResult
				for {
					at, done := nextWake(t, clk, res)
					if done != nil {
						r = done
						break
					}
					wakes = append(wakes, at)
					require.LessOrEqual(t, len(wakes), 2, "woke more than twice with nothing else arriving: %v", wakes)
					clk.Set(at)
				}
				require.NoError(t, r.err)
				assert.Equal(t, want, r.d)
				assert.Equal(t, time.Duration(goOn), r.at, "went on at the wrong instant")
				switch {
				case goOn == t0:
					assert.Empty(t, wakes)
				case admitAt == t0 || admitAt == goOn:
					assert.Equal(t, []time.Duration{time.Duration(goOn)}, wakes)
				default: // a leaky bucket: retry, then the queue's Delay
					assert.Equal(t, []time.Duration{time.Duration(admitAt), time.Duration(goOn)}, wakes)
				}
				// The limiter spent exactly what the model spent for it.
				model = replayModel(lc.newModel, append(hist, admission{admitAt, int64(cost)}))
				probe := drawCostWithin(t, lc.capMilli, "probe")
				got, err := lim.Check(probe)
				require.NoError(t, err)
				assert.Equal(t, lc.want(model.Step(goOn, int64(probe))), got)
			})
		})
	}
}

func TestWaitCancelledSpendsNothing(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				lc := drawLimitCase(t, a)
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(lc.rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				model := lc.newModel()
				hist := waitTrace(t, lc, clk, lim, model)
				cost := drawCostWithin(t, lc.capMilli, "cost")
				t0 := int64(clk.Now())
				admitAt, goOn, _ := expectedWait(lc, hist, t0, int64(cost))
				if goOn == t0 {
					t.Skip("admitted at once: nothing to cancel")
				}
				ctx, cancel := context.WithCancel(context.Background())
				res := startWait(ctx, lim, clk, cost)
				wakes := 0
				if admitAt > t0 && admitAt < goOn && rapid.Bool().Draw(t, "cancelInQueue") {
					// A leaky bucket's waiter, cancelled after it has been
					// admitted into the queue: it stays spent.
					at, done := nextWake(t, clk, res)
					require.Nil(t, done)
					require.Equal(t, time.Duration(admitAt), at)
					clk.Set(at)
					wakes++
				}
				at, done := nextWake(t, clk, res)
				require.Nil(t, done, "returned before its time")
				if wakes == 0 && admitAt > t0 {
					require.Equal(t, time.Duration(admitAt), at)
				} else {
					require.Equal(t, time.Duration(goOn), at)
				}
				// Move the clock partway (never to the wake) before cancelling.
				clk.Set(time.Duration(rapid.Int64Range(int64(clk.Now()), int64(at)-1).Draw(t, "cancelAt")))
				cancel()
				r := receive(t, res, "the waiter to return")
				require.ErrorIs(t, r.err, context.Canceled)
				assert.Zero(t, clk.Sleepers(), "a cancelled waiter must leave the clock")
				// A waiter admitted into a leaky bucket's queue (at once, or
				// when its retry came) stays spent; any other spent nothing.
				queued := admitAt < goOn && (admitAt == t0 || wakes > 0)
				if queued {
					assert.True(t, r.d.Allowed, "a Wait cancelled in the queue must report its admission")
					hist = append(hist, admission{admitAt, int64(cost)})
				} else {
					assert.False(t, r.d.Allowed, "a cancelled Wait must report that it spent nothing")
				}
				now := int64(clk.Now())
				probe := drawCostWithin(t, lc.capMilli, "probe")
				got, err := lim.Check(probe)
				require.NoError(t, err)
				assert.Equal(t, lc.want(replayModel(lc.newModel, hist).Step(now, int64(probe))), got)
			})
		})
	}
}

// queueOf returns a leaky bucket of 5/s, capacity 10, on a fresh clock.
func queueOf(t *testing.T) (*ratelimit.ManualClock, ratelimit.Limiter) {
	clk := ratelimit.NewManualClock(0)
	lim, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(5), Capacity: 10}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	return clk, lim
}

func TestWaitVectors(t *testing.T) {
	t.Run("token bucket 5/s burst 10: the 11th waits 200 ms", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(5), Burst: 10}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for range 10 {
			d, err := bounded(t, "a Wait with the burst in hand", func() (ratelimit.Decision, error) {
				return lim.Wait(context.Background(), ratelimit.Unit)
			})
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		res := startWait(context.Background(), lim, clk, ratelimit.Unit)
		at, done := nextWake(t, clk, res)
		require.Nil(t, done)
		assert.Equal(t, 200*time.Millisecond, at)
		clk.Set(at)
		r := receive(t, res, "the waiter to return")
		require.NoError(t, r.err)
		assert.Equal(t, ratelimit.Decision{Allowed: true, Limit: 10, ResetAfter: 2 * time.Second, At: at, Window: 2 * time.Second}, r.d)
	})
	t.Run("leaky bucket 5/s capacity 10: waiters go on 200 ms apart", func(t *testing.T) {
		clk, lim := queueOf(t)
		for i := range 10 {
			res := startWait(context.Background(), lim, clk, ratelimit.Unit)
			if i > 0 {
				at, done := nextWake(t, clk, res)
				require.Nil(t, done)
				assert.Equal(t, time.Duration(i)*200*time.Millisecond, at)
				clk.Set(at)
			}
			r := receive(t, res, "the waiter to return")
			require.NoError(t, r.err)
			assert.Equal(t, time.Duration(i)*200*time.Millisecond, r.at)
			// Each was admitted when it asked, with the queue ahead of it
			// as its Delay: one more each time, less what left meanwhile.
			assert.Equal(t, 200*time.Millisecond*time.Duration(min(i, 1)), r.d.Delay, "waiter %d", i)
		}
	})
}

func TestWaitDeadline(t *testing.T) {
	hour := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Hour)
	}
	t.Run("a denial longer than the deadline gives up at once", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		_, err = lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		ctx, cancel := hour()
		defer cancel()
		clk.Advance(time.Minute) // 59 minutes to go: fits
		res := startWait(ctx, lim, clk, ratelimit.Unit)
		at, done := nextWake(t, clk, res)
		require.Nil(t, done)
		require.Equal(t, time.Hour, at)
		clk.Set(at)
		require.NoError(t, receive(t, res, "the waiter to return").err)

		d, err := bounded(t, "a Wait that cannot meet its deadline", func() (ratelimit.Decision, error) {
			return lim.Wait(ctx, ratelimit.Unit) // an hour and more to go: does not fit
		})
		require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.False(t, d.Allowed)
		assert.Equal(t, time.Hour, d.RetryAfter)
		assert.Zero(t, clk.Sleepers())
	})
	t.Run("a leaky bucket's Delay within the deadline is waited out", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 3}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		_, err = lim.Check(ratelimit.Unit) // goes on at once; the queue is busy for an hour
		require.NoError(t, err)
		ctx, cancel := hour()
		defer cancel()
		clk.Advance(time.Second)
		res := startWait(ctx, lim, clk, ratelimit.Unit) // goes on in 59:59: fits
		at, done := nextWake(t, clk, res)
		require.Nil(t, done)
		require.Equal(t, time.Hour, at)
		clk.Set(at)
		r := receive(t, res, "the waiter to return")
		require.NoError(t, r.err)
		assert.Equal(t, time.Hour-time.Second, r.d.Delay)
	})
	t.Run("a leaky bucket's queue slot beyond the deadline is not taken", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 3}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for range 2 {
			d, err := lim.Check(ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		ctx, cancel := hour()
		defer cancel()
		d, err := lim.Wait(ctx, ratelimit.Unit) // admissible now, but it would go on in 2 h
		require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
		assert.False(t, d.Allowed)
		assert.Zero(t, d.Delay)
		// Nothing was queued: one more still fits.
		d, err = lim.Check(ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, 2*time.Hour, d.Delay)
	})
	t.Run("a denied leaky request counts the Delay it would queue for", func(t *testing.T) {
		clk := ratelimit.NewManualClock(0)
		lim, err := ratelimit.New(ratelimit.LeakyBucket{Rate: ratelimit.PerMinute(1), Capacity: 2}, ratelimit.WithClock(clk))
		require.NoError(t, err)
		for range 2 {
			_, err := lim.Check(ratelimit.Unit)
			require.NoError(t, err)
		}
		// Full: admitted in 1 min, then queued for another minute behind
		// the second request. Two minutes do not fit in 90 s.
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		d, err := bounded(t, "a Wait that cannot meet its deadline", func() (ratelimit.Decision, error) {
			return lim.Wait(ctx, ratelimit.Unit)
		})
		require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
		assert.Equal(t, time.Minute, d.RetryAfter)
		assert.Zero(t, clk.Sleepers())
	})
	t.Run("a context already done spends nothing", func(t *testing.T) {
		_, lim := queueOf(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d, err := bounded(t, "a Wait on a cancelled context", func() (ratelimit.Decision, error) {
			return lim.Wait(ctx, ratelimit.Unit)
		})
		require.ErrorIs(t, err, context.Canceled)
		assert.False(t, d.Allowed)
		d, err = lim.Check(10 * ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "the whole capacity is still there")
	})
}

func TestWaitCostErrors(t *testing.T) {
	_, lim := queueOf(t)
	for _, tc := range []struct {
		cost ratelimit.Units
		want error
	}{{0, ratelimit.ErrInvalidCost}, {-5, ratelimit.ErrInvalidCost}, {10*ratelimit.Unit + 1, ratelimit.ErrCostExceedsCapacity}} {
		d, err := bounded(t, "a Wait with a bad cost", func() (ratelimit.Decision, error) {
			return lim.Wait(context.Background(), tc.cost)
		})
		require.ErrorIs(t, err, tc.want)
		assert.Equal(t, int64(10), d.Limit)
		assert.False(t, d.Allowed)
	}
}

func TestWaitLeakyCancelBehindOthersKeepsTheSlot(t *testing.T) {
	clk, lim := queueOf(t)
	_, err := lim.Check(ratelimit.Unit) // goes on at 0; the next at 200 ms
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	res := startWait(ctx, lim, clk, ratelimit.Unit)
	at, done := nextWake(t, clk, res)
	require.Nil(t, done)
	require.Equal(t, 200*time.Millisecond, at)
	// Someone queues behind the waiter: its slot can no longer be taken
	// back without moving that request forward.
	d, err := lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	require.Equal(t, 400*time.Millisecond, d.Delay)
	cancel()
	r := receive(t, res, "the waiter to return")
	require.ErrorIs(t, r.err, context.Canceled)
	assert.True(t, r.d.Allowed, "the slot stays spent, and the Decision says so")
	d, err = lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, 600*time.Millisecond, d.Delay)
}

// TestWaitManyWaiters runs many goroutines waiting on one limiter of each
// kind on virtual time, moving the clock to each next wake-up, and checks
// that every waiter is served, that the admissions equal the model's for
// the same sequence, and that no waiter went on before its Delay.
func TestWaitManyWaiters(t *testing.T) {
	for _, a := range testedAlgorithms {
		t.Run(a.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				// A milli-unit takes at least 1 ns, so that the leaky
				// bucket's Delays at one instant differ and show the order
				// of the queue.
				lc := drawLimitCaseWhere(t, a, func(r ratelimit.Rate) bool { return int64(r.Per) >= r.Count*1000 })
				clk := ratelimit.NewManualClock(0)
				lim, err := ratelimit.New(lc.rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				waiters := rapid.IntRange(1, 12).Draw(t, "waiters")
				costs := make([]ratelimit.Units, waiters)
				for i := range costs {
					costs[i] = drawCostWithin(t, lc.capMilli, "cost")
				}
				type served struct {
					d  ratelimit.Decision
					at time.Duration
				}
				results := make([]served, waiters)
				done := make(chan struct{}, waiters)
				for i := range waiters {
					go func() {
						defer func() { done <- struct{}{} }()
						d, err := lim.Wait(context.Background(), costs[i])
						assert.NoError(t, err)
						results[i] = served{d, clk.Now()}
					}()
				}
				driveWaiters(t, clk, waiters, done)
				// Replay the admissions, in order of admission, on the model.
				model := lc.newModel()
				order := make([]int, waiters)
				for i := range order {
					order[i] = i
				}
				admitted := func(i int) int64 { return int64(results[i].at - results[i].d.Delay) }
				sortBy(order, func(a, b int) bool {
					if admitted(a) != admitted(b) {
						return admitted(a) < admitted(b)
					}
					// At one instant the leaky bucket's queue order shows in
					// the Delays; elsewhere any order of equal instants works
					// as the model checks each.
					return results[a].d.Delay < results[b].d.Delay
				})
				for _, i := range order {
					r := results[i]
					want := model.Step(admitted(i), int64(costs[i]))
					require.True(t, r.d.Allowed)
					require.True(t, want.Allowed, "waiter %d admitted at %v where the model denies", i, admitted(i))
					require.Equal(t, want.Delay, r.d.Delay)
				}
			})
		})
	}
}

// driveWaiters runs virtual time for n goroutines that sleep on clk and
// report on done when they finish: whenever every goroutine still running is
// asleep, it moves the clock to the next wake-up. Time never moves while one
// of them is between two sleeps, so each sees the instant it was woken at.
func driveWaiters(t require.TestingT, clk *ratelimit.ManualClock, n int, done <-chan struct{}) {
	for live := n; live > 0; {
		ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
		asleep := make(chan error, 1)
		go func(n int) { asleep <- clk.BlockUntilSleepers(ctx, n) }(live)
		select {
		case <-done:
			live--
			cancel()
			<-asleep
		case err := <-asleep:
			cancel()
			require.NoError(t, err, "waiting for %d waiters to sleep or return: some neither slept nor returned", live)
			at, ok := clk.NextWake()
			require.True(t, ok)
			clk.Set(at)
		}
	}
}

// sortBy is an insertion sort: the slices here are tiny.
func sortBy(s []int, less func(a, b int) bool) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && less(s[j], s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// realClock is a Clock this package knows nothing about: Wait falls back to
// real timers for it.
type realClock struct{ start time.Time }

func (c realClock) Now() time.Duration { return time.Since(c.start) }

func TestWaitOnRealClocks(t *testing.T) {
	for name, clk := range map[string]ratelimit.Clock{
		"SystemClock": ratelimit.SystemClock(),
		"custom":      realClock{time.Now()},
	} {
		for _, rule := range []ratelimit.Rule{
			ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1}, // lock-free
			ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1000), Burst: 1},
			ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1000), Capacity: 3},
		} {
			lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			start := time.Now()
			for range 3 {
				d, err := bounded(t, "a Wait on a real clock", func() (ratelimit.Decision, error) {
					return lim.Wait(context.Background(), ratelimit.Unit)
				})
				require.NoError(t, err, "%s %T", name, rule)
				require.True(t, d.Allowed)
			}
			// Three requests at 1000/s with nothing in hand: at least 2 ms.
			assert.GreaterOrEqual(t, time.Since(start), 2*time.Millisecond, "%s %T", name, rule)
		}
	}
	// Cancellation reaches a waiter on a real timer.
	lim, err := ratelimit.New(ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1}, ratelimit.WithClock(realClock{time.Now()}))
	require.NoError(t, err)
	_, _ = lim.Check(ratelimit.Unit)
	ctx, cancel := context.WithCancel(context.Background())
	res := startWait(ctx, lim, ratelimit.SystemClock(), ratelimit.Unit)
	cancel()
	r := receive(t, res, "the waiter to return")
	assert.True(t, errors.Is(r.err, context.Canceled))
}
