package ratelimit_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

func TestRateString(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate ratelimit.Rate
		want string
	}{
		{"per second", ratelimit.PerSecond(10), "10/s"},
		{"per minute", ratelimit.PerMinute(100), "100/min"},
		{"per hour", ratelimit.PerHour(5000), "5000/h"},
		{"odd seconds", ratelimit.Rate{Count: 7, Per: 3 * time.Second}, "7/3s"},
		{"a day", ratelimit.Every(24 * time.Hour), "1/24h"},
		{"minutes", ratelimit.Rate{Count: 3, Per: 5 * time.Minute}, "3/5m"},
		{"milliseconds", ratelimit.Rate{Count: 3, Per: 250 * time.Millisecond}, "3/250ms"},
		{"microseconds", ratelimit.Rate{Count: 1, Per: 7 * time.Microsecond}, "1/7us"},
		{"nanoseconds", ratelimit.Rate{Count: 1, Per: 1500}, "1/1500ns"},
		{"invalid", ratelimit.Rate{}, "0/0ns"},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.rate.String()) })
	}
}

func TestUnitsString(t *testing.T) {
	for _, tc := range []struct {
		units ratelimit.Units
		want  string
	}{
		{ratelimit.Unit, "1"},
		{10 * ratelimit.Unit, "10"},
		{ratelimit.Unit / 4, "0.25"},
		{1, "0.001"},
		{1500, "1.5"},
		{0, "0"},
		{-3500, "-3.5"},
		{math.MinInt64, "-9223372036854775.808"},
	} {
		assert.Equal(t, tc.want, tc.units.String(), "%d", int64(tc.units))
	}
}

func TestRuleErrorNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  ratelimit.Rule
		field string
	}{
		{"zero count", ratelimit.TokenBucket{Rate: ratelimit.Rate{Per: time.Second}, Burst: 1}, "Rate.Count"},
		{"count too large", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 2e15, Per: time.Second}, Burst: 1}, "Rate.Count"},
		{"zero period", ratelimit.GCRA{Rate: ratelimit.Rate{Count: 1}, Burst: 1}, "Rate.Per"},
		{"negative burst", ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: -1}, "Burst"},
		{"burst too large", ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2e15}, "Burst"},
		{"burst refills too slowly", ratelimit.GCRA{Rate: ratelimit.Every(10 * 365 * 24 * time.Hour), Burst: 1_000_000}, "Burst"},
		{"zero capacity", ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1)}, "Capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ratelimit.New(tc.rule)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			var re *ratelimit.RuleError
			require.True(t, errors.As(err, &re))
			assert.Equal(t, tc.field, re.Field)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
	_, err := ratelimit.New(nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
}

func TestAcceptsTheDocumentedRange(t *testing.T) {
	// Count up to 1e12 per any period from 1 µs to 10 years, and capacities
	// up to 1e12 where the whole burst refills within MaxTime.
	year := 365 * 24 * time.Hour
	for _, per := range []time.Duration{time.Microsecond, time.Second, year, 10 * year} {
		for _, count := range []int64{1, 1e6, 1e12} {
			for _, capacity := range []int64{1, 1e6, 1e12} {
				r := ratelimit.Rate{Count: count, Per: per}
				_, err := ratelimit.New(ratelimit.GCRA{Rate: r, Burst: capacity})
				if spanFits(r, capacity) {
					assert.NoError(t, err, "%v burst %d", r, capacity)
				} else {
					assert.ErrorIs(t, err, ratelimit.ErrInvalidRule, "%v burst %d", r, capacity)
				}
			}
		}
	}
	for _, w := range []time.Duration{time.Millisecond, 10 * year} {
		for _, limit := range []int64{1, 1e12} {
			for _, rule := range []ratelimit.Rule{
				ratelimit.FixedWindow{Limit: limit, Window: w},
				ratelimit.SlidingLog{Limit: limit, Window: w},
				ratelimit.SlidingCounter{Limit: limit, Window: w},
			} {
				_, err := ratelimit.New(rule)
				assert.NoError(t, err, "%+v", rule)
			}
		}
	}
}

func TestClockReadingsAreClamped(t *testing.T) {
	// Far beyond MaxTime and below zero, the limiter keeps working and
	// never lets time run backwards.
	clk := ratelimit.NewManualClock(-time.Hour)
	lim, err := ratelimit.New(ratelimit.FixedWindow{Limit: 1, Window: time.Hour}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	d, err := lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, time.Hour, d.ResetAfter, "a negative reading is taken as 0")
	clk.Set(time.Duration(math.MaxInt64))
	d, err = lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a new window at MaxTime")
	clk.Set(0)
	d, err = lim.Check(ratelimit.Unit)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "time stays at MaxTime")
}

func TestManualClockAdvanceSaturates(t *testing.T) {
	clk := ratelimit.NewManualClock(time.Duration(math.MaxInt64 - 5))
	assert.Equal(t, time.Duration(math.MaxInt64), clk.Advance(time.Hour))
	clk.Set(time.Duration(math.MinInt64 + 5))
	assert.Equal(t, time.Duration(math.MinInt64), clk.Advance(-time.Hour))
	assert.Equal(t, time.Duration(math.MinInt64+10), clk.Advance(10))
}
