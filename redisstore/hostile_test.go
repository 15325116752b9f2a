package redisstore

import (
	"context"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHostileKeys(t *testing.T) {
	rdb := needRedis(t)
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 1, Window: 100 * year}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	big := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range big {
		big[i] = byte(r.UintN(256))
	}
	keys := []string{"", "{", "}", "{}", "}{", "a{b}c", "\x00", "\x00\xff\xfe", "ключ", " ", "\r\n", strings.Repeat("{x}", 1000), string(big)}
	shape := regexp.MustCompile(`^` + regexp.QuoteMeta(s.keyHead) + `[0-9a-f]{32}\}$`)
	seen := map[string]bool{}
	for _, k := range keys {
		rk := s.Key(k)
		assert.Regexp(t, shape, rk, "the hash tag is hex only, whatever the key")
		assert.False(t, seen[rk], "two keys share a Redis key")
		seen[rk] = true
		d, err := s.Check(k, ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "first check of %.20q", k)
	}
	// Each key has its own allowance: the second check of each is denied.
	for _, k := range keys {
		d, err := s.Check(k, ratelimit.Unit)
		require.NoError(t, err)
		assert.False(t, d.Allowed, "second check of %.20q", k)
	}
}

// TestTamperedState writes states no check or settlement could have
// produced into keys and requires each check on them to be denied with
// ErrInvalidState, whatever the failure policy, without writing anything
// or tripping the circuit; the Machine refuses them too. States in debt up
// to the bound a settlement may leave are accepted, on every path, and
// decided as the Machine decides; just beyond it they are refused.
// movedIn is a fixed window's count in the window after the key's latest
// instant, as a plan's move writes it (see ratelimit.MoveState).
const movedIn = "1780000000000000000 1780000001 1"

func TestTamperedState(t *testing.T) {
	const tatZero, instantsZero = "1780000000000000000 0 0", "0 0 0"
	rdb := needRedis(t)
	ctx := context.Background()
	const now = int64(unixNow)
	rules := map[string]ratelimit.Rule{
		"gcra":   ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5},
		"fixed":  ratelimit.FixedWindow{Limit: 5, Window: time.Second},
		"window": ratelimit.SlidingCounter{Limit: 5, Window: time.Second},
		"log":    ratelimit.SlidingLog{Limit: 5, Window: time.Second},
		"sub":    ratelimit.SubWindow{Limit: 5, Window: 3 * time.Second, Buckets: 3},
		"subr":   ratelimit.SubWindow{Limit: 5, Window: 3 * time.Second, Buckets: 3, CountRefused: true},
		"subx":   ratelimit.SubWindow{Limit: 5, Window: 4500, Buckets: 3}, // the exact path's windows
	}
	tests := []struct {
		rule, state string
		// debt: the state is within what Settle may leave (up to twice the
		// limit in use): the Machine and the scripts accept it.
		debt bool
	}{
		{"gcra", "abc", false},
		{"gcra", " ", false},
		{"gcra", "1  2 3", false},
		{"gcra", " 1 2 3", false},
		{"gcra", "1 2 3 ", false},
		{"gcra", "-1 0 0", false},
		{"gcra", "01 0 0", false},
		{"gcra", "1e18 0 0", false},
		{"gcra", "1 2", false},
		{"gcra", "1 2 3 4", false},
		{"gcra", "1 9223372036854775807 0", false},                   // a huge TAT
		{"gcra", "1 9223372036854775808 0", false},                   // beyond int64
		{"gcra", "1 99999999999999999999999999999 0", false},         // far beyond
		{"gcra", "1780000000000000000 1780000000500000001 0", true},  // more than the burst's span ahead
		{"gcra", "1780000000000000000 1780000001000000000 0", true},  // twice the burst's span ahead: the bound
		{"gcra", "1780000000000000000 1780000001000000001 0", false}, // beyond it
		{"gcra", "1780000000000000000 1780000001000000000 1", false}, // beyond it by a fraction
		{"gcra", "1 2 1", false},                                     // a fraction with a pace of n = 1
		{"gcra", "1780000000000000000 01 0", false},                  // a TAT before now, not canonical
		{"gcra", "1780000000000000000 0780000000000000000 0", false}, // as long as now, before it, not canonical
		{"gcra", "1780000000000000000 1 0", true},                    // a TAT long before now
		{"gcra", "1780000000000000000 1779999999999999999 0", true},  // a TAT just before now
		{"gcra", tatZero, true},                                      // a TAT of 0
		{"gcra", instantsZero, true},                                 // instants of 0
		{"gcra", "4611686018427387905 0 0", false},                   // the latest instant beyond MaxTime
		{"fixed", "1780000000000000000 1780000000 5001", true},       // above the limit
		{"fixed", "1780000000000000000 1780000000 10000", true},      // twice the limit
		{"fixed", "1780000000000000000 1780000000 10001", false},     // beyond it
		{"fixed", movedIn, true},                                     // the next window: a count a plan's move put there
		{"fixed", "1780000000000000000 1780000002 1", false},         // a later window
		{"window", "1780000000000000000 1780000000 0 5001", true},
		{"window", "1780000000000000000 1780000000 10000 10000", true},
		{"window", "1780000000000000000 1780000000 0 10001", false},
		{"window", "1780000000000000000 1780000000 10001 0", false},
		{"window", "1780000000000000000 1780000000 1 2 3", false},
		{"log", "1780000000000000000 1 1000 1 1000", false},                                    // not increasing
		{"log", "1780000000000000000 2 1000 1 1000", false},                                    // decreasing
		{"log", "1780000000000000000 1 0", false},                                              // a zero cost
		{"log", "1780000000000000000 1 1000 2", false},                                         // not pairs
		{"log", "1780000000000000000 1780000000000000001 1000", false},                         // later than the latest instant
		{"log", "1780000000000000000 1779999999999999999 6000", true},                          // above the limit
		{"log", "1780000000000000000 1779999999999999998 3000 1779999999999999999 3000", true}, // inside above the limit
		{"log", "1780000000000000000 1779999999999999999 10000", true},
		{"log", "1780000000000000000 1779999999999999999 10001", false},
		{"log", "1780000000000000000 1779999999999999998 5000 1779999999999999999 5001", false},
		{"log", "1780000000000000000 1778999999999999999 10000 1779999999999999999 10000", true}, // the first has left
		{"sub", "1780000000000000000 1780000000 0 0", false},                                     // a count short
		{"sub", "1780000000000000000 1780000000 0 0 0 0", false},                                 // a count over
		{"sub", "1780000000000000000 1780000001 0 0 0", false},                                   // a later bucket
		{"sub", "1780000000000000000 01 0 0 0", false},                                           // not canonical
		{"sub", "1780000000000000000 1780000000 0 0 5001", true},                                 // a bucket above the limit
		{"sub", "1780000000000000000 1780000000 3000 3000 0", true},                              // the window above the limit
		{"sub", "1780000000000000000 1780000000 5000 0 5000", true},
		{"sub", "1780000000000000000 1780000000 5000 0 5001", false},
		{"sub", "1780000000000000000 1780000000 0 0 10001", false},
		{"sub", "5 1 1000 0 0", false},                                     // a bucket before the origin
		{"subr", "1780000000000000000 1780000000 5001 0 0", true},          // a bucket above the limit
		{"subr", "1780000000000000000 1780000000 10000 10000 10000", true}, // refusals counted: only each count bounded
		{"subr", "1780000000000000000 1780000000 10001 0 0", false},
		{"subr", "5 1 1000 0 0", false},                               // a bucket before the origin
		{"subx", "1780000000000000000 1186666666666667 0 0 0", false}, // a later bucket
		{"subx", "1780000000000000000 1186666666666666 3000 3000 0", true},
		{"subx", "1780000000000000000 1186666666666666 0 5001 0", true},
		{"subx", "1780000000000000000 1186666666666666 5000 5001 0", false},
		{"subx", "1780000000000000000 1186666666666666 0 10001 0", false},
		{"subx", "5 1 1000 0 0", false},
	}
	for _, tc := range tests {
		if !tc.debt {
			continue
		}
		m, _ := ratelimit.NewMachine(rules[tc.rule])
		want, next, merr := m.Step([]byte(tc.state), time.Duration(now), ratelimit.Unit, true)
		require.NoError(t, merr, "the Machine refuses the debt %s %q", tc.rule, tc.state)
		for _, script := range []*redis.Script{nil, fastScript, exactScript} {
			clk := ratelimit.NewManualClock(time.Duration(now))
			s, err := New(rdb, rules[tc.rule], WithClock(clk), WithPrefix(testPrefix()))
			require.NoError(t, err)
			if script != nil {
				s.script = script
			}
			key := s.Key("k")
			require.NoError(t, rdb.Set(ctx, key, tc.state, time.Hour).Err())
			d, err := s.Check("k", ratelimit.Unit)
			if script == fastScript && (tc.rule == "subx" || tc.state == movedIn || tc.state == tatZero || tc.state == instantsZero) {
				// Its buckets are not whole microseconds: the fast path
				// declines them, whatever the state; it leaves a count a
				// move put in the next window to the exact path, and a
				// bucket's state with an instant of 0.
				require.ErrorContains(t, err, declined)
				continue
			}
			require.NoError(t, err, "%s %q", tc.rule, tc.state)
			assert.Equal(t, want, d, "%s %q", tc.rule, tc.state)
			got, err := rdb.Get(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, string(next), got, "%s %q", tc.rule, tc.state)
			assert.Zero(t, s.Stats().InvalidStates+s.Stats().Mismatches)
		}
	}
	for _, mode := range []FailureMode{FailOpen, FailClosed} {
		for _, tc := range tests {
			if tc.debt {
				continue
			}
			clk := ratelimit.NewManualClock(time.Duration(now))
			s, err := New(rdb, rules[tc.rule], WithClock(clk), WithPrefix(testPrefix()), WithFailureMode(mode))
			require.NoError(t, err)
			key := s.Key("k")
			require.NoError(t, rdb.Set(ctx, key, tc.state, time.Hour).Err())
			d, err := s.Check("k", ratelimit.Unit)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "%s %q", tc.rule, tc.state)
			assert.False(t, d.Allowed, "%s %q admitted", tc.rule, tc.state)
			got, gerr := rdb.Get(ctx, key).Result()
			require.NoError(t, gerr)
			assert.Equal(t, tc.state, got, "the script wrote over a corrupted state")
			// The same state is refused by the Machine too.
			m, _ := ratelimit.NewMachine(rules[tc.rule])
			_, _, merr := m.Step([]byte(tc.state), time.Duration(now), ratelimit.Unit, true)
			assert.ErrorIs(t, merr, ratelimit.ErrInvalidState, "the Machine accepts %q", tc.state)
			assert.Equal(t, uint64(1), s.Stats().InvalidStates)
			assert.Zero(t, s.Stats().Failures)
			assert.False(t, s.br.one.open())
		}
	}
}

// TestExtremeValidState: a state at the very edge of what the rule allows
// (the TAT a whole burst ahead, at MaxTime) decides as the Machine does.
func TestExtremeValidState(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.GCRA{Rate: ratelimit.Rate{Count: 1_000_000_000_000_000, Per: 99 * year}, Burst: 1_000_000_000_000_000}
	clk := ratelimit.NewManualClock(ratelimit.MaxTime)
	s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	p := s.Params()
	m, _ := ratelimit.NewMachine(rule)
	last := int64(ratelimit.MaxTime)
	state := strings.Join([]string{i64(last), i64(last + int64(p.TauNanos)), u(p.TauFrac)}, " ")
	require.NoError(t, rdb.Set(ctx, s.Key("k"), state, time.Hour).Err())
	want, _, err := m.Step([]byte(state), ratelimit.MaxTime, ratelimit.Unit, true)
	require.NoError(t, err)
	got, err := s.Check("k", ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.False(t, got.Allowed)
}

// TestLastInstantStates: a bucket whose bound on the schedule (twice the
// capacity's span past the key's latest instant) falls 3 ns short of the
// largest int64: states with their schedule in the last 10 int64 instants, on
// either side of the bound and at it, are accepted and decided by the
// scripts as by the Machine, or refused by both.
func TestLastInstantStates(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	rule := ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: 1000, Per: 2481125}, Burst: 999999999999989}
	m, err := ratelimit.NewMachine(rule)
	require.NoError(t, err)
	p := m.Params()
	bn, bf := 2*p.TauNanos, 2*p.TauFrac
	if bf >= p.RateUnits {
		bn, bf = bn+1, bf-p.RateUnits
	}
	// The check's instant, a ns after the state's: a script that wrote
	// over a state it should refuse would leave a changed value.
	bound := int64(math.MaxInt64 - 3)
	now := bound - int64(bn)
	last := now - 1
	require.LessOrEqual(t, now, int64(ratelimit.MaxTime))
	accepted, refused := 0, 0
	for k := int64(0); k < 10; k++ {
		tat := int64(math.MaxInt64) - k
		for _, f := range []uint64{0, bf, bf + 1, p.RateUnits - 1, p.RateUnits} {
			state := strings.Join([]string{i64(last), i64(tat), u(f)}, " ")
			valid := f < p.RateUnits && (tat < bound || (tat == bound && f <= bf))
			want, next, merr := m.Step([]byte(state), time.Duration(now), ratelimit.Unit, true)
			if !valid {
				refused++
				require.ErrorIs(t, merr, ratelimit.ErrInvalidState, "the Machine accepts %q", state)
			} else {
				accepted++
				require.NoError(t, merr, "the Machine refuses %q", state)
			}
			for _, script := range []*redis.Script{nil, fastScript, exactScript} {
				clk := ratelimit.NewManualClock(time.Duration(now))
				s, err := New(rdb, rule, WithClock(clk), WithPrefix(testPrefix()), WithDenyCache(0))
				require.NoError(t, err)
				if script != nil {
					s.script = script
				}
				key := s.Key("k")
				require.NoError(t, rdb.Set(ctx, key, state, time.Hour).Err())
				d, err := s.Check("k", ratelimit.Unit)
				if script == fastScript {
					// The capacity's span is beyond the fast path's range.
					require.ErrorContains(t, err, declined)
					continue
				}
				got, gerr := rdb.Get(ctx, key).Result()
				require.NoError(t, gerr)
				if !valid {
					require.ErrorIs(t, err, ratelimit.ErrInvalidState, "%q", state)
					assert.False(t, d.Allowed)
					assert.Equal(t, state, got, "the script wrote over a refused state")
					continue
				}
				require.NoError(t, err, "%q", state)
				assert.Equal(t, want, d, "%q", state)
				assert.Equal(t, string(next), got, "%q", state)
				assert.Zero(t, s.Stats().InvalidStates+s.Stats().Mismatches)
			}
		}
	}
	require.NotZero(t, accepted)
	require.NotZero(t, refused)
}

// TestExpiry: the state's TTL covers its ResetAfter plus the margin.
func TestExpiry(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	s, err := New(rdb, ratelimit.GCRA{Rate: ratelimit.PerMinute(1), Burst: 10}, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(2*time.Second))
	require.NoError(t, err)
	var d ratelimit.Decision
	for range 3 {
		d, err = s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	require.Equal(t, 3*time.Minute, d.ResetAfter)
	ttl, err := rdb.PTTL(ctx, s.Key("k")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, ttl, d.ResetAfter+2*time.Second)
	assert.Greater(t, ttl, d.ResetAfter+time.Second)
}

// TestSubWindowExpiry: on either path, a sub-window state's TTL covers its
// ResetAfter plus the margin, admitted or refused.
func TestSubWindowExpiry(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	for _, w := range []time.Duration{3 * time.Second, 4500} {
		for _, script := range []*redis.Script{fastScript, exactScript} {
			clk := ratelimit.NewManualClock(unixNow + w/7)
			s, err := New(rdb, ratelimit.SubWindow{Limit: 3, Window: w, Buckets: 3}, WithClock(clk), WithPrefix(testPrefix()), WithExpiryMargin(2*time.Second), WithDenyCache(0))
			require.NoError(t, err)
			s.script = script
			for i := range 6 {
				d, err := s.Check("k", ratelimit.Unit)
				if err != nil {
					require.ErrorContains(t, err, declined)
					continue
				}
				assert.Equal(t, i < 3, d.Allowed, "check %d", i)
				ttl, err := rdb.PTTL(ctx, s.Key("k")).Result()
				require.NoError(t, err)
				assert.GreaterOrEqual(t, ttl, d.ResetAfter+time.Second, "check %d", i)
				assert.LessOrEqual(t, ttl, d.ResetAfter+3*time.Second, "check %d", i)
				if i >= 3 {
					clk.Advance(w / 3)
				}
			}
		}
	}
}
