package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/internal/exampleserver"
	"github.com/ratekit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplicasShareLockout: 5 wrong passwords from one address, sent round
// robin to three replicas, lock the address out on all three: a sixth try
// on any replica is 429 with the exact time left, 15 minutes, in
// Retry-After; the right password does not get through either.
func TestReplicasShareLockout(t *testing.T) {
	needRedis(t)
	urls := replicas(t, 3)
	client := &http.Client{Timeout: 5 * time.Second}
	login := func(base, password string) *http.Response {
		resp, err := client.PostForm(base+"/login", url.Values{"password": {password}})
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for i := range 5 {
		resp := login(urls[i%3], "guess")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "wrong password %d", i+1)
	}
	for _, base := range urls {
		for _, password := range []string{"guess", "letmein"} {
			resp := login(base, password)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s after 5 failures", base)
			assert.Equal(t, "900", resp.Header.Get("Retry-After"))
			var body map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			assert.Equal(t, "locked_out", body["error"])
			assert.Equal(t, float64(900_000), body["retry_after_ms"], "the exact time left")
		}
	}
}

// TestReplicasShareInFlight: quotes of one key sent at once to three
// replicas, each quote held in progress until the test lets it go: never
// more than 4 are in progress across the three, 4 are, and the others are
// refused with 429 at once.
func TestReplicasShareInFlight(t *testing.T) {
	needRedis(t)
	var (
		mu               sync.Mutex
		inProgress, peak int
		started          = make(chan struct{}, 16)
		release          = make(chan struct{})
	)
	cfg := defaultConfig()
	cfg.quoteWait = func(r *http.Request) {
		mu.Lock()
		inProgress++
		peak = max(peak, inProgress)
		mu.Unlock()
		started <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		mu.Lock()
		inProgress--
		mu.Unlock()
	}
	urls := replicasWith(t, 3, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	const quotes = 12
	codes := make(chan int, quotes)
	var wg sync.WaitGroup
	for i := range quotes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest("GET", urls[i%3]+"/quote", nil)
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("X-API-Key", "busy")
			resp, err := client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	// The refusals come back while the admitted quotes are held.
	refused := 0
	timeout := time.After(10 * time.Second)
	for refused < quotes-quoteInFlight {
		select {
		case c := <-codes:
			require.Equal(t, http.StatusTooManyRequests, c)
			refused++
		case <-timeout:
			t.Fatalf("%d refused; want %d", refused, quotes-quoteInFlight)
		}
	}
	for range quoteInFlight {
		select {
		case <-started:
		case <-timeout:
			t.Fatal("the admitted quotes did not start")
		}
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusOK, c)
	}
	assert.Equal(t, quoteInFlight, peak, "quotes in progress at once across three replicas")
}

// TestRulesReload: -rules puts a key on its plan, and a reload (what
// SIGHUP does) puts the new rules in force, or refuses a bad file and
// keeps the rules in force.
func TestRulesReload(t *testing.T) {
	needRedis(t)
	dir := t.TempDir()
	path := dir + "/rules.json"
	write := func(burst int) {
		doc := `{"rules": {"default": "free", "plans": {
			"free": {"name": "api", "algorithm": "token_bucket", "rate": "1/h", "burst": 2},
			"pro": {"name": "api-pro", "algorithm": "token_bucket", "rate": "1/h", "burst": ` + strconv.Itoa(burst) + `}}},
			"keys": {"pro-key": "pro"}}`
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	}
	write(3)
	rules, err := readRules(path)
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	cfg := defaultConfig()
	cfg.rules = rules
	clk := ratelimit.NewManualClock(time.Duration(time.Now().UnixNano()))
	a, err := newAPI(slog.New(slog.NewTextHandler(io.Discard, nil)), rdb, cfg, redisstore.WithClock(clk),
		redisstore.WithPrefix(fmt.Sprintf("demo%d:", prefixes.Add(1))), redisstore.WithTimeout(10*time.Second))
	require.NoError(t, err)
	srv := httptest.NewServer(a.handler)
	t.Cleanup(srv.Close)
	urls := []string{srv.URL}
	assert.Equal(t, 3, admitted(t, urls, "GET", "/quote", "pro-key", 5))
	assert.Equal(t, 2, admitted(t, urls, "GET", "/quote", "other", 5))

	write(6)
	a.reload(path)
	assert.Contains(t, (*a.table.Load())[0].Limit, `"burst":6`)
	// The rule changed: the key keeps what it used. 3 of 3 spent is 6 of
	// 6, but the bucket of 6 is full again when the old one would have
	// been, in 3 hours: 3 in use, 3 left.
	assert.Equal(t, 3, admitted(t, urls, "GET", "/quote", "pro-key", 8))

	require.NoError(t, os.WriteFile(path, []byte(`{"rules": {"plans": {}}, "keys": {"k": "gold"}}`), 0o600))
	a.reload(path)
	assert.Contains(t, (*a.table.Load())[0].Limit, `"burst":6`, "a bad file changes nothing")
}

// TestReplicasSharePlanUpgrade: three replicas round robin, the plan of a
// key upgraded by a reload (what SIGHUP does) on each replica in turn.
// While the replicas disagree the key moves between the old rules and the
// new at every request, and every answer is the one an in-process Plans
// gives when it is updated back and forth alike: the upgrade hands the
// key no fresh allowance on any replica.
func TestReplicasSharePlanUpgrade(t *testing.T) {
	needRedis(t)
	path := t.TempDir() + "/rules.json"
	write := func(burst int) exampleserver.RulesFile {
		doc := `{"rules": {"default": "free", "plans": {
			"free": {"name": "api", "algorithm": "token_bucket", "rate": "1/h", "burst": 2},
			"pro": {"name": "api-pro", "algorithm": "token_bucket", "rate": "1/h", "burst": ` + strconv.Itoa(burst) + `}}},
			"keys": {"pro-key": "pro"}}`
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
		rules, err := readRules(path)
		require.NoError(t, err)
		return rules
	}
	old := write(4)
	cfg := defaultConfig()
	cfg.rules = old
	clk := ratelimit.NewManualClock(time.Duration(time.Now().UnixNano()))
	prefix := fmt.Sprintf("demo%d:", prefixes.Add(1))
	var apis []*api
	var urls []string
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		a, err := newAPI(slog.New(slog.NewTextHandler(io.Discard, nil)), rdb, cfg, redisstore.WithClock(clk),
			redisstore.WithPrefix(prefix), redisstore.WithTimeout(10*time.Second), redisstore.WithDenyCache(0))
		require.NoError(t, err)
		srv := httptest.NewServer(a.handler)
		t.Cleanup(srv.Close)
		apis, urls = append(apis, a), append(urls, srv.URL)
	}
	planOf := func(key string) string { return (*secretKeys(old))[key] }
	local, err := ratelimit.NewPlans(old.Rules, planOf, ratelimit.WithClock(clk))
	require.NoError(t, err)
	upgraded := false // the rules local is on
	reloaded := make([]bool, len(apis))
	var upgradedRules exampleserver.RulesFile
	total, after := 0, 0
	ask := func(n int) {
		for i := range n {
			r := i % len(urls)
			if reloaded[r] != upgraded {
				next := old.Rules
				if reloaded[r] {
					next = upgradedRules.Rules
				}
				require.NoError(t, local.Update(next, ratelimit.MigrateProportional))
				upgraded = reloaded[r]
			}
			want, err := local.Check(httplimit.SecretKey("pro-key"), ratelimit.Unit)
			require.NoError(t, err)
			code, _ := send(t, "GET", urls[r]+"/quote", "pro-key")
			require.Equal(t, want.Allowed, code == http.StatusOK, "request %d to replica %d", i, r)
			if code == http.StatusOK {
				total++
				if upgradedRules.Rules.Plans != nil {
					after++
				}
			}
		}
	}
	ask(6) // 4 admitted: the old burst
	require.Equal(t, 4, total)
	upgradedRules = write(8)
	for r, a := range apis {
		a.reload(path)
		reloaded[r] = true
		ask(6)
	}
	// 4 of 4 spent is 8 of 8, full again when the bucket of 4 would have
	// been: 4 in use, 4 left, and no more however the key moves.
	assert.Equal(t, 4, after, "admitted after the upgrade began")
	var moves uint64
	for _, a := range apis {
		moves += a.plans.Stats().Moves
	}
	assert.Positive(t, moves, "the key moved between the rule sets")
}
