package ratelimit_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

// fuzzRule builds a rule of the algorithm testedAlgorithms[kind mod their
// number] from raw numbers: per is the rate's period or the window,
// capacity the burst, capacity or limit. valid says whether the rule's
// numbers are acceptable, computed independently of the library.
func fuzzRule(kind uint8, count, per, capacity int64) (rule ratelimit.Rule, model func() refmodel.Model, valid bool) {
	a := testedAlgorithms[int(kind)%len(testedAlgorithms)]
	s := settings{rate: ratelimit.Rate{Count: count, Per: time.Duration(per)}, capacity: capacity, window: time.Duration(per)}
	return a.rule(s), func() refmodel.Model { return a.model(s) }, a.valid(s)
}

// FuzzRuleValidation: any rule is either rejected with a *RuleError that
// matches ErrInvalidRule, or yields a working limiter; and a rule is
// accepted exactly when its numbers are in range (for a bucket: and its
// burst refills within MaxTime).
func FuzzRuleValidation(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(time.Second), int64(20))
	f.Add(uint8(1), int64(7), int64(3*time.Second), int64(1_000_000))
	f.Add(uint8(2), int64(0), int64(time.Second), int64(1))
	f.Add(uint8(0), int64(1), int64(10*365*24*time.Hour), int64(1_000_000_000_000))
	f.Add(uint8(1), int64(1_000_000_000_000), int64(time.Microsecond), int64(1_000_000_000_000))
	f.Add(uint8(2), int64(-5), int64(-1), int64(-1))
	f.Add(uint8(0), int64(1<<62), int64(1), int64(1<<62))
	f.Add(uint8(3), int64(0), int64(time.Minute), int64(5))
	f.Add(uint8(3), int64(0), int64(1<<62), int64(5))
	f.Add(uint8(4), int64(0), int64(time.Second), int64(10))
	f.Add(uint8(5), int64(0), int64(time.Minute), int64(100))
	f.Fuzz(func(t *testing.T, kind uint8, count, per, capacity int64) {
		rule, _, want := fuzzRule(kind, count, per, capacity)
		lim, err := ratelimit.New(rule, ratelimit.WithClock(ratelimit.NewManualClock(0)))
		if err != nil {
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re), "error %v is not a *RuleError", err)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			require.NotEmpty(t, re.Field)
			require.False(t, want, "rejected a valid rule: %v", err)
			return
		}
		require.True(t, want, "accepted an invalid rule %+v", rule)
		d, err := lim.Check(ratelimit.Units(capacity * 1000))
		require.NoError(t, err)
		require.True(t, d.Allowed, "a fresh key starts full")
		require.Equal(t, capacity, d.Limit)
		_, err = lim.Check(ratelimit.Units(capacity*1000 + 1))
		require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
	})
}

// FuzzOperations plays an arbitrary sequence of clock moves, checks and
// settlements (charged past the limit into debt, or refunded) against a
// limiter and its reference model: every Decision and amount must agree.
func FuzzOperations(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(time.Second), int64(20), []byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), int64(7), int64(3*time.Second), int64(5), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18})
	f.Add(uint8(2), int64(1_000_003), int64(time.Hour), int64(3), []byte("a long trace of clock moves and costs"))
	// A check of 20 and a settlement of it at 40, then another check.
	f.Add(uint8(1), int64(10), int64(time.Second), int64(20), []byte{
		2, 0x1f, 0x4e, 0, 0, 0, 0, 0, 0,
		4, 0x1f, 0x4e, 0, 0, 0x80, 0x02, 0, 0,
		3, 0xe8, 0x03, 0, 0, 0, 0, 0, 0,
	})
	f.Fuzz(func(t *testing.T, kind uint8, count, per, capacity int64, ops []byte) {
		rule, model, _ := fuzzRule(kind, count, per, capacity)
		clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
		lim, err := ratelimit.New(rule, ratelimit.WithClock(clk))
		if err != nil {
			return // validation is FuzzRuleValidation's business
		}
		m := model()
		capMilli := m.Capacity()
		// Each operation is 9 bytes: a selector and a 64-bit operand.
		for ; len(ops) >= 9; ops = ops[9:] {
			v := binary.LittleEndian.Uint64(ops[1:9])
			switch ops[0] % 5 {
			case 0: // a small step
				clk.Advance(time.Duration(v % uint64(2*per)))
			case 1: // a jump of up to ~4.6 years, or backwards by up to one period
				if v&1 == 0 {
					clk.Advance(time.Duration(v >> 1 % (1 << 57)))
				} else {
					clk.Advance(-time.Duration(v >> 1 % uint64(per)))
				}
			case 4: // a settlement of an estimate from the low 32 bits, at the instant from the top 16
				charged := int64(v%(1<<32))%capMilli + 1
				actual := int64(v>>32%(1<<16)) * int64(ratelimit.Unit) / 16
				if v>>48&1 == 1 {
					actual = math.MaxInt64
				}
				actual = max(actual, 1)
				at := time.Duration(v >> 49)
				got, settled, err := ratelimit.Settle(lim, ratelimit.Units(charged), ratelimit.Units(actual), at)
				require.NoError(t, err)
				now := clk.modelNow()
				want, wantSettled := settleModel(m, now, charged, actual, min(int64(at), now))
				want.Window = got.Window
				require.Equal(t, wantSettled, int64(settled), "rule %+v at %d settle %d of %d", rule, now, actual, charged)
				require.Equal(t, want, got, "rule %+v at %d settle %d of %d", rule, now, actual, charged)
			default: // a check
				cost := ratelimit.Units(v%uint64(capMilli+2) + 1)
				got, err := lim.Check(cost)
				if int64(cost) > capMilli {
					require.ErrorIs(t, err, ratelimit.ErrCostExceedsCapacity)
					continue
				}
				require.NoError(t, err)
				want := m.Step(clk.modelNow(), int64(cost))
				want.Window = got.Window // the policy's fields are FuzzRuleValidation's business
				require.Equal(t, want, got, "rule %+v at %d cost %d", rule, clk.seen, cost)
			}
		}
	})
}
