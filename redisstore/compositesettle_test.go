package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// hotLayers are the layers of the hot-key tests: a sliding log, a
// sub-window and a GCRA, with different capacities, under one hash tag.
func hotLayers() []ratelimit.Layer {
	return []ratelimit.Layer{
		{Rule: ratelimit.SlidingLog{Limit: 40, Window: time.Hour}, Key: firstField},
		{Rule: ratelimit.SubWindow{Limit: 60, Window: time.Hour, Buckets: 6}},
		{Rule: ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 50}},
	}
}

// peekChecker is a limiter with Peek and Check, in process or in Redis.
type peekChecker interface {
	Peek(string, ratelimit.Units) (ratelimit.Decision, error)
	Check(string, ratelimit.Units) (ratelimit.Decision, error)
}

// sameFromHere requires got's Peek of key to be want's, and from there
// both to admit the same checks, to the last one.
func sameFromHere(t *testing.T, got, want peekChecker, key string) {
	t.Helper()
	g, err := got.Peek(key, ratelimit.Unit)
	require.NoError(t, err)
	w, err := want.Peek(key, ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, w, g)
	for i := 0; ; i++ {
		w, err := want.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		g, err := got.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		require.Equal(t, w, g, "check %d after the net spending", i)
		if !w.Allowed {
			return
		}
	}
}

// TestCompositeHotKeyRefundAndSettle: 64 goroutines check one key of a
// Composite of three layers, and refund or settle most of what they are
// admitted, time standing still. No refund or settlement fails (none
// conflicts with the checks around it), each gives back all it was asked,
// and the layers end holding exactly what was kept: the same Decisions, to
// the last admission, as the in-process Composite after the same net
// spending.
func TestCompositeHotKeyRefundAndSettle(t *testing.T) {
	rdb := needRedis(t)
	clk := ratelimit.NewManualClock(unixNow) // time stands still
	local := hotLayers()
	remote := make([]Layer, len(local))
	for i, l := range local {
		remote[i] = Layer{Layer: l}
	}
	c, err := NewComposite(rdb, remote, WithClock(clk), WithPrefix(testPrefix()), WithHashTag(firstField), WithTimeout(10*time.Second),
		WithDenyCache(0)) // every refusal from Redis, to compare exactly
	require.NoError(t, err)
	want, err := ratelimit.Compose(local, ratelimit.WithClock(clk))
	require.NoError(t, err)
	const key = "acme /a"
	var kept, conflicts, errs atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 12 {
				d, err := c.Check(key, 2*ratelimit.Unit)
				if err != nil {
					errs.Add(1)
					return
				}
				if !d.Allowed {
					continue
				}
				switch (w + i) % 4 {
				case 0: // kept
					kept.Add(2)
				case 1: // settled at half
					_, settled, err := c.Settle(key, 2*ratelimit.Unit, ratelimit.Unit, d.At)
					if errors.Is(err, ErrConflict) {
						conflicts.Add(1)
						kept.Add(2)
						continue
					}
					if err != nil || settled != ratelimit.Unit {
						t.Errorf("settled as %d: %v", settled, err)
						errs.Add(1)
						return
					}
					kept.Add(1)
				default: // refunded
					g, err := c.Refund(key, 2*ratelimit.Unit, d.At)
					if errors.Is(err, ErrConflict) {
						conflicts.Add(1)
						kept.Add(2)
						continue
					}
					if err != nil || g != 2*ratelimit.Unit {
						t.Errorf("refund gave back %d: %v", g, err)
						errs.Add(1)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, errs.Load(), "failed checks, refunds or settlements")
	require.Zero(t, conflicts.Load(), "refunds or settlements that conflicted")
	assert.LessOrEqual(t, kept.Load(), int64(40), "more kept than the tightest layer")
	// The same net spending in process.
	for range kept.Load() {
		d, err := want.Check(key, ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	sameFromHere(t, c, want, key)
	st := c.Stats()
	assert.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
}

// drawAt draws the instant a refund or a settlement names as its
// admission's: mostly one of ats, the instants admitted so far, else any.
func drawAt(t *rapid.T, ats []time.Duration) time.Duration {
	if len(ats) == 0 || rapid.IntRange(0, 3).Draw(t, "otherAt") == 0 {
		return time.Duration(rapid.Int64Range(0, int64(unixNow)*2).Draw(t, "at"))
	}
	return rapid.SampledFrom(ats).Draw(t, "admittedAt")
}

// TestCompositeScriptOpsOnServerTime: a Composite's refunds and
// settlements with the server's clock, on layers of every algorithm
// (shadow layers included). Each is computed by the script at the one
// instant it read and checked against the layers' Machines on the states
// and instant the script read (a disagreement is an error), so a sequence
// of checks, refunds and settlements that all succeed has decided exactly
// as the Machines do. The client clock's runs are
// TestCompositeSameDecisionsAsInProcess, against the in-process Composite.
func TestCompositeScriptOpsOnServerTime(t *testing.T) {
	rdb := needRedis(t)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3).Draw(t, "layers")
		layers := make([]Layer, n)
		capacity := ratelimit.Units(1 << 62)
		enforced := false
		for i := range n {
			rule := drawRule(t)
			shadow := rapid.IntRange(0, 3).Draw(t, "shadow") == 0
			enforced = enforced || !shadow
			layers[i] = Layer{Layer: ratelimit.Layer{Rule: rule, Shadow: shadow}}
			m, err := ratelimit.NewMachine(rule)
			require.NoError(t, err)
			capacity = min(capacity, m.Params().Capacity)
		}
		c, err := NewComposite(rdb, layers, WithPrefix(testPrefix()), WithTimeout(5*time.Second))
		require.NoError(t, err)
		var ats []time.Duration
		at := func(t *rapid.T) time.Duration { return drawAt(t, ats) }
		t.Repeat(map[string]func(*rapid.T){
			"check": func(t *rapid.T) {
				d, err := c.Check("k", drawCost(t, capacity))
				require.NoError(t, err)
				if d.Allowed {
					ats = append(ats, d.At)
				}
			},
			"refund": func(t *rapid.T) {
				_, err := c.Refund("k", drawCost(t, capacity), at(t))
				require.NoError(t, err)
			},
			"settle": func(t *rapid.T) {
				charged := drawCost(t, capacity)
				d, settled, err := c.Settle("k", charged, drawActual(t, charged, capacity), at(t))
				require.NoError(t, err)
				if !enforced {
					require.Equal(t, charged, settled)
				}
				_ = d
			},
			"": func(t *rapid.T) {
				st := c.Stats()
				require.Zero(t, st.Mismatches+st.InvalidStates)
			},
		})
	})
}

// TestCompositeScriptOpsRefuseTamperedStates: a Composite's refund or
// settlement with any one layer's state tampered with (malformed, or one
// its rule could not have written), a shadow layer's included, fails with
// ErrInvalidState and writes no layer's key, the valid ones included.
func TestCompositeScriptOpsRefuseTamperedStates(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	clk := ratelimit.NewManualClock(unixNow)
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.SlidingLog{Limit: 10, Window: time.Second}}},
		{Layer: ratelimit.Layer{Rule: ratelimit.SubWindow{Limit: 10, Window: 4 * time.Second, Buckets: 4}, Shadow: true}},
	}
	c, err := NewComposite(rdb, layers, WithClock(clk), WithPrefix(testPrefix()))
	require.NoError(t, err)
	malformed := []string{"abc", "01 2 3", "1  2 3", "99999999999999999999 1 1", " 1 2 3"}
	bad := [][]string{
		{"1000 3780000000000000000 0", "1000 2000 30000000000"},
		{"1000 5", "1000 -5 1", fmt.Sprintf("%d %d 20001", unixNow, unixNow-5)},
		{"1000 0 0 0 0", "1000000000 1 0 0 0 20001", "1000000000 1 0 1 0 0"},
	}
	for i := range layers {
		for _, state := range append(append([]string(nil), malformed...), bad[i]...) {
			clk.Advance(time.Second)
			a, err := c.Check("k", ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, a.Allowed)
			require.NoError(t, rdb.Set(ctx, c.Key(i, "k"), state, time.Hour).Err())
			before := make([]string, len(layers))
			for j := range layers {
				before[j], err = rdb.Get(ctx, c.Key(j, "k")).Result()
				require.NoError(t, err)
			}
			_, err = c.Refund("k", ratelimit.Unit, a.At)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "refund, layer %d on %q", i, state)
			_, _, err = c.Settle("k", ratelimit.Unit, 3*ratelimit.Unit, a.At)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "settle, layer %d on %q", i, state)
			_, _, err = c.Settle("k", ratelimit.Unit, ratelimit.Unit/2, a.At)
			assert.ErrorIs(t, err, ratelimit.ErrInvalidState, "settle, layer %d on %q", i, state)
			for j := range layers {
				got, err := rdb.Get(ctx, c.Key(j, "k")).Result()
				require.NoError(t, err)
				assert.Equal(t, before[j], got, "layer %d written over, layer %d on %q", j, i, state)
			}
			require.NoError(t, rdb.Del(ctx, c.Key(i, "k")).Err())
		}
	}
	assert.Zero(t, c.Stats().Mismatches)
}

// TestCompositeSettleRaisesNowToTheLatestLayer: a Composite's refund and
// settlement from a process whose clock runs behind a state another
// process wrote settle every layer at that state's latest instant, the
// one instant of them all, as its checks do
// (TestCompositeRaisesNowToTheLatestLayer): one layer's key is shared by
// every request and was last written 10 s ahead, the other's behind.
func TestCompositeSettleRaisesNowToTheLatestLayer(t *testing.T) {
	rdb := needRedis(t)
	ctx := context.Background()
	layers := []Layer{
		{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 5}, Key: func(string) string { return "all" }}},
		{Layer: ratelimit.Layer{Rule: ratelimit.SlidingLog{Limit: 3, Window: time.Hour}}},
	}
	lm, err := ratelimit.NewLayeredMachine([]ratelimit.Layer{layers[0].Layer, layers[1].Layer})
	require.NoError(t, err)
	prefix := testPrefix()
	ahead := ratelimit.NewManualClock(unixNow + 10*time.Second)
	behind := ratelimit.NewManualClock(unixNow)
	a, err := NewComposite(rdb, layers, WithClock(ahead), WithPrefix(prefix))
	require.NoError(t, err)
	b, err := NewComposite(rdb, layers, WithClock(behind), WithPrefix(prefix))
	require.NoError(t, err)
	dy, err := b.Check("y", ratelimit.Unit)
	require.NoError(t, err)
	_, err = a.Check("x", ratelimit.Unit)
	require.NoError(t, err)
	states := func() [][]byte {
		out := make([][]byte, 2)
		for l := range out {
			v, err := rdb.Get(ctx, b.Key(l, "y")).Result()
			require.NoError(t, err)
			out[l] = []byte(v)
		}
		return out
	}
	raised := unixNow + 10*time.Second

	old := states()
	g, err := b.Refund("y", ratelimit.Unit, dy.At)
	require.NoError(t, err)
	g0, _, err := lm.Machine(0).Refund(old[0], raised, dy.At, ratelimit.Unit)
	require.NoError(t, err)
	g1, next1, err := lm.Machine(1).Refund(old[1], raised, dy.At, ratelimit.Unit)
	require.NoError(t, err)
	assert.Equal(t, min(g0, g1), g)
	assert.Equal(t, string(next1), string(states()[1]), "the log's refund, at the raised instant")

	old = states()
	d, settled, err := b.Settle("y", ratelimit.Unit, 3*ratelimit.Unit, dy.At)
	require.NoError(t, err)
	after := make([][]byte, 2)
	for l := range after {
		_, _, after[l], err = lm.Machine(l).Settle(old[l], raised, dy.At, ratelimit.Unit, 3*ratelimit.Unit)
		require.NoError(t, err)
	}
	assert.Equal(t, after, states(), "the settlement, at the raised instant")
	want, _, _, err := lm.Step(after, raised, ratelimit.Unit, false)
	require.NoError(t, err)
	assert.Equal(t, want, d)
	assert.Equal(t, 3*ratelimit.Unit, settled)
	assert.Equal(t, raised, d.At)
}

// TestClusterCompositeRefundAndSettle: on a Cluster client connected to
// three real masters, a Composite's refunds and settlements, one script
// over the layers' keys under one hash tag, reach every master and give
// the in-process Composite's amounts and Decisions.
func TestClusterCompositeRefundAndSettle(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	local := hotLayers()
	remote := make([]Layer, len(local))
	for i, l := range local {
		remote[i] = Layer{Layer: l}
	}
	clk := ratelimit.NewManualClock(unixNow)
	want, err := ratelimit.Compose(local, ratelimit.WithClock(clk))
	require.NoError(t, err)
	got, err := NewComposite(rdb, remote, WithHashTag(firstField), WithClock(clk), WithPrefix(testPrefix()),
		WithTimeout(5*time.Second), WithDenyCache(0))
	require.NoError(t, err)
	masters := map[string]bool{}
	for c := range 30 {
		key := fmt.Sprintf("customer-%d /a", c)
		masters[cl.Owner(t, cl.Slot(t, got.Key(0, key))).Addr()] = true
		for step := range 3 {
			clk.Advance(time.Second)
			w, err := want.Check(key, 3*ratelimit.Unit)
			require.NoError(t, err)
			g, err := got.Check(key, 3*ratelimit.Unit)
			require.NoError(t, err)
			require.Equal(t, w, g, "check %d of %q", step, key)
			wg, err := want.Refund(key, ratelimit.Unit, w.At)
			require.NoError(t, err)
			gg, err := got.Refund(key, ratelimit.Unit, g.At)
			require.NoError(t, err)
			require.Equal(t, wg, gg, "refund %d of %q", step, key)
			wd, wx, err := want.Settle(key, 3*ratelimit.Unit, 5*ratelimit.Unit, w.At)
			require.NoError(t, err)
			gd, gx, err := got.Settle(key, 3*ratelimit.Unit, 5*ratelimit.Unit, g.At)
			require.NoError(t, err)
			require.Equal(t, wd, gd, "settlement %d of %q", step, key)
			require.Equal(t, wx, gx, "settlement %d of %q", step, key)
		}
	}
	require.Len(t, masters, 3, "requests did not spread over every master")
	st := got.Stats()
	require.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
}
