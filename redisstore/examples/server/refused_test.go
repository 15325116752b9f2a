package main

import (
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/redisstore"
)

// TestRefusedConnectionSaysSo checks that a check against a Redis that
// refuses connections, made with the server's client options, fails with
// the refusal in its error rather than only its deadline.
func TestRefusedConnectionSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: connections are refused

	rdb := redis.NewClient(clientOptions(addr))
	t.Cleanup(func() { rdb.Close() })
	s, err := redisstore.New(rdb, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20})
	require.NoError(t, err)
	_, err = s.Check("k", ratelimit.Unit)
	require.Error(t, err)
	assert.ErrorIs(t, err, redisstore.ErrUnavailable)
	assert.Contains(t, err.Error(), "connection refused")
}
