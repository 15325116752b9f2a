package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestClusterComposite: on a Cluster client connected to three real
// masters, NewComposite refuses a Global layer beside per-key layers; a
// per-customer and a per-customer-and-route layer under WithHashTag share a
// slot for each request, spread over every master, and decide as the
// in-process Composite does; without the tag a request is refused with
// ErrCrossSlot before it reaches a server.
func TestClusterComposite(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	global := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100, Name: "global"}, Key: func(string) string { return "all" }}, Global: true}
	customer := ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 5, Name: "customer"}, Key: firstField}
	route := ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "route"}}

	_, err := NewComposite(rdb, []Layer{global, {Layer: customer}})
	require.ErrorIs(t, err, ErrCrossSlot)
	require.ErrorContains(t, err, "layer 0 (global) is Global")
	_, err = NewComposite(rdb, []Layer{{Layer: customer}, {Layer: route}, global})
	require.ErrorIs(t, err, ErrCrossSlot)
	require.ErrorContains(t, err, "layer 2 (global) is Global")

	// A global limit alone works: its key is in one slot.
	alone, err := NewComposite(rdb, []Layer{global}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	d, err := alone.Check("acme /a", ratelimit.Unit)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	clk := ratelimit.NewManualClock(unixNow)
	want, err := ratelimit.Compose([]ratelimit.Layer{customer, route}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	got, err := NewComposite(rdb, []Layer{{Layer: customer}, {Layer: route}}, WithHashTag(firstField),
		WithClock(clk), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
	require.NoError(t, err)

	var requests []string
	for c := range 30 {
		for r := range 2 {
			requests = append(requests, fmt.Sprintf("customer-%d /route-%d", c, r))
		}
	}
	masters := map[string]bool{}
	for _, req := range requests {
		s0, s1 := cl.Slot(t, got.Key(0, req)), cl.Slot(t, got.Key(1, req))
		require.Equal(t, s0, s1, "layers of %q in slots %d and %d", req, s0, s1)
		masters[cl.Owner(t, s0).Addr()] = true
	}
	require.Len(t, masters, 3, "requests did not spread over every master")

	admitted, refused := 0, 0
	for step := range 30 {
		for _, req := range requests {
			w, werr := want.Check(req, ratelimit.Unit)
			before := got.Stats().LocalDenials
			g, gerr := got.Check(req, ratelimit.Unit)
			require.NoError(t, werr)
			require.NoError(t, gerr)
			if got.Stats().LocalDenials > before {
				requireCachedCompositeRefusal(t, w, g, "step %d request %q", step, req)
			} else {
				require.Equal(t, w, g, "step %d request %q", step, req)
			}
			if g.Allowed {
				admitted++
			} else {
				refused++
			}
		}
		clk.Advance(time.Duration(step%4) * 150 * time.Millisecond)
	}
	require.NotZero(t, admitted)
	require.NotZero(t, refused)
	t.Logf("%d admitted, %d refused, on %d masters", admitted, refused, len(masters))

	untagged, err := NewComposite(rdb, []Layer{{Layer: customer}, {Layer: route}}, WithPrefix(testPrefix()))
	require.NoError(t, err)
	d, err = untagged.Check("acme /a", ratelimit.Unit)
	require.ErrorIs(t, err, ErrCrossSlot)
	require.False(t, d.Allowed)
}

// TestClusterCompositePrefix: a prefix that moves Redis's hash tag is
// judged as Redis judges it. For every prefix of up to four characters
// from '{', '}' and 'a', NewComposite on a Cluster client accepts it
// exactly when every layer's key of each request lands in one slot, as the
// cluster computes slots (CLUSTER KEYSLOT), and refuses it with
// ErrCrossSlot otherwise (an unmatched '{', or an empty "{}", takes the
// layer's part of the key into the tag). A prefix with a tag of its own
// puts every key in one slot, a Global layer's too. And a script that gets
// CROSSSLOT nonetheless is refused with ErrCrossSlot, never failed open.
func TestClusterCompositePrefix(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	customer := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 5, Name: "customer"}, Key: firstField}}
	route := Layer{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "route"}}}
	prefixes := []string{""}
	for n, from := 0, 0; n < 4; n++ {
		to := len(prefixes)
		for _, p := range prefixes[from:to] {
			for _, c := range "{}a" {
				prefixes = append(prefixes, p+string(c))
			}
		}
		from = to
	}
	prefixes = append(prefixes, "rl{", "rl{}", "rl{}x:", "rl{app}:", "{app}", "ratelimit:")
	requests := []string{"acme /a", "acme /b", "initech /a"}
	accepted, refused := 0, 0
	for _, prefix := range prefixes {
		c, err := NewComposite(rdb, []Layer{customer, route}, WithHashTag(firstField), WithPrefix(prefix), WithTimeout(5*time.Second))
		oneSlot := true
		for _, req := range requests {
			if cl.Slot(t, layerKey(t, prefix, req, 0)) != cl.Slot(t, layerKey(t, prefix, req, 1)) {
				oneSlot = false
			}
		}
		if oneSlot {
			require.NoError(t, err, "prefix %q: its layers share a slot", prefix)
			accepted++
			_, err := c.Check(requests[0], ratelimit.Unit)
			require.NoError(t, err, "prefix %q", prefix)
		} else {
			require.ErrorIs(t, err, ErrCrossSlot, "prefix %q: its layers are in different slots", prefix)
			require.ErrorContains(t, err, "prefix")
			refused++
		}
		// One layer never spans slots.
		_, err = NewComposite(rdb, []Layer{route}, WithPrefix(prefix))
		require.NoError(t, err, "prefix %q, one layer", prefix)
	}
	t.Logf("%d prefixes accepted, %d refused", accepted, refused)
	require.NotZero(t, refused)

	// A prefix's own tag holds every key, a Global layer's with the rest.
	global := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100, Name: "global"}, Key: func(string) string { return "all" }}, Global: true}
	tagged, err := NewComposite(rdb, []Layer{global, customer, route}, WithPrefix(testPrefix()+"{one}:"), WithTimeout(5*time.Second))
	require.NoError(t, err)
	for _, req := range requests {
		for i := range 3 {
			require.Equal(t, cl.Slot(t, "one"), cl.Slot(t, tagged.Key(i, req)))
		}
		d, err := tagged.Check(req, ratelimit.Unit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}

	// Keys the cluster refuses as CROSSSLOT at run time: refused, fail
	// open or not.
	broken, err := NewComposite(rdb, []Layer{customer, route}, WithHashTag(firstField), WithPrefix(testPrefix()), WithTimeout(5*time.Second))
	require.NoError(t, err)
	for i := range broken.layers {
		broken.layers[i].head = "rl{" + broken.layers[i].head
	}
	d, err := broken.Check(requests[0], ratelimit.Unit)
	require.ErrorIs(t, err, ErrCrossSlot)
	require.NotErrorIs(t, err, ErrUnavailable)
	require.False(t, d.Allowed, "failed open on CROSSSLOT")
	p, err := broken.Peek(requests[0], ratelimit.Unit)
	require.ErrorIs(t, err, ErrCrossSlot)
	require.False(t, p.Allowed, "a peek failed open on CROSSSLOT")
}

// layerKey is layer i's Redis key for req under prefix, as a Composite on a
// single-node client (which refuses no prefix) names it.
func layerKey(t *testing.T, prefix, req string, i int) string {
	t.Helper()
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	customer := Layer{Layer: ratelimit.Layer{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(4), Burst: 5, Name: "customer"}, Key: firstField}}
	route := Layer{Layer: ratelimit.Layer{Rule: ratelimit.FixedWindow{Limit: 2, Window: time.Second, Name: "route"}}}
	c, err := NewComposite(single, []Layer{customer, route}, WithHashTag(firstField), WithPrefix(prefix))
	require.NoError(t, err)
	return c.Key(i, req)
}
