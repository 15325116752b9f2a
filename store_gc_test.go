package ratelimit_test

import (
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// TestStoreKeysCostCollectorNothing: 200,000 keys in a store, and in a rule
// set's stores, leave the garbage collector almost nothing to scan (under
// one byte a key of scannable heap more than the empty stores', where slots that pointed at
// their keys' strings made the whole of every slot array scannable, 32
// bytes a key, and every key string an object to mark).
func TestStoreKeysCostCollectorNothing(t *testing.T) {
	const n = 200_000
	rule := ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}
	scannable := func() uint64 {
		runtime.GC()
		return metricUint64("/gc/scan/heap:bytes")
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
		// An empty store's shards are scannable whether or not keys
		// come (their tables' headers): what is counted is what the keys
		// add.
		check := sub.check()
		before := scannable()
		for i := range n {
			require.NoError(t, check("key-"+strconv.Itoa(i)))
		}
		after := scannable()
		t.Logf("%s: %d bytes of scannable heap more", sub.name, int64(after)-int64(before))
		require.Less(t, int64(after)-int64(before), int64(n), "%s: scannable heap per key", sub.name)
		runtime.KeepAlive(check)
	}
}

// metricUint64 reads the runtime metric of that name, one whose value is a
// uint64 (runtime/metrics).
func metricUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
