package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
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
	rdb := cl.client(t, nil)
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
		s0, s1 := cl.slot(t, got.Key(0, req)), cl.slot(t, got.Key(1, req))
		require.Equal(t, s0, s1, "layers of %q in slots %d and %d", req, s0, s1)
		masters[cl.owner(t, s0).addr()] = true
	}
	require.Len(t, masters, 3, "requests did not spread over every master")

	admitted, refused := 0, 0
	for step := range 30 {
		for _, req := range requests {
			w, werr := want.Check(req, ratelimit.Unit)
			g, gerr := got.Check(req, ratelimit.Unit)
			require.NoError(t, werr)
			require.NoError(t, gerr)
			require.Equal(t, w, g, "step %d request %q", step, req)
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
