package load

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRuleBound(t *testing.T) {
	r := Rule{Burst: 20, Count: 10, Per: time.Second}
	tests := []struct {
		name string
		span time.Duration
		want int64
	}{
		{"no span", 0, 20},
		{"just under a tenth", 100*time.Millisecond - 1, 20},
		{"a tenth", 100 * time.Millisecond, 21},
		{"20 s", 20 * time.Second, 220},
		{"20 s less a nanosecond", 20*time.Second - 1, 219},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, r.Bound(tc.span))
		})
	}
	// 7 per 3 s: exact, not 2.33 a second.
	assert.Equal(t, int64(1+7), Rule{Burst: 1, Count: 7, Per: 3 * time.Second}.Bound(3*time.Second))
	assert.Equal(t, int64(1+6), Rule{Burst: 1, Count: 7, Per: 3 * time.Second}.Bound(3*time.Second-1))
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i))
	}
	assert.Equal(t, time.Duration(500), Quantile(d, 500))
	assert.Equal(t, time.Duration(990), Quantile(d, 990))
	assert.Equal(t, time.Duration(999), Quantile(d, 999))
	assert.Equal(t, time.Duration(7), Quantile([]time.Duration{7}, 999))
	assert.Equal(t, time.Duration(0), Quantile(nil, 500))
	// Nearest rank: of 10 values, p99 is the largest.
	assert.Equal(t, time.Duration(10), Quantile(d[:10], 990))
}

func TestPlanKeys(t *testing.T) {
	p := Plan{Keys: 100, Hot: 4, HotPercent: 30}
	counts := map[int]int{}
	hot := 0
	for i := range uint64(10_000) {
		k := p.key(i)
		counts[k]++
		if k < p.Hot {
			hot++
		}
	}
	assert.Equal(t, 3000, hot, "exactly HotPercent of the requests are hot")
	for k := range p.Hot {
		assert.Equal(t, 750, counts[k], "hot key %d", k)
	}
	for k := p.Hot; k < p.Keys; k++ {
		assert.InDelta(t, 7000/96, counts[k], 1, "cold key %d", k)
	}
	none := Plan{Keys: 10}
	for i := range uint64(20) {
		assert.Equal(t, int(i%10), none.key(i))
	}
}

func TestBounds(t *testing.T) {
	rule := Rule{Burst: 2, Count: 1, Per: time.Second}
	rec := func(key int32, sent, lat time.Duration, code uint16, by string) Record {
		return Record{Key: key, Sent: sent, Latency: lat, Code: code, By: by}
	}
	r := &Result{Records: []Record{
		// Key 0: 3 admitted within 1 s + 10 ms (bound 2 + 1 = 3), then refused.
		rec(0, 0, time.Millisecond, 200, "redis"),
		rec(0, 10*time.Millisecond, time.Millisecond, 200, "redis"),
		rec(0, time.Second, 10*time.Millisecond, 200, "redis"),
		rec(0, time.Second+20*time.Millisecond, time.Millisecond, 429, "redis"),
		// Key 1: 4 admitted within 1 s (bound 3), one by the failure policy.
		rec(1, 0, time.Millisecond, 200, "redis"),
		rec(1, time.Millisecond, time.Millisecond, 200, "redis"),
		rec(1, 2*time.Millisecond, time.Millisecond, 200, "fail-open"),
		rec(1, 900*time.Millisecond, 100*time.Millisecond, 200, "redis"),
	}}
	all := Bounds(r, rule, nil)
	assert.Equal(t, KeyBounds{Keys: 2, Over: 1, MaxOver: 1, MaxAdmitted: 4, MaxBound: 3, Ratio: 4.0 / 3, Refused: 1, MinSlack: 0}, all)
	redis := Bounds(r, rule, func(r Record) bool { return r.By == "redis" })
	assert.Zero(t, redis.Over)
	assert.Equal(t, int64(3), redis.MaxAdmitted)
}

func TestRecover(t *testing.T) {
	s := time.Second
	r := &Result{Records: []Record{
		{Replica: 0, Sent: 1 * s, Latency: 1, Code: 200, By: "redis"},                     // before the kill
		{Replica: 0, Sent: 3 * s, Latency: 1, Code: 200, By: "fail-open"},                 // the outage
		{Replica: 1, Sent: 3 * s, Latency: 1, Code: 429, By: "redis"},                     // the deny cache, during it
		{Replica: 0, Sent: 5*s + 100, Latency: 200, Code: 200, By: "redis"},               // back
		{Replica: 1, Sent: 5*s - 100, Latency: 500, Code: 200, By: "redis"},               // sent before, answered after
		{Replica: 1, Sent: 7 * s, Latency: 1, Code: 200, By: "fail-open"},                 // late
		{Replica: 0, Sent: 5*s + 50*time.Millisecond, Latency: 1, Code: 200, By: "redis"}, // not the first
	}}
	rc := Recover(r, 3, 2*s, 5*s)
	assert.Equal(t, []time.Duration{300, 400, -1}, rc.First)
	assert.Equal(t, []int{0, 1, 0}, rc.Late)
	assert.Equal(t, 1, rc.DuringOutage)
}

func TestSlope(t *testing.T) {
	got, ok := Slope([]float64{0, 1, 2, 3}, []float64{1, 3, 5, 7})
	assert.True(t, ok)
	assert.InDelta(t, 2.0, got, 1e-12)
	_, ok = Slope([]float64{1, 1}, []float64{1, 2})
	assert.False(t, ok)
	_, ok = Slope([]float64{1}, []float64{1})
	assert.False(t, ok)
}
