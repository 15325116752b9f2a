package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// busyRequest is how long one request of a curl command that sends its
// requests in a row over one connection may take on a busy machine: far
// more than on an idle one, where it takes well under a millisecond.
const busyRequest = 20 * time.Millisecond

// TestTryItShowsA429 checks the command that the package documentation
// and the README give to try /quote: it sends its requests in a row, in one
// curl, and they must be more than the burst plus what the rate earns
// while they are sent, even at busyRequest each, so that the last ones are
// refused on the first try on a busy machine.
func TestTryItShowsA429(t *testing.T) {
	rule, ok := defaultRules().Rules.Plans["free"].Rule.(ratelimit.TokenBucket)
	require.True(t, ok, "the default plan is no longer a token bucket: change this test's arithmetic")
	burst, rate := rule.Burst, rule.Rate
	glob := regexp.MustCompile(`localhost:8080/quote\?n=\[1-(\d+)\]'; echo`)
	for _, path := range []string{"main.go", filepath.Join("..", "..", "README.md")} {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		m := glob.FindAllSubmatch(data, -1)
		require.NotEmpty(t, m, "%s gives no curl command that sends quotes in a row", path)
		n, err := strconv.Atoi(string(m[0][1]))
		require.NoError(t, err)
		// Tokens earned while n requests are sent, rounded up.
		earned := (time.Duration(n)*busyRequest*time.Duration(rate.Count) + rate.Per - 1) / rate.Per
		assert.Greater(t, int64(n), int64(burst)+int64(earned),
			"%s: %d quotes in a row at up to %v each earn %d on top of the burst of %d: none need be refused", path, n, busyRequest, earned, burst)
	}
}

// TestWorkShowsTheInFlightLimit starts the server with -work, as the
// package documentation says to, and sends six quotes at once: four are in
// progress, the other two are refused.
func TestWorkShowsTheInFlightLimit(t *testing.T) {
	s := start(t, "-work", "3s")
	codes := make(chan int, 6)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(s.base + "/quote")
			if !assert.NoError(t, err) {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: quoteInFlight, http.StatusTooManyRequests: 6 - quoteInFlight}, count)
}
