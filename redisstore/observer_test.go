package redisstore

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// counting is an Observer that counts what it is told.
type counting struct {
	mu       sync.Mutex
	outcomes map[ratelimit.Outcome]int
	failed   int
}

func (c *counting) Decided(_ ratelimit.Decision, _ ratelimit.Units, o ratelimit.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outcomes == nil {
		c.outcomes = map[ratelimit.Outcome]int{}
	}
	c.outcomes[o]++
}

func (c *counting) Waited(string, ratelimit.WaitEvent, time.Duration) {}
func (c *counting) Evicted(string, uint64, bool)                      {}

func (c *counting) Failed(string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed++
}

// TestObserver: the observer is told of every decision, those the deny
// cache answers included, and of a failure, but not of a cost error.
func TestObserver(t *testing.T) {
	rdb := needRedis(t)
	var obs counting
	s, err := New(rdb, ratelimit.FixedWindow{Limit: 3, Window: 100 * year, Name: "api"}, WithPrefix(testPrefix()), WithObserver(&obs))
	require.NoError(t, err)
	for range 10 {
		_, err := s.Check("k", ratelimit.Unit)
		require.NoError(t, err)
	}
	_, err = s.Check("k", 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	require.NotErrorIs(t, err, ratelimit.ErrDegraded, "a cost error comes with no Decision to act on")
	assert.Equal(t, map[ratelimit.Outcome]int{ratelimit.OutcomeAllowed: 3, ratelimit.OutcomeRefused: 7}, obs.outcomes)
	assert.Zero(t, obs.failed)

	// A store on a server that is not there fails, and says so.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer down.Close()
	gone, err := New(down, ratelimit.FixedWindow{Limit: 3, Window: time.Minute}, WithObserver(&obs), WithTimeout(200*time.Millisecond))
	require.NoError(t, err)
	_, err = gone.Check("k", ratelimit.Unit)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, 1, obs.failed)
}
