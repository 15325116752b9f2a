package ratelimit_test

import (
	"errors"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// lockModel is a lockout from its definition, for one key: every failure
// counted since the last block, kept as a list of instants, and the blocks
// of the current streak counted, their lengths worked out in math/big.
type lockModel struct {
	rule     ratelimit.LockoutRule
	failures []int64 // instants of the failures counted since the last block
	until    int64   // when the latest block ends
	streak   int64   // blocks in the current streak; 0 before the first
}

func (m *lockModel) decision(now int64) ratelimit.Decision {
	return ratelimit.Decision{Limit: m.rule.Failures, Window: m.rule.Within, Policy: m.rule.Name, At: time.Duration(now)}
}

// counted is how many failures count at now: those in (now - Within, now].
func (m *lockModel) counted(now int64) int64 {
	var n int64
	for _, t := range m.failures {
		if t > now-int64(m.rule.Within) {
			n++
		}
	}
	return n
}

func (m *lockModel) growing() bool { return m.rule.Growth >= 2 }

// length is the length of the streak-th block of a streak: Block x
// Growth^(streak-1), at most MaxBlock, or MaxTime-1 without a MaxBlock.
func (m *lockModel) length(streak int64) int64 {
	limit := big.NewInt(int64(ratelimit.MaxTime) - 1)
	if m.rule.MaxBlock > 0 {
		limit = big.NewInt(int64(m.rule.MaxBlock))
	}
	l := big.NewInt(int64(m.rule.Block))
	if m.growing() {
		l.Mul(l, new(big.Int).Exp(big.NewInt(m.rule.Growth), big.NewInt(streak-1), nil))
	}
	if l.Cmp(limit) > 0 {
		return limit.Int64()
	}
	return l.Int64()
}

// resetAfter: until no failure counts, the block is over and, with growth,
// the streak is forgotten.
func (m *lockModel) resetAfter(now int64) time.Duration {
	end := int64(0)
	for _, t := range m.failures {
		end = max(end, t+int64(m.rule.Within))
	}
	if m.streak > 0 {
		end = max(end, m.until)
		if m.growing() {
			end = max(end, m.until+int64(m.rule.Forget))
		}
	}
	return time.Duration(max(0, end-now))
}

func (m *lockModel) check(now int64) ratelimit.Decision {
	d := m.decision(now)
	if now < m.until {
		d.RetryAfter = time.Duration(m.until - now)
	} else {
		d.Allowed = true
		d.Remaining = m.rule.Failures - m.counted(now)
	}
	d.ResetAfter = m.resetAfter(now)
	return d
}

func (m *lockModel) fail(now int64) (ratelimit.Decision, bool) {
	if now < m.until {
		return m.check(now), false
	}
	m.failures = append(m.failures, now)
	if m.counted(now) < m.rule.Failures {
		return m.check(now), false
	}
	if m.streak > 0 && (!m.growing() || now >= m.until+int64(m.rule.Forget)) {
		m.streak = 0
	}
	m.streak++
	m.until = min(now+m.length(m.streak), int64(ratelimit.MaxTime))
	m.failures = nil
	return m.check(now), now < m.until
}

// drawLockoutRule draws a valid rule, with durations small (so that
// windows and blocks overlap often) or huge (so that blocks saturate).
func drawLockoutRule(t *rapid.T) ratelimit.LockoutRule {
	dur := func(label string, lo int64) time.Duration {
		return time.Duration(rapid.OneOf(
			rapid.Int64Range(lo, 50),
			rapid.Int64Range(int64(ratelimit.MaxTime)/4, int64(ratelimit.MaxTime)-1),
		).Draw(t, label))
	}
	r := ratelimit.LockoutRule{
		Failures: rapid.Int64Range(1, 5).Draw(t, "failures"),
		Within:   dur("within", 1),
		Block:    dur("block", 1),
		Growth:   rapid.Int64Range(0, 3).Draw(t, "growth"),
		Name:     rapid.SampledFrom([]string{"", "login"}).Draw(t, "name"),
	}
	if rapid.Bool().Draw(t, "capped") {
		r.MaxBlock = r.Block + time.Duration(rapid.Int64Range(0, int64(ratelimit.MaxTime)-1-int64(r.Block)).Draw(t, "extra"))
		if rapid.Bool().Draw(t, "small cap") {
			r.MaxBlock = r.Block + time.Duration(rapid.Int64Range(0, 100).Draw(t, "small extra"))
			r.MaxBlock = min(r.MaxBlock, ratelimit.MaxTime-1)
		}
	}
	if r.Growth >= 2 || rapid.Bool().Draw(t, "forget anyway") {
		r.Forget = dur("forget", 1)
	}
	return r
}

// TestLockoutModel checks every Decision of a Lockout, field for field,
// against the model, over random traces of checks, failures, resets and
// clock moves on a few keys, small times and times near MaxTime included.
func TestLockoutModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rule := drawLockoutRule(t)
		clk := ratelimit.NewManualClock(0)
		lo, err := ratelimit.NewLockout(rule, ratelimit.WithClock(clk))
		require.NoError(t, err, "%+v", rule)
		keys := []string{"a", "b", "c"}
		models := map[string]*lockModel{}
		for _, k := range keys {
			models[k] = &lockModel{rule: rule}
		}
		now := func() int64 { return min(int64(clk.Now()), int64(ratelimit.MaxTime)) }
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				step := rapid.OneOf(
					rapid.Int64Range(0, 30),
					rapid.Int64Range(0, int64(ratelimit.MaxTime)/3),
				).Draw(t, "step")
				clk.Advance(time.Duration(min(step, int64(ratelimit.MaxTime)+1-int64(clk.Now()))))
			},
			// edge moves the clock to an instant where a key's Decision
			// changes (a failure leaves the span, a block ends, a streak is
			// forgotten), or a nanosecond either side of it.
			"edge": func(t *rapid.T) {
				m := models[rapid.SampledFrom(keys).Draw(t, "key")]
				edges := []int64{m.until, m.until + int64(rule.Forget)}
				for _, f := range m.failures {
					edges = append(edges, f+int64(rule.Within))
				}
				at := rapid.SampledFrom(edges).Draw(t, "edge") + rapid.Int64Range(-1, 1).Draw(t, "offset")
				if at > int64(clk.Now()) {
					clk.Set(time.Duration(min(at, int64(ratelimit.MaxTime)+1)))
				}
			},
			"check": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				require.Equal(t, models[k].check(now()), lo.Check(k))
			},
			// fail reports one failure of a key, or several at one instant.
			"fail": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				for range rapid.SampledFrom([]int64{1, rule.Failures}).Draw(t, "failures") {
					want, wantStarted := models[k].fail(now())
					got, started := lo.Fail(k)
					require.Equal(t, want, got)
					require.Equal(t, wantStarted, started)
				}
			},
			"reset": func(t *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(t, "key")
				lo.Reset(k)
				models[k] = &lockModel{rule: rule}
			},
		})
	})
}

func TestLockoutTable(t *testing.T) {
	login := ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: 15 * time.Minute, Name: "login"}
	growing := ratelimit.LockoutRule{Failures: 3, Within: time.Minute, Block: 15 * time.Minute,
		Growth: 2, MaxBlock: time.Hour, Forget: 24 * time.Hour}

	// A step moves the clock to at, then fails or checks; want and started
	// are what Fail or Check must return, field by field as given.
	type step struct {
		at      time.Duration
		fail    bool
		reset   bool
		allowed bool
		started bool
		retry   time.Duration
		remain  int64
	}
	for _, tc := range []struct {
		name  string
		rule  ratelimit.LockoutRule
		steps []step
	}{
		{"five failures in a minute block for fifteen minutes", login, []step{
			{at: 0, allowed: true, remain: 5},
			{at: 0, fail: true, allowed: true, remain: 4},
			{at: 10 * time.Second, fail: true, allowed: true, remain: 3},
			{at: 20 * time.Second, fail: true, allowed: true, remain: 2},
			{at: 30 * time.Second, fail: true, allowed: true, remain: 1},
			{at: 30 * time.Second, allowed: true, remain: 1},
			{at: 59 * time.Second, fail: true, started: true, retry: 15 * time.Minute},
			{at: 60500 * time.Millisecond, retry: 15*time.Minute - 1500*time.Millisecond},
			{at: 15*time.Minute + 59*time.Second - 1, retry: 1},
			{at: 15*time.Minute + 59*time.Second, allowed: true, remain: 5},
		}},
		{"a failure at exactly now - Within no longer counts", login, []step{
			{at: 0, fail: true, allowed: true, remain: 4},
			{at: 1, fail: true, allowed: true, remain: 3},
			{at: 2, fail: true, allowed: true, remain: 2},
			{at: 3, fail: true, allowed: true, remain: 1},
			{at: time.Minute, fail: true, allowed: true, remain: 1},
			{at: time.Minute + 1, allowed: true, remain: 2},
			{at: time.Minute + 2, allowed: true, remain: 3},
			{at: time.Minute + 2, fail: true, allowed: true, remain: 2},
			{at: time.Minute + 2, fail: true, allowed: true, remain: 1},
			{at: time.Minute + 2, fail: true, started: true, retry: 15 * time.Minute},
		}},
		{"a failure while blocked neither counts nor extends", login, []step{
			{at: 0, fail: true, allowed: true, remain: 4},
			{at: 0, fail: true, allowed: true, remain: 3},
			{at: 0, fail: true, allowed: true, remain: 2},
			{at: 0, fail: true, allowed: true, remain: 1},
			{at: 0, fail: true, started: true, retry: 15 * time.Minute},
			{at: time.Minute, fail: true, retry: 14 * time.Minute},
			{at: 15 * time.Minute, allowed: true, remain: 5},
			{at: 15 * time.Minute, fail: true, allowed: true, remain: 4},
		}},
		{"reset forgets a block", login, []step{
			{at: 0, fail: true, allowed: true, remain: 4},
			{at: 0, fail: true, allowed: true, remain: 3},
			{at: 0, fail: true, allowed: true, remain: 2},
			{at: 0, fail: true, allowed: true, remain: 1},
			{at: 0, fail: true, started: true, retry: 15 * time.Minute},
			{at: time.Minute, reset: true, allowed: true, remain: 5},
		}},
		{"repeat blocks double up to the cap", growing, []step{
			{at: 0, fail: true, allowed: true, remain: 2},
			{at: 0, fail: true, allowed: true, remain: 1},
			{at: 0, fail: true, started: true, retry: 15 * time.Minute},
			{at: 15 * time.Minute, fail: true, allowed: true, remain: 2},
			{at: 15 * time.Minute, fail: true, allowed: true, remain: 1},
			{at: 15 * time.Minute, fail: true, started: true, retry: 30 * time.Minute},
			{at: 45 * time.Minute, fail: true, allowed: true, remain: 2},
			{at: 45 * time.Minute, fail: true, allowed: true, remain: 1},
			{at: 45 * time.Minute, fail: true, started: true, retry: time.Hour},
			{at: 105 * time.Minute, fail: true, allowed: true, remain: 2},
			{at: 105 * time.Minute, fail: true, allowed: true, remain: 1},
			{at: 105 * time.Minute, fail: true, started: true, retry: time.Hour},
		}},
		{"a streak is forgotten after Forget without a block", growing, []step{
			{at: 0, fail: true, allowed: true, remain: 2},
			{at: 0, fail: true, allowed: true, remain: 1},
			{at: 0, fail: true, started: true, retry: 15 * time.Minute},
			// The next block starts a nanosecond before the streak is
			// forgotten: it grows.
			{at: 24*time.Hour + 15*time.Minute - 1, fail: true, allowed: true, remain: 2},
			{at: 24*time.Hour + 15*time.Minute - 1, fail: true, allowed: true, remain: 1},
			{at: 24*time.Hour + 15*time.Minute - 1, fail: true, started: true, retry: 30 * time.Minute},
			// It ended at 24h45m - 1ns; the next starts exactly Forget
			// later: a new streak.
			{at: 48*time.Hour + 45*time.Minute - 1, fail: true, allowed: true, remain: 2},
			{at: 48*time.Hour + 45*time.Minute - 1, fail: true, allowed: true, remain: 1},
			{at: 48*time.Hour + 45*time.Minute - 1, fail: true, started: true, retry: 15 * time.Minute},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := ratelimit.NewManualClock(0)
			lo, err := ratelimit.NewLockout(tc.rule, ratelimit.WithClock(clk))
			require.NoError(t, err)
			for i, s := range tc.steps {
				clk.Set(s.at)
				var d ratelimit.Decision
				started := false
				switch {
				case s.reset:
					lo.Reset("k")
					d = lo.Check("k")
				case s.fail:
					d, started = lo.Fail("k")
				default:
					d = lo.Check("k")
				}
				assert.Equal(t, s.allowed, d.Allowed, "step %d", i)
				assert.Equal(t, s.started, started, "step %d", i)
				assert.Equal(t, s.retry, d.RetryAfter, "step %d", i)
				assert.Equal(t, s.remain, d.Remaining, "step %d", i)
				assert.Equal(t, tc.rule.Failures, d.Limit, "step %d", i)
				assert.Equal(t, tc.rule.Within, d.Window, "step %d", i)
				assert.Equal(t, tc.rule.Name, d.Policy, "step %d", i)
				assert.Equal(t, s.at, d.At, "step %d", i)
			}
		})
	}
}

// TestLockoutResetAfter checks ResetAfter: the time until no failure
// counts, the block is over and the streak is forgotten.
func TestLockoutResetAfter(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	lo, err := ratelimit.NewLockout(ratelimit.LockoutRule{Failures: 2, Within: time.Minute, Block: time.Hour,
		Growth: 2, Forget: 24 * time.Hour}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	assert.Zero(t, lo.Check("k").ResetAfter, "a fresh key")
	d, _ := lo.Fail("k")
	assert.Equal(t, time.Minute, d.ResetAfter)
	clk.Advance(10 * time.Second)
	assert.Equal(t, 50*time.Second, lo.Check("k").ResetAfter)
	d, _ = lo.Fail("k")
	assert.Equal(t, 25*time.Hour, d.ResetAfter, "the block, then the streak's Forget")
}

// TestLockoutHugeDurations checks that blocks near MaxTime saturate
// instead of overflowing.
func TestLockoutHugeDurations(t *testing.T) {
	clk := ratelimit.NewManualClock(ratelimit.MaxTime - time.Hour)
	lo, err := ratelimit.NewLockout(ratelimit.LockoutRule{Failures: 1, Within: ratelimit.MaxTime - 1,
		Block: ratelimit.MaxTime - 1, Growth: 1 << 40, Forget: ratelimit.MaxTime - 1}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, started := lo.Fail("k")
	assert.True(t, started)
	assert.Equal(t, time.Hour, d.RetryAfter, "no block ends after MaxTime")
	assert.Equal(t, ratelimit.MaxTime-1+time.Hour, d.ResetAfter)
	clk.Set(ratelimit.MaxTime)
	assert.True(t, lo.Check("k").Allowed)
	d, started = lo.Fail("k")
	assert.False(t, started, "a block from MaxTime ends as it starts: time stops there")
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(1), d.Remaining)
	assert.Equal(t, ratelimit.MaxTime-1, d.ResetAfter)

	// A clock that goes back is not trusted.
	clk.Set(0)
	assert.Equal(t, ratelimit.MaxTime, lo.Check("k").At)
}

func TestLockoutRuleErrors(t *testing.T) {
	ok := ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: time.Minute}
	for _, tc := range []struct {
		name  string
		edit  func(*ratelimit.LockoutRule)
		field string
	}{
		{"no failures", func(r *ratelimit.LockoutRule) { r.Failures = 0 }, "Failures"},
		{"too many failures", func(r *ratelimit.LockoutRule) { r.Failures = 1e15 + 1 }, "Failures"},
		{"no span", func(r *ratelimit.LockoutRule) { r.Within = 0 }, "Within"},
		{"negative span", func(r *ratelimit.LockoutRule) { r.Within = -time.Second }, "Within"},
		{"span of MaxTime", func(r *ratelimit.LockoutRule) { r.Within = ratelimit.MaxTime }, "Within"},
		{"no block", func(r *ratelimit.LockoutRule) { r.Block = 0 }, "Block"},
		{"block of MaxTime", func(r *ratelimit.LockoutRule) { r.Block = ratelimit.MaxTime }, "Block"},
		{"negative growth", func(r *ratelimit.LockoutRule) { r.Growth = -2 }, "Growth"},
		{"cap below the block", func(r *ratelimit.LockoutRule) { r.MaxBlock = time.Second }, "MaxBlock"},
		{"negative cap", func(r *ratelimit.LockoutRule) { r.MaxBlock = -1 }, "MaxBlock"},
		{"cap of MaxTime", func(r *ratelimit.LockoutRule) { r.MaxBlock = ratelimit.MaxTime }, "MaxBlock"},
		{"growth without forget", func(r *ratelimit.LockoutRule) { r.Growth = 2 }, "Forget"},
		{"negative forget", func(r *ratelimit.LockoutRule) { r.Forget = -1 }, "Forget"},
		{"forget of MaxTime", func(r *ratelimit.LockoutRule) { r.Growth, r.Forget = 2, ratelimit.MaxTime }, "Forget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			lo, err := ratelimit.NewLockout(r)
			assert.Nil(t, lo)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re))
			assert.Equal(t, "LockoutRule", re.Rule)
			assert.Equal(t, tc.field, re.Field, err.Error())
		})
	}
	_, err := ratelimit.NewLockout(ok, ratelimit.WithMaxKeys(0))
	assert.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	for _, r := range []ratelimit.LockoutRule{
		{Failures: 1, Within: 1, Block: 1},
		{Failures: 1e15, Within: ratelimit.MaxTime - 1, Block: ratelimit.MaxTime - 1, Growth: 1, Forget: 0},
		{Failures: 3, Within: time.Minute, Block: time.Minute, Growth: 3, MaxBlock: time.Minute, Forget: time.Hour},
	} {
		_, err := ratelimit.NewLockout(r)
		assert.NoError(t, err, "%+v", r)
	}
}

// TestLockoutBounded checks that a lockout's store drops the keys with
// nothing to remember before any that is blocked.
func TestLockoutBounded(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	lo, err := ratelimit.NewLockout(ratelimit.LockoutRule{Failures: 2, Within: time.Minute, Block: 24 * time.Hour},
		ratelimit.WithClock(clk), ratelimit.WithMaxKeys(8), ratelimit.WithShards(1))
	require.NoError(t, err)
	lo.Fail("blocked")
	_, started := lo.Fail("blocked")
	require.True(t, started)
	for i := range 7 {
		lo.Fail(fmt.Sprint("once-", i))
	}
	assert.Equal(t, 8, lo.Stats().Keys)
	assert.True(t, lo.Check("never seen").Allowed)
	assert.Equal(t, 8, lo.Stats().Keys, "Check adds no key")

	clk.Advance(time.Minute) // the single failures no longer count
	for i := range 100 {
		lo.Fail(fmt.Sprint("new-", i))
		clk.Advance(time.Minute)
	}
	st := lo.Stats()
	assert.LessOrEqual(t, st.Keys, 8)
	assert.Zero(t, st.LossyEvictions, "only keys with nothing to remember were dropped")
	d := lo.Check("blocked")
	assert.False(t, d.Allowed)
	assert.Equal(t, 24*time.Hour-101*time.Minute, d.RetryAfter, "still blocked")
}

// TestLockoutConcurrentFailures checks that concurrent failures on one key
// start exactly one block, at the Failures-th.
func TestLockoutConcurrentFailures(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	lo, err := ratelimit.NewLockout(ratelimit.LockoutRule{Failures: 100, Within: time.Minute, Block: time.Hour},
		ratelimit.WithClock(clk))
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	counted, starts := 0, 0
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, started := lo.Fail("k")
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed {
				counted++
			}
			if started {
				starts++
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 99, counted, "the failures before the block")
	assert.Equal(t, 1, starts)
	assert.Equal(t, time.Hour, lo.Check("k").RetryAfter)
}
