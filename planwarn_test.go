package ratelimit_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlansWarnsOnceWhenNoKeyFindsItsPlan: a plan function that names no
// plan for many distinct keys (keys that reach it in another form than its
// table's, as an HTTP middleware's hashed keys do) is reported once, never
// per check; one that names a plan for some key, or repeats one unknown key,
// is not; WithLogger(nil) silences it.
func TestPlansWarnsOnceWhenNoKeyFindsItsPlan(t *testing.T) {
	set := ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}},
			"pro":  {Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(100), Burst: 100}},
		},
		Default: "free",
	}
	customers := map[string]string{"key-of-acme": "pro"}
	byRawKey := func(key string) string { return customers[key] }
	clk := ratelimit.NewManualClock(time.Hour)
	run := func(t *testing.T, keys func(i int) string, n int, opts ...ratelimit.Option) string {
		t.Helper()
		var buf bytes.Buffer
		opts = append([]ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithLogger(slog.New(slog.NewTextHandler(&buf, nil)))}, opts...)
		p, err := ratelimit.NewPlans(set, byRawKey, opts...)
		require.NoError(t, err)
		for i := range n {
			_, err := p.Check(keys(i), ratelimit.Unit)
			require.NoError(t, err)
		}
		return buf.String()
	}
	hashed := func(i int) string { return fmt.Sprintf("hdr:%x", i*7919) }

	out := run(t, hashed, 5000)
	assert.Equal(t, 1, strings.Count(out, "level=WARN"), "once, not per check: %s", out)
	assert.Contains(t, out, "default_plan=free")

	assert.Empty(t, run(t, hashed, 255), "fewer distinct keys than the threshold")
	assert.Empty(t, run(t, func(int) string { return "hdr:same" }, 5000), "one key checked often")
	withAcme := func(i int) string {
		if i == 3 {
			return "key-of-acme"
		}
		return hashed(i)
	}
	assert.Empty(t, run(t, withAcme, 5000), "the function named a plan for one key: it works")
	assert.Empty(t, run(t, hashed, 5000, ratelimit.WithLogger(nil)), "silenced")
}
