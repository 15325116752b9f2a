package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// BenchmarkPlansHeld checks keys their plan holds, through a Plans of a
// plan of one rule and of one of two layers, beside a Store and a
// Composite of the same rules, one check at a time (the cost of the
// record's read and expiry on one round trip).
func BenchmarkPlansHeld(b *testing.B) {
	if shared == nil {
		b.Skip("no redis-server")
	}
	rdb := shared.Client(func(o *redis.Options) { o.PoolSize = 4 })
	defer rdb.Close()
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1e6), Burst: 1e6}
	second := ratelimit.SlidingCounter{Limit: 1e9, Window: time.Hour}
	set := ratelimit.PlanSet{Default: "one", Plans: map[string]ratelimit.Plan{
		"one": {Rule: rule},
		"two": {Layers: []ratelimit.Layer{{Rule: rule}, {Rule: second}}},
	}}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	run := func(b *testing.B, check func(string) error) {
		for _, k := range keys {
			if err := check(k); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			if err := check(keys[i%len(keys)]); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, plan := range []string{"one", "two"} {
		b.Run("plans-"+plan, func(b *testing.B) {
			p, err := NewPlans(rdb, set, func(string) string { return plan }, WithPrefix(testPrefix()), WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			run(b, func(k string) error { _, err := p.Check(k, ratelimit.Unit); return err })
		})
	}
	b.Run("store", func(b *testing.B) {
		s, err := New(rdb, rule, WithPrefix(testPrefix()), WithTimeout(time.Second), WithDenyCache(0))
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err })
	})
	b.Run("composite", func(b *testing.B) {
		c, err := NewComposite(rdb, []Layer{{Layer: ratelimit.Layer{Rule: rule}}, {Layer: ratelimit.Layer{Rule: second}}}, WithPrefix(testPrefix()), WithTimeout(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(k string) error { _, err := c.Check(k, ratelimit.Unit); return err })
	})
}
