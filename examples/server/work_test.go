package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two GET /work requests in progress fill a limit of 2; of three sent at
// once, whichever comes third is shed with 503, whatever order they
// arrive in.
func TestWorkShedsWith503(t *testing.T) {
	s := start(t, "-work-workers", "1", "-work-cost", "1h", "-shed-limit", "2", "-priority-header", "X-Priority", "-work-control")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	codes := make(chan *http.Response, 3)
	for range 3 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/work", nil)
			req.Header.Set("X-Priority", "critical")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // cancelled at the end of the test
			}
			codes <- resp
		}()
	}
	select {
	case resp := <-codes:
		defer resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		assert.Equal(t, "overloaded", body["error"])
		assert.Equal(t, "critical", body["class"], "the trusted header set the class")
	case <-ctx.Done():
		t.Fatal("no request was shed")
	}

	resp, err := http.Post(s.base+"/work/slow?factor=0", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	resp, err = http.Get(s.base + "/")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.True(t, strings.Contains(string(b), "GET /work"), string(b))
	cancel()
	s.stop()
}

func TestWorkFlagsRejected(t *testing.T) {
	for _, args := range [][]string{
		{"-shed", "sometimes"},
		{"-work-workers", "0"},
		{"-shed-limit", "1"}, // 70% of 1 is less than one request
		{"-shed-shares", "90"},
		{"-shed-shares", "70,90"}, // sheddable above default
	} {
		err := run(context.Background(), append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, nil)
		assert.Error(t, err, args)
	}
}
