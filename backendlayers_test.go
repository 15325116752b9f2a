package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// layeredRule draws a small rule of any algorithm the Machine has.
func layeredRule(t *rapid.T, label string) ratelimit.Rule {
	n := rapid.Int64Range(1, 6).Draw(t, label+" limit")
	per := rapid.SampledFrom([]time.Duration{time.Nanosecond * 7, time.Millisecond, time.Second, time.Minute}).Draw(t, label+" per")
	switch rapid.IntRange(0, 6).Draw(t, label+" algorithm") {
	case 0:
		return ratelimit.TokenBucket{Rate: ratelimit.Rate{Count: n, Per: per}, Burst: n, Name: label}
	case 1:
		return ratelimit.GCRA{Rate: ratelimit.Rate{Count: n, Per: per}, Burst: n, Name: label}
	case 2:
		return ratelimit.LeakyBucket{Rate: ratelimit.Rate{Count: n, Per: per}, Capacity: n, Name: label}
	case 3:
		return ratelimit.FixedWindow{Limit: n, Window: per, Name: label}
	case 4:
		return ratelimit.SlidingLog{Limit: n, Window: per, Name: label}
	case 5:
		return ratelimit.SlidingCounter{Limit: n, Window: per, Name: label}
	default:
		return ratelimit.SubWindow{Limit: n, Window: 4 * per, Buckets: 4, Name: label}
	}
}

// TestLayeredMachineDecidesAsComposite runs one trace against a Composite
// and against a LayeredMachine whose states are kept in a map, on one
// ManualClock, and requires the same Decisions and shadow reports.
func TestLayeredMachineDecidesAsComposite(t *testing.T) { layeredTrace(t, false) }

// TestLayeredMachineWithinDecidesAsCheckWithin is the same with a bound on
// the Delay: StepWithin against Composite.CheckWithin.
func TestLayeredMachineWithinDecidesAsCheckWithin(t *testing.T) { layeredTrace(t, true) }

// layeredTrace runs TestLayeredMachineDecidesAsComposite's traces, with
// Check and Step, or with CheckWithin and StepWithin when within is true.
func layeredTrace(t *testing.T, within bool) {
	keyFns := []func(string) string{
		func(string) string { return "all" },
		func(k string) string { return strings.SplitN(k, " ", 2)[0] },
		nil,
	}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3).Draw(t, "layers")
		layers := make([]ratelimit.Layer, n)
		var reports []ratelimit.ShadowReport
		for i := range layers {
			layers[i] = ratelimit.Layer{
				Rule:     layeredRule(t, string(rune('a'+i))),
				Key:      keyFns[rapid.IntRange(0, 2).Draw(t, "key")],
				Shadow:   rapid.IntRange(0, 3).Draw(t, "shadow") == 0,
				OnShadow: func(r ratelimit.ShadowReport) { r.Key = ""; reports = append(reports, r) },
			}
		}
		clk := ratelimit.NewManualClock(time.Duration(rapid.Int64Range(0, 1e12).Draw(t, "start")))
		c, err := ratelimit.Compose(layers, ratelimit.WithClock(clk))
		require.NoError(t, err)
		lm, err := ratelimit.NewLayeredMachine(layers)
		require.NoError(t, err)
		states := map[[2]string][]byte{}
		for step := range rapid.IntRange(1, 60).Draw(t, "steps") {
			clk.Advance(time.Duration(rapid.SampledFrom([]int64{0, 0, 1, 3, 1e6, 1e9, 7e9}).Draw(t, "advance")))
			key := rapid.SampledFrom([]string{"x 1", "x 2", "y 1"}).Draw(t, "key")
			cost := ratelimit.Units(rapid.SampledFrom([]int64{1, 1000, 1000, 2500, 6000, 7000, 0}).Draw(t, "cost"))
			reports = reports[:0]
			maxDelay := time.Duration(rapid.SampledFrom([]int64{0, 1, 1e6, 1e9, 3e9}).Draw(t, "maxDelay"))
			// With a positive bound, CheckLayers is CheckWithin that also
			// lists every enforced layer, which StepWithinLayers must list
			// alike.
			var wantLayers []ratelimit.Decision
			check := func() (ratelimit.Decision, error) { return c.Check(key, cost) }
			if within && maxDelay > 0 {
				check = func() (d ratelimit.Decision, err error) {
					d, wantLayers, err = c.CheckLayers(context.Background(), key, cost, maxDelay, nil)
					return d, err
				}
			} else if within {
				check = func() (ratelimit.Decision, error) { return c.CheckWithin(key, cost, maxDelay) }
			}
			want, werr := check()
			wantReports := append([]ratelimit.ShadowReport(nil), reports...)

			in := make([][]byte, n)
			ks := make([][2]string, n)
			for i, l := range layers {
				k := key
				if l.Key != nil {
					k = l.Key(key)
				}
				ks[i] = [2]string{string(rune('a' + i)), k}
				in[i] = states[ks[i]]
			}
			got, out, gotReports, gerr := lm.Step(in, clk.Now(), cost, true)
			if within {
				var a ratelimit.Attempt
				var gotLayers []ratelimit.Decision
				if maxDelay > 0 {
					a, out, gotReports, gotLayers, gerr = lm.StepWithinLayers(in, clk.Now(), cost, maxDelay, nil)
					require.Equal(t, wantLayers, gotLayers, "step %d: key %q cost %d: the layers' Decisions", step, key, cost)
				} else {
					a, out, gotReports, gerr = lm.StepWithin(in, clk.Now(), cost, maxDelay)
				}
				got = a.Decision
				if !a.Committed && got.Allowed {
					got = a.TooSlow
				}
				require.Equal(t, a.Committed, gerr == nil && got.Allowed)
				if got.Allowed {
					require.LessOrEqual(t, a.GoOn, maxDelay)
				}
			}
			require.Equal(t, werr == nil, gerr == nil, "step %d: errors %v, %v", step, werr, gerr)
			if werr != nil {
				require.True(t, errors.Is(gerr, errors.Unwrap(werr)) || gerr.Error() == werr.Error(), "%v / %v", werr, gerr)
			}
			require.Equal(t, want, got, "step %d: key %q cost %d", step, key, cost)
			require.Equal(t, len(wantReports), len(gotReports))
			for i := range wantReports {
				require.Equal(t, wantReports[i].Decision, gotReports[i].Decision)
				require.Equal(t, wantReports[i].Err == nil, gotReports[i].Err == nil)
			}
			for i := range out {
				states[ks[i]] = out[i]
			}
		}
	})
}

// TestLayeredMachineLookChangesNothing: with commit false the states come
// back as they were, and a denied request changes no state.
func TestLayeredMachineLookChangesNothing(t *testing.T) {
	lm, err := ratelimit.NewLayeredMachine([]ratelimit.Layer{
		{Rule: ratelimit.FixedWindow{Limit: 100, Window: time.Hour, Name: "global"}},
		{Rule: ratelimit.FixedWindow{Limit: 1, Window: time.Hour, Name: "per-key"}},
	})
	require.NoError(t, err)
	states := [][]byte{nil, nil}
	d, out, _, err := lm.Step(states, time.Second, ratelimit.Unit, false)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, states, out)
	d, out, _, err = lm.Step(states, time.Second, ratelimit.Unit, true)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, "1000000000 0 1000", string(out[1]))
	d, out2, _, err := lm.Step(out, 2*time.Second, ratelimit.Unit, true)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, "per-key", d.Policy)
	require.Equal(t, int64(0), d.Remaining)
	require.Equal(t, out, out2, "a denied request spends nothing from the global layer")

	_, _, _, err = lm.Step([][]byte{[]byte("x"), nil}, 0, ratelimit.Unit, true)
	require.ErrorIs(t, err, ratelimit.ErrInvalidState)
	require.ErrorContains(t, err, "layer 0")
}
