package table

import (
	"flag"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

var (
	tail      = flag.Bool("tail", false, "run TestInsertTail, a latency harness (slow)")
	tailMax   = flag.Int("tailmax", 125_000, "TestInsertTail: the table's bound")
	tailGiven = flag.Bool("tailgiven", false, "TestInsertTail: give each insertion what it wants first, untimed, as the store does outside its lock")
	tailUsage = flag.Bool("tailusage", false, "TestInsertTail: time the thread's CPU time, not wall time, and count its page faults (Linux)")
)

// TestInsertTail times every Insert, on one goroutine and with no lock,
// while a table fills from empty to its bound (125,000 by default: one of
// the eight shards of a store bounded at 1,000,000 on two cores) and then
// takes as many keys again, each evicting another; an entry turns fresh
// 40,000 insertions after it came, so that sweeps find some. It reports
// the quantiles and the slowest insertions with what they did (a growth of
// the array, a split, a sweep, a compaction of an arena). With -tailgiven
// each insertion is first given what it wants (Wants, Make, Give), and
// only Wants and Insert are timed: what the store does with its shard's
// lock held. With -tailusage it times the thread's CPU time rather than
// wall time (what the machine gives other threads is left out; page faults
// and the collector's assists are not) and counts the page faults taken in
// the timed part. It asserts nothing about time: run it with
//
//	go test -run TestInsertTail -tail -tailmax 125000 -v -count 1 ./internal/table/
func TestInsertTail(t *testing.T) {
	if !*tail {
		t.Skip("a latency harness: run with -tail")
	}
	if *tailUsage {
		runtime.LockOSThread() // a thread's usage is the goroutine's
		defer runtime.UnlockOSThread()
	}
	// timed returns how long f took and the page faults it took.
	timed := func(f func()) (time.Duration, int64) {
		if !*tailUsage {
			start := time.Now()
			f()
			return time.Since(start), 0
		}
		cpu, faults := threadUsage()
		f()
		cpu1, faults1 := threadUsage()
		return cpu1 - cpu, faults1 - faults
	}
	var tb Table[int64]
	tb.Init(*tailMax, expired)
	keys := make([]string, 2**tailMax)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	type slow struct {
		d                           time.Duration
		i, n, grown, splits, faults int
		swept, compacted            bool
	}
	var slowest []slow
	var faults, faulted int64 // page faults in the timed parts, and insertions that took any
	lat := make([]int64, 0, len(keys))
	for i, k := range keys {
		tag := Tag(hash(k), false)
		sweeps, splits, compactions, size := tb.Stats.Sweeps, tb.Stats.Splits, tb.Stats.Compactions, tb.slotCount()
		var w Want
		var p *int64
		d, f := timed(func() {
			if *tailGiven {
				w = tb.Wants(tag, len(k))
			}
			if w.None() {
				p, _ = tb.Insert(k, tag, int64(i))
			}
		})
		if !w.None() { // as the store does: allocate untimed, then give and insert
			r := Make[int64](w)
			d1, f1 := timed(func() {
				tb.Give(r)
				p, _ = tb.Insert(k, tag, int64(i))
			})
			d, f = d+d1, f+f1
		}
		*p = int64(i + 40_000)
		lat = append(lat, int64(d))
		if faults += f; f > 0 {
			faulted++
		}
		slowest = append(slowest, slow{d, i, tb.n, tb.slotCount() - size, int(tb.Stats.Splits - splits), int(f), tb.Stats.Sweeps != sweeps, tb.Stats.Compactions != compactions})
		slices.SortFunc(slowest, func(a, b slow) int { return int(b.d - a.d) })
		slowest = slowest[:min(len(slowest), 10)]
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return time.Duration(lat[min(len(lat)-1, int(p*float64(len(lat))))]) }
	t.Logf("inserts %d  p50 %v  p99 %v  p99.9 %v  p99.99 %v  max %v  segments %d, directory %d",
		len(lat), q(0.5), q(0.99), q(0.999), q(0.9999), time.Duration(lat[len(lat)-1]), len(tb.segs), len(tb.dir))
	if *tailUsage {
		t.Logf("page faults in the timed parts %d, in %d insertions; allocations under the timing %d", faults, faulted, tb.Stats.Allocations)
	}
	for _, s := range slowest {
		t.Logf("%10v  insert %d  entries %d  slots grown by %d  splits %d  swept %v  compacted %v  faults %d", s.d, s.i, s.n, s.grown, s.splits, s.swept, s.compacted, s.faults)
	}
}

// slotCount returns the slots of every segment.
func (t *Table[S]) slotCount() int {
	n := 0
	for _, g := range t.segs {
		n += len(g.slots)
	}
	return n
}
