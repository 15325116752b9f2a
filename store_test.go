package ratelimit_test

import (
	"crypto/sha256"
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// longKey is longer than MaxKeyLen, so the store keeps its digest.
var longKey = strings.Repeat("k", ratelimit.MaxKeyLen+1)

// storeKeys are the keys the store properties draw from: the empty key, a
// key of exactly MaxKeyLen bytes, two long keys that differ only in their
// last byte, a 1 MiB key, and the raw bytes of a long key's digest, which
// must not share an allowance with that long key.
var storeKeys = func() []string {
	sum := sha256.Sum256([]byte(longKey))
	return []string{
		"", "a", "b", "203.0.113.7",
		strings.Repeat("k", ratelimit.MaxKeyLen),
		longKey, longKey[:len(longKey)-1] + "j",
		strings.Repeat("m", 1<<20),
		string(sum[:]),
	}
}()

// monotonicClock is the clock of the single-key limiters a one-shard store
// is compared with: it clamps the shared clock to the latest reading any of
// them has seen, as the store's one shard does for all its keys.
type monotonicClock struct {
	c    ratelimit.Clock
	seen time.Duration
}

func (m *monotonicClock) Now() time.Duration {
	m.seen = max(m.seen, m.c.Now())
	return m.seen
}

// forwardActions moves the clock only forwards, saturating at MaxTime
// rather than wrapping around: the traces for stores whose keys must see
// the same times as independent limiters, which clamp time each on its own.
func forwardActions(clk *ratelimit.ManualClock, scale time.Duration) map[string]func(*rapid.T) {
	forward := func(d time.Duration) {
		clk.Set(clk.Now() + min(d, ratelimit.MaxTime-clk.Now()))
	}
	return map[string]func(*rapid.T){
		"advance": func(t *rapid.T) {
			forward(time.Duration(rapid.Int64Range(0, 2*min(int64(scale), int64(ratelimit.MaxTime))).Draw(t, "advance")))
		},
		"nudge": func(t *rapid.T) { forward(time.Duration(rapid.Int64Range(0, 3).Draw(t, "nudge"))) },
		"leap":  func(t *rapid.T) { forward(time.Duration(rapid.Int64Range(0, 2*int64(year)).Draw(t, "leap"))) },
	}
}

func sameError(t require.TestingT, want, got error) {
	for _, e := range []error{ratelimit.ErrInvalidCost, ratelimit.ErrCostExceedsCapacity} {
		require.Equal(t, errors.Is(want, e), errors.Is(got, e), "want %v, got %v", want, got)
	}
	require.Equal(t, want == nil, got == nil, "want %v, got %v", want, got)
}

// TestStoreMatchesLimiters: a store with room behaves exactly like one
// independent single-key limiter per key, for every algorithm, long keys
// and clocks that go backwards included.
func TestStoreMatchesLimiters(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alg := rapid.SampledFrom(testedAlgorithms).Draw(t, "algorithm")
		mc := alg.drawModelCase(t)
		shards := rapid.SampledFrom([]int{1, 2, 16}).Draw(t, "shards")
		clk := &traceClock{ManualClock: ratelimit.NewManualClock(0)}
		store, err := ratelimit.NewStore(mc.rule, ratelimit.WithClock(clk),
			ratelimit.WithShards(shards), ratelimit.WithMaxKeys(1<<16))
		if !mc.valid {
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			return
		}
		require.NoError(t, err)
		// With one shard the store clamps time across all keys; the
		// limiters then share one clamp too. With several, the clock only
		// moves forwards.
		var limClock ratelimit.Clock = clk
		actions := forwardActions(clk.ManualClock, mc.scale)
		if shards == 1 {
			limClock = &monotonicClock{c: clk, seen: math.MinInt64}
			actions = traceActions(clk, mc.scale)
		}
		// Every key's limiter is built before the trace starts, at time
		// 0: a limiter may read its clock when built (the lock-free
		// limiters take their base instant), and through the shared clamp
		// of one shard that read would count as an instant the store never
		// saw (a first check that fails its cost check records none).
		limiters := map[string]ratelimit.Limiter{}
		for _, key := range storeKeys {
			lim, err := ratelimit.New(mc.rule, ratelimit.WithClock(limClock))
			require.NoError(t, err)
			limiters[key] = lim
		}
		used := map[string]bool{}
		actions["check"] = func(t *rapid.T) {
			key := rapid.SampledFrom(storeKeys).Draw(t, "key")
			cost := drawCost(t, mc.model.Capacity())
			lim := limiters[key]
			used[key] = true
			want, werr := lim.Check(cost)
			got, gerr := store.Check(key, cost)
			sameError(t, werr, gerr)
			require.Equal(t, want, got, "key %.20q cost %d at %d", key, cost, clk.Now())
		}
		t.Repeat(actions)
		st := store.Stats()
		require.Zero(t, st.Evictions)
		require.LessOrEqual(t, st.Keys, len(used))
		require.Equal(t, uint64(st.Keys), st.Inserts)
	})
}

// TestStoreEvictionAccounting: in a store too small for its keys, every
// eviction is counted, a lossy one exactly when the key dropped was not
// fresh (by its own last Decision.ResetAfter), a dropped key starts again
// as a fresh key, and nothing else changes any key's decisions. A live key
// is dropped only when no other key is fresh, as a store this small sweeps
// for fresh keys before every eviction.
func TestStoreEvictionAccounting(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alg := rapid.SampledFrom(testedAlgorithms).Draw(t, "algorithm")
		mc := alg.drawModelCase(t)
		if !mc.valid {
			return
		}
		maxKeys := rapid.IntRange(1, 7).Draw(t, "maxKeys")
		clk := ratelimit.NewManualClock(0)
		store, err := ratelimit.NewStore(mc.rule, ratelimit.WithClock(clk), ratelimit.WithMaxKeys(maxKeys))
		require.NoError(t, err)
		require.Equal(t, 1, store.Stats().Shards)
		keys := storeKeys[:rapid.IntRange(1, len(storeKeys)).Draw(t, "keys")]

		type ref struct {
			lim     ratelimit.Limiter
			freshAt time.Duration // when the key's state is as good as a fresh key's
		}
		refs := map[string]*ref{}
		actions := forwardActions(clk, mc.scale)
		actions["check"] = func(t *rapid.T) {
			key := rapid.SampledFrom(keys).Draw(t, "key")
			cost := drawCost(t, mc.model.Capacity())
			now := clk.Now()
			before := store.Stats()
			anyFresh := false
			for k, r := range refs {
				require.True(t, ratelimit.StoreHolds(store, k), "key %.20q vanished outside an insertion", k)
				anyFresh = anyFresh || (k != key && r.freshAt <= now)
			}
			r := refs[key]
			if r == nil {
				lim, err := ratelimit.New(mc.rule, ratelimit.WithClock(clk))
				require.NoError(t, err)
				r = &ref{lim: lim}
			}
			want, werr := r.lim.Check(cost)
			got, gerr := store.Check(key, cost)
			sameError(t, werr, gerr)
			require.Equal(t, want, got, "key %.20q cost %d at %d", key, cost, now)
			if werr != nil {
				require.Equal(t, before, store.Stats(), "an invalid cost touches nothing")
				return
			}
			r.freshAt = now + got.ResetAfter
			if r.freshAt < now {
				r.freshAt = math.MaxInt64 // past the end of time
			}
			refs[key] = r
			after := store.Stats()
			var dropped, lossy uint64
			for k, rk := range refs {
				if k == key || ratelimit.StoreHolds(store, k) {
					continue
				}
				dropped++
				if rk.freshAt > now {
					lossy++
				}
				delete(refs, k) // it starts again as a fresh key
			}
			require.True(t, ratelimit.StoreHolds(store, key))
			require.LessOrEqual(t, after.Keys, maxKeys)
			require.Equal(t, len(refs), after.Keys)
			require.Equal(t, before.Evictions+dropped, after.Evictions)
			require.Equal(t, before.LossyEvictions+lossy, after.LossyEvictions)
			if lossy > 0 {
				require.False(t, anyFresh, "a partly spent key was dropped while a fresh one was held")
			}
		}
		t.Repeat(actions)
	})
}

// raceEnabled is set by store_race_test.go.
var raceEnabled bool

// TestStoreBoundUnderFlood sends 2,000,000 distinct keys (200,000 with
// -short or -race) into a store bounded at 50,000 (5,000).
func TestStoreBoundUnderFlood(t *testing.T) {
	n, bound, live := 2_000_000, 50_000, 10_000
	if testing.Short() || raceEnabled {
		n, bound, live = 200_000, 5_000, 1_000
	}
	clk := ratelimit.NewManualClock(0)
	// Refills 1 unit per ms: a key that spent 1 unit is fresh 1 ms later,
	// one that spent the whole burst only after 1,000 s.
	const burst = 1_000_000
	rule := ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1000), Burst: burst}
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithMaxKeys(bound), ratelimit.WithShards(8))
	require.NoError(t, err)
	heapBefore := liveHeap()

	check := func(key string, cost ratelimit.Units) ratelimit.Decision {
		d, err := store.Check(key, cost)
		require.NoError(t, err)
		return d
	}
	for i := range live {
		require.True(t, check("live-"+strconv.Itoa(i), burst*ratelimit.Unit).Allowed)
	}
	// Phase 1: one-off keys that spend 1 unit, 1 µs apart: each is fresh
	// 1,000 keys later. Only fresh keys may be evicted.
	for i := range n / 2 {
		clk.Advance(time.Microsecond)
		require.True(t, check("once-"+strconv.Itoa(i), ratelimit.Unit).Allowed)
		if i%10_000 == 0 {
			require.LessOrEqual(t, store.Len(), bound)
		}
	}
	st := store.Stats()
	require.LessOrEqual(t, st.Keys, bound)
	assert.Zero(t, st.LossyEvictions, "fresh keys must go before live ones")
	assert.Greater(t, st.Evictions, uint64(n/2-bound))
	for i := range live {
		require.True(t, ratelimit.StoreHolds(store, "live-"+strconv.Itoa(i)), "live key %d evicted", i)
	}
	d := check("live-0", ratelimit.Unit)
	assert.Less(t, d.Remaining, int64(burst/2), "the live key kept its spent state")

	// Phase 2: one-off keys that spend the whole burst, with the clock
	// standing still: nothing is fresh, so evictions are lossy and counted.
	for i := range n / 2 {
		require.True(t, check("spent-"+strconv.Itoa(i), burst*ratelimit.Unit).Allowed)
		if i%10_000 == 0 {
			require.LessOrEqual(t, store.Len(), bound)
		}
	}
	st2 := store.Stats()
	require.LessOrEqual(t, st2.Keys, bound)
	assert.Greater(t, st2.LossyEvictions, uint64(n/2-2*bound))
	assert.LessOrEqual(t, st2.LossyEvictions, st2.Evictions)
	assert.Equal(t, st2.Inserts-st2.Evictions, uint64(st2.Keys))

	// The heap holds the bounded store, not the keys that went through it.
	grown := int64(liveHeap()) - int64(heapBefore)
	t.Logf("%d keys through a store bounded at %d: heap grew %d bytes (%.0f per key held), %+v",
		n+live, bound, grown, float64(grown)/float64(st2.Keys), st2)
	assert.Less(t, grown, int64(bound)*256, "heap growth beyond the bound's worth")
	runtime.KeepAlive(store)
}

// TestStoreKeepsHotKeys: under a flood of one-off keys, keys that keep
// coming back stay (CLOCK).
func TestStoreKeepsHotKeys(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	rule := ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 10}
	const bound, hot, flood = 1000, 20, 50_000
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk), ratelimit.WithMaxKeys(bound), ratelimit.WithShards(1))
	require.NoError(t, err)
	for i := range flood {
		if i%100 == 0 {
			for h := range hot {
				d, err := store.Check("hot-"+strconv.Itoa(h), ratelimit.Unit)
				require.NoError(t, err)
				require.Equal(t, i/100 < 10, d.Allowed, "hot key %d kept its state", h)
			}
		}
		_, err := store.Check("once-"+strconv.Itoa(i), ratelimit.Unit)
		require.NoError(t, err)
	}
	st := store.Stats()
	assert.Equal(t, uint64(hot+flood), st.Inserts, "no hot key was ever dropped")
	assert.Equal(t, st.Evictions, st.LossyEvictions)
	assert.Equal(t, bound, st.Keys)
}

// TestStoreOneKeyConcurrent: 1,000 goroutines on one key with a limit of
// 100 admit exactly 100, for every algorithm.
func TestStoreOneKeyConcurrent(t *testing.T) {
	rules := []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 100},
		ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 100},
		ratelimit.LeakyBucket{Rate: ratelimit.PerHour(1), Capacity: 100},
		ratelimit.FixedWindow{Limit: 100, Window: time.Hour},
		ratelimit.SlidingCounter{Limit: 100, Window: time.Hour},
		ratelimit.SlidingLog{Limit: 100, Window: time.Hour},
	}
	for _, rule := range rules {
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(ratelimit.NewManualClock(time.Minute)))
		require.NoError(t, err)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 1000 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := store.Check("k", ratelimit.Unit)
				if err == nil && d.Allowed {
					admitted.Add(1)
				}
			}()
		}
		close(start)
		waitGroup(t, &wg, "the concurrent checks to finish")
		assert.Equal(t, int64(100), admitted.Load(), "%T", rule)
	}
}

// TestStoreManyKeysConcurrent: many goroutines on many keys, first with
// room (each key admits exactly its limit), then in a store far too small
// with a moving clock, for the race detector and the bound.
func TestStoreManyKeysConcurrent(t *testing.T) {
	const keys, workers, limit = 500, 16, 10
	rule := ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: limit}
	store, err := ratelimit.NewStore(rule, ratelimit.WithClock(ratelimit.NewManualClock(0)), ratelimit.WithShards(4))
	require.NoError(t, err)
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 * limit * keys / workers * 2 {
				k := (i*7 + w*31) % keys
				d, err := store.Check("key-"+strconv.Itoa(k), ratelimit.Unit)
				if err == nil && d.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	waitGroup(t, &wg, "the concurrent checks to finish")
	for k := range keys {
		assert.Equal(t, int64(limit), admitted[k].Load(), "key %d", k)
	}

	clk := ratelimit.NewManualClock(0)
	small, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(100), Burst: 5},
		ratelimit.WithClock(clk), ratelimit.WithMaxKeys(300), ratelimit.WithShards(4))
	require.NoError(t, err)
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Add(1)
	go func() {
		defer ticker.Done()
		for {
			select {
			case <-stop:
				return
			default:
				clk.Advance(time.Millisecond)
				runtime.Gosched()
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				_, err := small.Check("k"+strconv.Itoa((i*13+w)%2000), ratelimit.Unit)
				assert.NoError(t, err)
				if i%500 == 0 {
					assert.LessOrEqual(t, small.Len(), 300)
				}
			}
		}()
	}
	waitGroup(t, &wg, "the concurrent checks to finish")
	close(stop)
	waitGroup(t, &ticker, "the clock-moving goroutine to stop")
	st := small.Stats()
	assert.LessOrEqual(t, st.Keys, 300)
	assert.Equal(t, st.Inserts-st.Evictions, uint64(st.Keys))
}

// TestStoreCheckAllocs: Check on a key the store holds allocates nothing.
func TestStoreCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	rules := []ratelimit.Rule{
		ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 1_000_000},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1_000_000},
		ratelimit.GCRA{Rate: ratelimit.PerSecond(3), Burst: 1_000_000},
		ratelimit.LeakyBucket{Rate: ratelimit.PerSecond(1), Capacity: 1_000_000},
		ratelimit.FixedWindow{Limit: 1_000_000, Window: time.Minute},
		ratelimit.SlidingCounter{Limit: 1_000_000, Window: time.Minute},
		ratelimit.SlidingLog{Limit: 1_000_000, Window: time.Minute},
	}
	for _, rule := range rules {
		clk := ratelimit.NewManualClock(0)
		store, err := ratelimit.NewStore(rule, ratelimit.WithClock(clk))
		require.NoError(t, err)
		keys := []string{"a", "203.0.113.7", strings.Repeat("k", ratelimit.MaxKeyLen)}
		for _, k := range keys {
			_, err := store.Check(k, ratelimit.Unit)
			require.NoError(t, err)
		}
		i := 0
		allocs := testing.AllocsPerRun(1000, func() {
			d, err := store.Check(keys[i%len(keys)], ratelimit.Unit)
			if err != nil || !d.Allowed {
				t.Fatal(d, err)
			}
			i++
		})
		assert.Zero(t, allocs, "%T", rule)
	}
}

// TestStoreLongKeys: a key longer than MaxKeyLen costs the store its
// digest, not its length, and keeps its own allowance.
func TestStoreLongKeys(t *testing.T) {
	clk := ratelimit.NewManualClock(0)
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 1}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	before := liveHeap()
	for i := range 20 {
		huge := strings.Repeat("x", 1<<20) + strconv.Itoa(i)
		d, err := store.Check(huge, ratelimit.Unit)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "each long key has its own allowance")
		d, err = store.Check(huge, ratelimit.Unit)
		require.NoError(t, err)
		assert.False(t, d.Allowed, "the same long key again shares it")
	}
	grown := int64(liveHeap()) - int64(before)
	assert.Less(t, grown, int64(1<<20), "the store kept a 1 MiB key")
	assert.Equal(t, 20, store.Len())
	runtime.KeepAlive(store)
}

func TestStoreCostErrors(t *testing.T) {
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 5, Name: "api"},
		ratelimit.WithClock(ratelimit.NewManualClock(0)))
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cost ratelimit.Units
		want error
	}{
		{"zero", 0, ratelimit.ErrInvalidCost},
		{"negative", -ratelimit.Unit, ratelimit.ErrInvalidCost},
		{"above capacity", 5*ratelimit.Unit + 1, ratelimit.ErrCostExceedsCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := store.Check("k", tc.cost)
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, ratelimit.Decision{Limit: 5, Policy: "api", Window: 5 * time.Second}, d)
			assert.Zero(t, store.Len(), "an invalid cost never adds its key")
		})
	}
}

// TestStoreClockBackwards: each key sees time only move forwards, even when
// the clock goes back between checks of different keys in one shard.
func TestStoreClockBackwards(t *testing.T) {
	clk := ratelimit.NewManualClock(10 * time.Second)
	store, err := ratelimit.NewStore(ratelimit.TokenBucket{Rate: ratelimit.PerSecond(1), Burst: 2},
		ratelimit.WithClock(clk), ratelimit.WithShards(1))
	require.NoError(t, err)
	check := func(key string) ratelimit.Decision {
		d, err := store.Check(key, 2*ratelimit.Unit)
		require.NoError(t, err)
		return d
	}
	require.True(t, check("a").Allowed)
	clk.Set(9 * time.Second) // back: taken as 10 s
	d := check("a")
	require.False(t, d.Allowed)
	assert.Equal(t, 2*time.Second, d.RetryAfter, "time did not go back for the key")
	clk.Set(-time.Hour)
	require.True(t, check("b").Allowed, "a new key at the shard's latest time")
	clk.Set(12 * time.Second)
	require.True(t, check("a").Allowed)
}

func TestStoreOptions(t *testing.T) {
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}
	for _, tc := range []struct {
		name   string
		opts   []ratelimit.Option
		err    error
		max    int
		shards int
	}{
		{"defaults", nil, nil, ratelimit.DefaultMaxKeys, -1},
		{"max keys", []ratelimit.Option{ratelimit.WithMaxKeys(5000), ratelimit.WithShards(8)}, nil, 5000, 8},
		{"small default shards", []ratelimit.Option{ratelimit.WithMaxKeys(300)}, nil, 300, 1},
		{"rounded up", []ratelimit.Option{ratelimit.WithShards(5)}, nil, ratelimit.DefaultMaxKeys, 8},
		{"at most one per key", []ratelimit.Option{ratelimit.WithMaxKeys(3), ratelimit.WithShards(64)}, nil, 3, 2},
		{"zero keys", []ratelimit.Option{ratelimit.WithMaxKeys(0)}, ratelimit.ErrInvalidOption, 0, 0},
		{"too many keys", []ratelimit.Option{ratelimit.WithMaxKeys(1<<40 + 1)}, ratelimit.ErrInvalidOption, 0, 0},
		{"zero shards", []ratelimit.Option{ratelimit.WithShards(0)}, ratelimit.ErrInvalidOption, 0, 0},
		{"too many shards", []ratelimit.Option{ratelimit.WithShards(1<<16 + 1)}, ratelimit.ErrInvalidOption, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ratelimit.NewStore(rule, tc.opts...)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				assert.Nil(t, s)
				return
			}
			require.NoError(t, err)
			st := s.Stats()
			assert.Equal(t, tc.max, st.MaxKeys)
			if tc.shards > 0 {
				assert.Equal(t, tc.shards, st.Shards)
			}
			assert.Equal(t, st.Shards&(st.Shards-1), 0, "a power of two")
		})
	}
	_, err := ratelimit.NewStore(ratelimit.GCRA{})
	require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
	_, err = ratelimit.NewStore(nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
}

// TestStorePreallocationFillsWithoutAllocating: a store built
// WithPreallocation takes its memory when it is built, and filling it to
// 90% of its bound (each shard's share then stays under the shard's bound)
// allocates (almost) nothing, where a store without it allocates its
// segments as it fills.
func TestStorePreallocationFillsWithoutAllocating(t *testing.T) {
	const bound = 100_000
	keys := make([]string, bound*9/10)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}
	fill := func(opts ...ratelimit.Option) (built, filled uint64) {
		var m0, m1, m2 runtime.MemStats
		runtime.ReadMemStats(&m0)
		s, err := ratelimit.NewStore(rule, append(opts, ratelimit.WithMaxKeys(bound), ratelimit.WithShards(4))...)
		require.NoError(t, err)
		runtime.ReadMemStats(&m1)
		for _, k := range keys {
			d, err := s.Check(k, ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		runtime.ReadMemStats(&m2)
		require.Equal(t, len(keys), s.Len())
		require.Zero(t, s.Stats().Evictions)
		return m1.TotalAlloc - m0.TotalAlloc, m2.Mallocs - m1.Mallocs
	}
	builtPre, fillPre := fill(ratelimit.WithPreallocation())
	builtLazy, fillLazy := fill()
	assert.Greater(t, builtPre, uint64(bound*32), "a preallocated store takes its memory when built")
	assert.Less(t, builtLazy, uint64(bound), "a store without it does not")
	assert.LessOrEqual(t, fillPre, uint64(8), "filling a preallocated store allocated")
	assert.Greater(t, fillLazy, uint64(100), "a store without it allocates its segments as it fills")
}

// TestStoreHoldMarksInsertions: a composite's turn on a shard (the shard
// locked, its key acquired) marks the shard as held by an insertion when it
// adds its key, or when the last hold added one, as a check does, so that
// the checks waiting for it spin; when it unlocks it clears the mark,
// unless it added its key: then the mark stays for the next hold to take
// over, so that a check waiting for the lock keeps spinning as the lock
// passes from one insertion to the next.
func TestStoreHoldMarksInsertions(t *testing.T) {
	s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}, ratelimit.WithMaxKeys(1000), ratelimit.WithShards(1))
	require.NoError(t, err)
	for _, step := range []struct {
		key           string
		marked, after bool
		why           string
	}{
		{"a", true, true, "adds its key"},
		{"a", true, false, "follows a hold that added its key"},
		{"a", false, false, "finds its key, after a hold that found its own"},
		{"b", true, true, "adds its key again"},
		{"b", true, false, "finds its key after that"},
	} {
		held, after := ratelimit.StoreHoldMarks(s, step.key)
		require.Equal(t, step.marked, held, "a hold that %s", step.why)
		require.Equal(t, step.after, after, "marked after a hold that %s", step.why)
	}
	_, err = s.Check("c", ratelimit.Unit) // a check that adds its key ...
	require.NoError(t, err)
	held, _ := ratelimit.StoreHoldMarks(s, "a") // ... makes the next hold count as one
	require.True(t, held, "a hold that follows a check that added its key")
}

// TestStorePreallocationChurnsWithoutAllocating: a preallocated store at
// its bound, taking new keys while its old ones turn fresh as time passes
// (so that sweeps keep dropping some, and the store keeps falling a little
// below its bound and filling again), allocates nothing: its segments make
// room in themselves rather than grow once the store has first been full.
// It loses no more spent keys doing so than a store that allocates as it
// goes.
func TestStorePreallocationChurnsWithoutAllocating(t *testing.T) {
	const bound = 200_000
	keys := make([]string, 3*bound)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	// A check's debt is 600 ms, so a key turns fresh 171,429 checks later.
	rule := ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100}
	churn := func(opts ...ratelimit.Option) (mallocs uint64, st ratelimit.StoreStats) {
		clock := ratelimit.NewManualClock(0)
		s, err := ratelimit.NewStore(rule, append(opts, ratelimit.WithMaxKeys(bound), ratelimit.WithShards(32), ratelimit.WithClock(clock))...)
		require.NoError(t, err)
		var m0, m1 runtime.MemStats
		for i, k := range keys {
			if i == bound {
				runtime.ReadMemStats(&m0)
			}
			d, err := s.Check(k, ratelimit.Unit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clock.Advance(3500 * time.Nanosecond)
		}
		runtime.ReadMemStats(&m1)
		st = s.Stats()
		require.LessOrEqual(t, st.Keys, bound)
		return m1.Mallocs - m0.Mallocs, st
	}
	mallocsPre, pre := churn(ratelimit.WithPreallocation())
	mallocsLazy, lazy := churn()
	assert.LessOrEqual(t, mallocsPre, uint64(8), "a preallocated store churning allocated")
	assert.Greater(t, mallocsLazy, uint64(100), "a store without it allocates as it churns")
	assert.Greater(t, pre.Sweeps, uint64(100), "the churn swept fresh keys")
	assert.LessOrEqual(t, pre.LossyEvictions, lazy.LossyEvictions+lazy.LossyEvictions/2+50, "spent keys lost")
	assert.Greater(t, pre.Keys, bound*97/100, "keys held")
}

// TestStoreInsertionMarkCleared: the mark that makes checks waiting for a
// shard's lock spin rather than park is cleared by every check that set
// it and added no key, from one goroutine or many; a check that added its
// key leaves it for the next hold, which clears it if it adds none. A
// mark left set past a hold that added nothing would make every later
// wait for that shard spin.
func TestStoreInsertionMarkCleared(t *testing.T) {
	s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(10), Burst: 10}, ratelimit.WithMaxKeys(1000), ratelimit.WithShards(2))
	require.NoError(t, err)
	check := func(k string) {
		_, err := s.Check(k, ratelimit.Unit)
		require.NoError(t, err)
	}
	check("new")
	require.True(t, ratelimit.StoreSpinning(s), "an insertion leaves the mark for the next hold")
	check("new") // follows an insertion: marked from the start, found
	require.False(t, ratelimit.StoreSpinning(s), "after a check that followed an insertion")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				k := "k" + strconv.Itoa(i%1500)
				if g%2 == 0 {
					k = "hot"
				}
				if _, err := s.Check(k, ratelimit.Unit); err != nil {
					panic(err)
				}
			}
		}()
	}
	wg.Wait()
	clearMarks(t, func(k string) error { _, err := s.Check(k, ratelimit.Unit); return err })
	require.False(t, ratelimit.StoreSpinning(s), "after concurrent checks with evictions")
}

// clearMarks checks each of 64 keys twice in a row with check, a store's:
// the second check of each finds its key, so the last hold of every shard
// (of two, in these tests: one is missed with odds of 2^-63) adds no key,
// and clears the shard's mark if a check left it set.
func clearMarks(t *testing.T, check func(string) error) {
	t.Helper()
	for i := range 64 {
		k := "clear-" + strconv.Itoa(i)
		require.NoError(t, check(k))
		require.NoError(t, check(k))
	}
}

// TestStoreAllocatesOutsideItsLocks: a store that allocates as it fills
// and churns (its segments' first arrays, growths, splits, the arenas of
// keys of every length, digests of long keys) allocates none of it while
// it holds a shard's lock: a check whose key's insertion would allocate
// lets go of the lock, allocates, and takes it again, so that a
// collection's assist or a page fault charged to the allocation stops no
// other check. The same for every rule's state (the sliding log's holds a
// pointer), and for a preallocated store, whose longer keys grow arenas.
func TestStoreAllocatesOutsideItsLocks(t *testing.T) {
	const bound = 20_000
	rules := []ratelimit.Rule{
		ratelimit.GCRA{Rate: ratelimit.PerMinute(100), Burst: 100},
		ratelimit.SlidingLog{Limit: 5, Window: time.Minute},
		ratelimit.SlidingCounter{Limit: 5_000_000, Window: time.Minute},
	}
	for _, rule := range rules {
		for _, pre := range []bool{false, true} {
			opts := []ratelimit.Option{ratelimit.WithMaxKeys(bound), ratelimit.WithShards(4), ratelimit.WithClock(ratelimit.NewManualClock(0))}
			if pre {
				opts = append(opts, ratelimit.WithPreallocation())
			}
			s, err := ratelimit.NewStore(rule, opts...)
			require.NoError(t, err)
			built := ratelimit.StoreAllocations(s)
			for i := range 3 * bound {
				k := "key-" + strconv.Itoa(i) + strings.Repeat("x", i%(ratelimit.MaxKeyLen+10))
				_, err := s.Check(k, ratelimit.Unit)
				require.NoError(t, err)
			}
			st := s.Stats()
			require.Greater(t, st.Evictions, uint64(bound), "the store churned")
			assert.Equal(t, built, ratelimit.StoreAllocations(s), "%T, preallocated %v: allocated under a shard's lock", rule, pre)
		}
	}
}

// TestStoreShardsShareTheBound: a store of many shards takes its whole
// bound of distinct keys without dropping one (its shards share the bound,
// rather than each hold its share: a shard of 64 would then hold 3,125
// keys, and about half would be full before the store), drops one key for
// each key past it, and never reports more keys than its bound. So does a
// preallocated store, whose shards are many by default.
func TestStoreShardsShareTheBound(t *testing.T) {
	const bound = 200_000 // 3,125 keys a shard at 64, 7 standard deviations above 7/8 of that
	for _, opts := range [][]ratelimit.Option{
		{ratelimit.WithShards(2)},
		{ratelimit.WithShards(64)},
		{ratelimit.WithPreallocation()},
	} {
		opts = append(opts, ratelimit.WithMaxKeys(bound), ratelimit.WithClock(ratelimit.NewManualClock(0)))
		s, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerHour(1), Burst: 10}, opts...)
		require.NoError(t, err)
		shards := s.Stats().Shards
		for i := range bound {
			_, err := s.Check("key-"+strconv.Itoa(i), ratelimit.Unit)
			require.NoError(t, err)
		}
		st := s.Stats()
		require.Zero(t, st.Evictions, "%d shards: keys dropped before the store was full", shards)
		require.Equal(t, bound, st.Keys, "%d shards", shards)
		for i := range 1000 {
			_, err := s.Check("more-"+strconv.Itoa(i), ratelimit.Unit)
			require.NoError(t, err)
		}
		st = s.Stats()
		require.Equal(t, uint64(1000), st.Evictions, "%d shards", shards)
		require.Equal(t, bound, st.Keys, "%d shards", shards)
	}
}
