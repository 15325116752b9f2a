package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/require"
)

// TestClusterStore: a Store on a Cluster client of three masters puts each
// key's state in the slot of its hash tag, spreads keys over every master,
// and gives the Decisions of a Store on one node and of the in-process
// store on the same trace.
func TestClusterStore(t *testing.T) {
	cl := startCluster(t)
	rdb := cl.Client(t, nil)
	single := needRedis(t)
	rules := []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerSecond(2), Burst: 3, Name: "gcra"},
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(5), Burst: 4},
		ratelimit.FixedWindow{Limit: 3, Window: time.Second},
		ratelimit.SlidingCounter{Limit: 3, Window: time.Second},
		ratelimit.SlidingLog{Limit: 3, Window: time.Second},
	}
	for _, rule := range rules {
		t.Run(fmt.Sprintf("%T", rule), func(t *testing.T) {
			clk := ratelimit.NewManualClock(unixNow)
			prefix := testPrefix()
			onCluster, err := New(rdb, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
			require.NoError(t, err)
			onNode, err := New(single, rule, WithClock(clk), WithPrefix(prefix), WithTimeout(5*time.Second))
			require.NoError(t, err)
			local, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
			require.NoError(t, err)

			const keys = 60
			perNode := map[string]int{}
			for i := range keys {
				key := fmt.Sprintf("user-%d", i)
				rk := onCluster.Key(key)
				tag := rk[strings.IndexByte(rk, '{')+1 : len(rk)-1]
				slot := cl.Slot(t, rk)
				require.Equal(t, cl.Slot(t, tag), slot, "%s is not in its tag's slot", rk)
				perNode[cl.Owner(t, slot).Addr()]++
			}
			for step := range 40 {
				for i := range keys {
					key := fmt.Sprintf("user-%d", i)
					cost := ratelimit.Unit * ratelimit.Units(1+(i+step)%2)
					want, werr := local.Check(key, cost)
					before := onCluster.Stats().LocalDenials
					got, gerr := onCluster.Check(key, cost)
					node, nerr := onNode.Check(key, cost)
					require.NoError(t, werr)
					require.NoError(t, gerr)
					require.NoError(t, nerr)
					if onCluster.Stats().LocalDenials > before {
						requireCachedRefusal(t, want, got, "step %d key %s: cluster's cache vs in-process", step, key)
					} else {
						require.Equal(t, want, got, "step %d key %s: cluster vs in-process", step, key)
					}
					require.Equal(t, node, got, "step %d key %s: cluster vs one node", step, key)
				}
				clk.Advance(time.Duration(step%5) * 97 * time.Millisecond)
			}
			// Every key's state is where its slot says, and every master
			// holds some.
			ctx := context.Background()
			for _, n := range cl.Nodes {
				c := n.Client(nil)
				found, err := c.Keys(ctx, prefix+"*").Result()
				c.Close()
				require.NoError(t, err)
				require.Equal(t, perNode[n.Addr()], len(found), "keys on %s", n.Addr())
				require.NotZero(t, len(found), "no key on master %s", n.Addr())
			}
			t.Logf("%d keys over three masters: %v", keys, perNode)
			st := onCluster.Stats()
			require.Zero(t, st.Mismatches+st.InvalidStates+st.Failures)
		})
	}
}
