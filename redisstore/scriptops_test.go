package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestHotKeyCheckAndRefund: 64 goroutines check one key and refund most
// of what they are admitted, time standing still. No refund fails (none
// conflicts with the checks around it), each gives back all it was asked,
// and the key ends holding exactly what was kept, at most the burst: the
// same Decisions, to the last admission, as the in-process store after
// the same net spending.
func TestHotKeyCheckAndRefund(t *testing.T) {
	rdb := needRedis(t)
	for name, rule := range map[string]ratelimit.Rule{
		"gcra":                          ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 40},
		"token bucket":                  ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 40},
		"leaky bucket":                  ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 40},
		"fixed window":                  ratelimit.FixedWindow{Limit: 40, Window: time.Hour},
		"sliding counter":               ratelimit.SlidingCounter{Limit: 40, Window: time.Hour},
		"sliding counter, CountRefused": ratelimit.SlidingCounter{Limit: 40, Window: time.Hour, CountRefused: true},
		"sliding log":                   ratelimit.SlidingLog{Limit: 40, Window: time.Hour},
		"sub-window":                    ratelimit.SubWindow{Limit: 40, Window: time.Hour, Buckets: 6},
		"sub-window, CountRefused":      ratelimit.SubWindow{Limit: 40, Window: time.Hour, Buckets: 60, CountRefused: true},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow) // time stands still
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithTimeout(10*time.Second))
			require.NoError(t, err)
			local, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			run := func(l interface {
				Check(string, ratelimit.Units) (ratelimit.Decision, error)
				Refund(string, ratelimit.Units, time.Duration) (ratelimit.Units, error)
			}) (kept int64) {
				var nk, errs atomic.Int64
				var wg sync.WaitGroup
				for w := range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range 12 {
							d, err := l.Check("hot", ratelimit.Unit)
							if err != nil {
								errs.Add(1)
								return
							}
							if !d.Allowed {
								continue
							}
							if (w+i)%4 == 0 {
								nk.Add(1)
								continue
							}
							g, err := l.Refund("hot", ratelimit.Unit, d.At)
							if err != nil || g != ratelimit.Unit {
								t.Errorf("refund gave back %d: %v", g, err)
								errs.Add(1)
								return
							}
						}
					}()
				}
				wg.Wait()
				require.Zero(t, errs.Load(), "failed checks or refunds")
				return nk.Load()
			}
			kept := run(s)
			assert.LessOrEqual(t, kept, int64(40), "more kept than the burst")
			// The same net spending in process: kept admissions.
			for range kept {
				d, err := local.Check("hot", ratelimit.Unit)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			sameFromHere(t, s, local, "hot")
			st := s.Stats()
			assert.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
		})
	}
}

// TestScriptOpsOnServerTime: refunds and settlements with the server's
// clock, on every algorithm. Each is computed by the script at the instant Redis
// read and checked by the store against the rule's Machine on the state
// and instant the script read (a disagreement is an error), so a sequence
// of checks, refunds and settlements that all succeed has decided exactly
// as the Machine does. The same runs with the client clock in
// TestSameDecisionsAsInProcess, against the in-process limiters.
func TestScriptOpsOnServerTime(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		rule := drawRule(t)
		s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		p := s.Params()
		var ats []time.Duration
		at := func(t *rapid.T) time.Duration { return drawAt(t, ats) }
		t.Repeat(map[string]func(*rapid.T){
			"check": func(t *rapid.T) {
				d, err := s.Check("k", drawCost(t, p.Capacity))
				require.NoError(t, err)
				if d.Allowed {
					ats = append(ats, d.At)
				}
			},
			"refund": func(t *rapid.T) {
				_, err := s.Refund("k", drawCost(t, p.Capacity), at(t))
				require.NoError(t, err)
			},
			"settle": func(t *rapid.T) {
				charged := drawCost(t, p.Capacity)
				actual := rapid.OneOf(rapid.Just(charged), rapid.Just(2*p.Capacity), rapid.Just(charged/2+1), rapid.Just(3*charged)).Draw(t, "actual")
				if actual <= 0 {
					actual = 1
				}
				_, _, err := s.Settle("k", charged, actual, at(t))
				require.NoError(t, err)
			},
		})
		st := s.Stats()
		require.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
	})
}

// TestScriptOpsRefuseTamperedStates: a refund or a settlement in the
// script on a state no rule wrote (malformed, or beyond the bounds the
// Machine's decoder sets) fails with ErrInvalidState and writes nothing.
func TestScriptOpsRefuseTamperedStates(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	// now gives the state of the instant unixNow with entries at offsets
	// from it.
	now := func(format string, offsets ...int64) string {
		args := make([]any, len(offsets))
		for i, o := range offsets {
			args[i] = int64(unixNow) + o
		}
		return strconv.FormatInt(int64(unixNow), 10) + fmt.Sprintf(format, args...)
	}
	malformed := []string{"abc", "01 2 3", "1 2 3 4 5 6", "1  2 3", "99999999999999999999 1 1", "1 2", " 1 2 3"}
	for name, tc := range map[string]struct {
		rule ratelimit.Rule
		bad  []string
	}{
		"gcra":            {ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}, []string{"1000 3780000000000000000 0", "1000 2000 30000000000"}},
		"fixed window":    {ratelimit.FixedWindow{Limit: 10, Window: time.Second}, []string{"1000 0 100000", "1000 9999999999 1"}},
		"sliding counter": {ratelimit.SlidingCounter{Limit: 10, Window: time.Second}, []string{"1000 0 100000 0", "1000 0 0 100000", "1000 9999999999 0 1"}},
		// Entries: odd, later than the instant, out of order, repeated, of
		// no cost, above twice the capacity, or live ones holding more.
		"sliding log": {ratelimit.SlidingLog{Limit: 10, Window: time.Second}, []string{
			"1000 5", now(" %d 1", 1), now(" %d 1 %d 1", -5, -5), now(" %d 1 %d 1", -5, -6), now(" %d 0", -5),
			now(" %d 20001", -5), now(" %d 15000 %d 5001", -900, -1), now(" %d 1 %d 15000 %d 5001", -999, -900, -1), "1000 -5 1",
		}},
		// Counts: too few or many, the bucket later than the instant, a
		// count above twice the capacity, a window above it, a count in a
		// bucket before the origin.
		"sub-window": {ratelimit.SubWindow{Limit: 10, Window: 4 * time.Second, Buckets: 4}, []string{
			"1000 0 0 0 0", "1000 0 0 0 0 0 0", fmt.Sprintf("1000 %d 0 0 0 0", unixNow/time.Second+1), "1000000000 1 0 0 0 20001",
			"4000000000 4 0 0 15000 5001", "1000000000 1 0 1 0 0", "1000000000 1 0 0 0 0 ",
		}},
		"sub-window, CountRefused": {ratelimit.SubWindow{Limit: 10, Window: 4 * time.Second, Buckets: 4, CountRefused: true}, []string{
			"1000000000 1 0 0 0 20001", "1000000000 1 0 1 0 0", "1000000000 1 0 0 0",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			s, err := New(rdb, tc.rule, WithClock(clk), WithPrefix(testPrefix()))
			require.NoError(t, err)
			for _, state := range append(malformed, tc.bad...) {
				require.NoError(t, rdb.Set(ctx, s.Key("k"), state, time.Hour).Err())
				_, err := s.Refund("k", ratelimit.Unit, clk.Now())
				assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "refund on %q", state)
				_, _, err = s.Settle("k", ratelimit.Unit, 3*ratelimit.Unit, clk.Now())
				assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "settle on %q", state)
				got, err := rdb.Get(ctx, s.Key("k")).Result()
				require.NoError(t, err)
				assert.Equal(t, state, got, "written over")
			}
			assert.Zero(t, s.Stats().Mismatches)
		})
	}
}

// TestWindowSettleExpiries: a sliding log's and a sub-window's settlements
// that charge set the key's expiry from the Decision of a peek of the cost
// charged just after, as a check would: a peek that a sub-window counts
// refused (CountRefused) or admits counts into the current bucket, which
// then leaves the window last. The script works the expiry out itself, and
// the store refuses one that is not the Machine's (ErrMismatch), so each
// settlement here, in debt and out, before and after the debt's buckets
// move on, must succeed, and the key's TTL is the Decision's ResetAfter
// plus the margin.
func TestWindowSettleExpiries(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for name, rule := range map[string]ratelimit.Rule{
		"sliding log":              ratelimit.SlidingLog{Limit: 10, Window: 4 * time.Second},
		"sub-window":               ratelimit.SubWindow{Limit: 10, Window: 4 * time.Second, Buckets: 4},
		"sub-window, CountRefused": ratelimit.SubWindow{Limit: 10, Window: 4 * time.Second, Buckets: 4, CountRefused: true},
	} {
		t.Run(name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(time.Minute), WithDenyCache(0))
			require.NoError(t, err)
			a, err := s.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			for i, step := range []struct {
				advance        time.Duration
				charged, total ratelimit.Units
			}{
				{0, ratelimit.Unit, 30 * ratelimit.Unit}, // to the debt bound, twice the limit
				{time.Second, ratelimit.Unit, 3 * ratelimit.Unit},
				{time.Second / 2, 2 * ratelimit.Unit, 3 * ratelimit.Unit},
				{3 * time.Second, ratelimit.Unit, 2 * ratelimit.Unit},
				{time.Second, ratelimit.Unit, 2 * ratelimit.Unit},
				{10 * time.Second, ratelimit.Unit, 2 * ratelimit.Unit},
			} {
				clk.Advance(step.advance)
				d, _, err := s.Settle("k", step.charged, step.total, a.At)
				require.NoError(t, err, "step %d", i)
				ttl, err := rdb.PTTL(ctx, s.Key("k")).Result()
				require.NoError(t, err)
				assert.LessOrEqual(t, ttl, d.ResetAfter+time.Minute+time.Millisecond, "step %d", i)
				assert.Greater(t, ttl, d.ResetAfter+time.Minute-10*time.Second, "step %d", i)
			}
			assert.Zero(t, s.Stats().Mismatches)
		})
	}
}
