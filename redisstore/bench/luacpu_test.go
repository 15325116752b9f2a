package bench

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore"
)

// TestLuaCPU compares the Redis CPU per check of the store's GCRA with that
// of another build of its step library and with redis_rate's, on one
// redis-server, so that load on the machine weighs on all alike. It runs
// only with LUACPU_OLD naming the other build's assembled library
// (redisstore/testdata/step_function.lua of that build, whose GCRA check
// takes the arguments alg, now, cost, margin, pace, tau, tau's fraction,
// the cost's span and its fraction). Each round runs a block of checks of
// each subject in turn, from the same goroutines over 10,000 keys (a prefix
// per subject), and takes each block's share from INFO commandstats deltas
// around it; a round alternates such blocks many times, and logs each
// subject's median µs per call over its blocks and the ratios of medians.
// It also times each block from the client's side, so that each subject's
// checks per second (the median of its blocks') are compared in the same
// alternation: the new store's, which verifies every reply, against
// redis_rate's (the other build's raw FCALL does no work of the client's).
//
// With LUACPU_OUT naming a file, it also writes there what it logs of
// the rounds, after a header naming the other build; docs/redis-luacpu.txt
// is such a file:
//
//	git show <commit>:redisstore/testdata/step_function.lua > /tmp/old.lua
//	LUACPU_OLD=/tmp/old.lua LUACPU_OUT=../../docs/redis-luacpu.txt go test -run TestLuaCPU -v -count=1 .
func TestLuaCPU(t *testing.T) {
	path := os.Getenv("LUACPU_OLD")
	if path == "" {
		t.Skip("LUACPU_OLD names the other build's step_function.lua")
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The file's header comments come before the library's first line.
	if i := strings.Index(string(src), "#!lua"); i > 0 {
		src = src[i:]
	}
	m := regexp.MustCompile(`register_function\('([^']+)'`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no function registered in " + path)
	}
	oldFn := string(m[1])
	rounds, cycles, block := 5, 30, 400
	if v, err := strconv.Atoi(os.Getenv("LUACPU_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	ctx := context.Background()
	rdb, admin := client(t, 64), client(t, 1)
	if err := admin.FunctionLoadReplace(ctx, string(src)).Err(); err != nil {
		t.Fatal(err)
	}
	rule := ratelimit.GCRA{Rate: ratelimit.PerSecond(1000), Burst: 1000}
	s, err := redisstore.New(rdb, rule, redisstore.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mc, err := ratelimit.NewMachine(rule)
	if err != nil {
		t.Fatal(err)
	}
	p := mc.Params()
	ns, frac := mc.Span(ratelimit.Unit)
	oldArgs := []any{"m", "", strconv.FormatInt(int64(ratelimit.Unit), 10), "1000",
		u(p.RateUnits), u(p.TauNanos), u(p.TauFrac), u(ns), u(frac)}
	t.Logf("the other build's arguments: %v", oldArgs)
	rl, limit := redis_rate.NewLimiter(rdb), redis_rate.PerSecond(1000)
	subs := []struct {
		name string
		cmd  string
		fn   func(k int) error
	}{
		{"old", "fcall", func(k int) error {
			return rdb.FCall(ctx, oldFn, []string{"luacpu-old:{" + strconv.Itoa(k) + "}"}, oldArgs...).Err()
		}},
		{"new", "fcall", func(k int) error {
			_, err := s.CheckContext(ctx, "new"+strconv.Itoa(k), ratelimit.Unit)
			return err
		}},
		{"redis_rate", "evalsha", func(k int) error {
			_, err := rl.Allow(ctx, "rr"+strconv.Itoa(k), limit)
			return err
		}},
	}
	for _, sub := range subs { // warm up: loads the scripts
		if err := sub.fn(0); err != nil {
			t.Fatal(sub.name, err)
		}
	}
	var out []string
	logf := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		t.Log(line)
		out = append(out, line)
	}
	la, _ := os.ReadFile("/proc/loadavg")
	logf("load average at start: %s", strings.TrimSpace(string(la)))
	for _, workers := range []int{8, 64} {
		for r := 0; r < rounds; r++ {
			usec, rate := map[string][]float64{}, map[string][]float64{}
			for c := 0; c < cycles; c++ {
				for i := range subs {
					sub := subs[(i+c)%len(subs)]
					calls0, us0 := cmdStat(t, admin, sub.cmd)
					start := time.Now()
					var wg sync.WaitGroup
					var failed error
					var mu sync.Mutex
					for w := 0; w < workers; w++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := w; i < block; i += workers {
								if err := sub.fn((i*7 + c*block + r) % 10000); err != nil {
									mu.Lock()
									failed = err
									mu.Unlock()
									return
								}
							}
						}()
					}
					wg.Wait()
					rate[sub.name] = append(rate[sub.name], float64(block)/time.Since(start).Seconds())
					if failed != nil {
						t.Fatal(sub.name, failed)
					}
					calls1, us1 := cmdStat(t, admin, sub.cmd)
					usec[sub.name] = append(usec[sub.name], float64(us1-us0)/float64(calls1-calls0))
				}
			}
			o, n, rr := median(usec["old"]), median(usec["new"]), median(usec["redis_rate"])
			nc, rc := median(rate["new"]), median(rate["redis_rate"])
			logf("w%d round %d: old %.2f new %.2f redis_rate %.2f µs/call; new/redis_rate %.3f old/redis_rate %.3f new/old %.3f; checks/s new %.0f redis_rate %.0f, new/redis_rate %.3f",
				workers, r+1, o, n, rr, n/rr, o/rr, n/o, nc, rc, nc/rc)
		}
	}
	la, _ = os.ReadFile("/proc/loadavg")
	logf("load average at end: %s", strings.TrimSpace(string(la)))
	if path := os.Getenv("LUACPU_OUT"); path != "" {
		head := []string{
			"Written by TestLuaCPU (redisstore/bench/luacpu_test.go): Redis CPU per check from INFO commandstats,",
			"and checks per second timed by the client, in blocks of " + strconv.Itoa(block) + " checks of each subject in turn,",
			strconv.Itoa(cycles) + " blocks of each per round, GCRA 1,000/s burst 1,000 over 10,000 keys; each figure is a",
			"subject's median over the round's blocks. new is this build's Store; old is the library " + oldFn + ",",
			"called with FCALL alone; redis_rate is redis_rate v10's Allow.",
			"",
		}
		if err := os.WriteFile(path, []byte(strings.Join(append(head, out...), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// cmdStat returns the calls and µs INFO commandstats reports for cmd.
func cmdStat(t *testing.T, admin *redis.Client, cmd string) (calls, usec int64) {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		if m[1] == cmd {
			calls, _ = strconv.ParseInt(m[2], 10, 64)
			usec, _ = strconv.ParseInt(m[3], 10, 64)
			return calls, usec
		}
	}
	t.Fatalf("no %s in commandstats", cmd)
	return 0, 0
}

// median returns the median of v, which it sorts.
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }
