package redisstore

import (
	"context"
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
			got, err := s.Peek("hot", ratelimit.Unit)
			require.NoError(t, err)
			wantd, err := local.Peek("hot", ratelimit.Unit)
			require.NoError(t, err)
			assert.Equal(t, wantd, got)
			// And from there both admit the same, to the last one.
			for i := 0; ; i++ {
				want, err := local.Check("hot", ratelimit.Unit)
				require.NoError(t, err)
				got, err := s.Check("hot", ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, want, got, "check %d after the net spending", i)
				if !want.Allowed {
					break
				}
			}
			st := s.Stats()
			assert.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
		})
	}
}

// TestScriptOpsOnServerTime: refunds and settlements on a bucket rule, a
// fixed window or a sliding counter with the server's clock. Each is computed by the script at the instant Redis
// read and checked by the store against the rule's Machine on the state
// and instant the script read (a disagreement is an error), so a sequence
// of checks, refunds and settlements that all succeed has decided exactly
// as the Machine does. The same runs with the client clock in
// TestSameDecisionsAsInProcess, against the in-process limiters.
func TestScriptOpsOnServerTime(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		var rule ratelimit.Rule
		for rule == nil {
			r := drawRule(t)
			m, _ := ratelimit.NewMachine(r)
			if p := m.Params(); p.RateUnits != 0 || p.Algorithm == "fixed_window" || p.Algorithm == "sliding_counter" {
				rule = r
			}
		}
		s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		p := s.Params()
		var ats []time.Duration
		at := func(t *rapid.T) time.Duration {
			if len(ats) == 0 || rapid.IntRange(0, 3).Draw(t, "otherAt") == 0 {
				return time.Duration(rapid.Int64Range(0, int64(unixNow)*2).Draw(t, "at"))
			}
			return rapid.SampledFrom(ats).Draw(t, "admittedAt")
		}
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
	malformed := []string{"abc", "01 2 3", "1 2 3 4 5 6", "1  2 3", "99999999999999999999 1 1", "1 2", " 1 2 3"}
	for name, tc := range map[string]struct {
		rule ratelimit.Rule
		bad  []string
	}{
		"gcra":            {ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}, []string{"1000 3780000000000000000 0", "1000 2000 30000000000"}},
		"fixed window":    {ratelimit.FixedWindow{Limit: 10, Window: time.Second}, []string{"1000 0 100000", "1000 9999999999 1"}},
		"sliding counter": {ratelimit.SlidingCounter{Limit: 10, Window: time.Second}, []string{"1000 0 100000 0", "1000 0 0 100000", "1000 9999999999 0 1"}},
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
