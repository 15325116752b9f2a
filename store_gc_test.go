package ratelimit_test

import (
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestStoreKeysCostCollectorNothing: a store of 200,000 keys, and a rule
// set's stores of as many, leave the garbage collector almost nothing to
// scan (under one byte a key of scannable heap, where slots that pointed at
// their keys' strings made the whole of every slot array scannable, 32
// bytes a key, and every key string an object to mark).
func TestStoreKeysCostCollectorNothing(t *testing.T) {
	const n = 200_000
	rule := ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}
	scannable := func() uint64 {
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	for _, sub := range []struct {
		name  string
		check func() func(string) error
	}{
		{"store", func() func(string) error {
			s, err := ratelimit.NewStore(rule, ratelimit.WithMaxKeys(n))
			require.NoError(t, err)
			return func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err }
		}},
		{"plans", func() func(string) error {
			set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{"free": {Rule: rule}, "pro": {Rule: rule}}, Default: "free"}
			p, err := ratelimit.NewPlans(set, func(k string) string { return [...]string{"free", "pro"}[len(k)%2] }, ratelimit.WithMaxKeys(n))
			require.NoError(t, err)
			return func(k string) error { _, err := p.Check(k, ratelimit.Unit); return err }
		}},
	} {
		before := scannable()
		check := sub.check()
		for i := range n {
			require.NoError(t, check("key-"+strconv.Itoa(i)))
		}
		after := scannable()
		t.Logf("%s: %d bytes of scannable heap more", sub.name, int64(after)-int64(before))
		require.Less(t, int64(after)-int64(before), int64(n), "%s: scannable heap per key", sub.name)
		runtime.KeepAlive(check)
	}
}

// TestStoreShardsShareTheBound: a store of many shards takes its whole
// bound of distinct keys without dropping one (its shards share the bound,
// rather than each hold its share), and drops one key for each key past
// it.
func TestStoreShardsShareTheBound(t *testing.T) {
	const bound = 50_000
	for _, shards := range []int{2, 256} {
		s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 10},
			ratelimit.WithMaxKeys(bound), ratelimit.WithShards(shards), ratelimit.WithClock(ratelimit.NewManualClock(0)))
		require.NoError(t, err)
		for i := range bound {
			_, err := s.Check("key-"+strconv.Itoa(i), ratelimit.Unit)
			require.NoError(t, err)
		}
		st := s.Stats()
		require.Zero(t, st.Evictions, "%d shards: keys dropped before the store was full", shards)
		require.Equal(t, bound, st.Keys)
		for i := range 1000 {
			_, err := s.Check("more-"+strconv.Itoa(i), ratelimit.Unit)
			require.NoError(t, err)
		}
		st = s.Stats()
		require.Equal(t, uint64(1000), st.Evictions, "%d shards", shards)
		require.Equal(t, bound, st.Keys)
	}
}
