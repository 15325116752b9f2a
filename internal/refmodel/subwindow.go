package refmodel

import (
	"math/big"
	"time"

	"github.com/ratekit/ratelimit"
)

// SubWindow is the sub-window counter from its definition: buckets
// [jG, (j+1)G) with G = window/buckets; at t the count is what the buckets
// that begin in (t - window, t] hold; admit iff count + cost <= Limit. With
// countRefused a denied cost is counted too, in t's bucket, up to the limit.
type SubWindow struct {
	windows        // per bucket: windows.w is the bucket's length
	k       uint64 // buckets per window
}

// NewSubWindow returns a model of a fresh key; window must be a multiple of
// buckets.
func NewSubWindow(limit int64, window time.Duration, buckets int, countRefused bool) *SubWindow {
	m := &SubWindow{windows: newWindows(limit, window/time.Duration(buckets)), k: uint64(buckets)}
	m.refused = countRefused
	return m
}

// estimate is the count at t, straight from the definition: every bucket
// j with t - window < jG <= t.
func (m *SubWindow) estimate(t uint64) *big.Rat {
	sum := new(big.Rat)
	window := m.k * m.w
	for j, n := range m.counts {
		if start := j * m.w; start <= t && start+window > t {
			sum.Add(sum, rat(n))
		}
	}
	return sum
}

// Step implements Model.
func (m *SubWindow) Step(now, cost int64) ratelimit.Decision {
	// The count is constant inside a bucket and only falls as buckets
	// leave; k buckets on, nothing counted now counts.
	return m.decide(now, cost, m.k, m.estimate)
}

// Spent implements Migrator: the count at now, at most the limit.
func (m *SubWindow) Spent(now int64) int64 {
	return min(ceilInt(m.estimate(uint64(now))), m.Capacity())
}

// SetSpent implements Migrator.
func (m *SubWindow) SetSpent(now, x int64) {
	m.counts = map[uint64]int64{uint64(now) / m.w: x}
}
