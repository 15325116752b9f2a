package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	var outs [2]string
	var svgs [2][]byte
	for i := range outs {
		path := filepath.Join(dir, "chart"+itoa(i)+".svg")
		var b bytes.Buffer
		require.NoError(t, run([]string{"-svg", path}, &b))
		outs[i] = strings.ReplaceAll(b.String(), path, "FILE")
		svg, err := os.ReadFile(path)
		require.NoError(t, err)
		svgs[i] = svg
	}
	assert.Equal(t, outs[0], outs[1])
	assert.Equal(t, svgs[0], svgs[1])

	var other bytes.Buffer
	require.NoError(t, run([]string{"-seed", "2"}, &other))
	assert.NotEqual(t, outs[0], other.String(), "the seed must change the traffic")
}

// TestRunPrintsDesignVector checks the design's worked example in the
// printed output: 200 requests, 10/s from 50 s to 70 s, against 100 per
// minute.
func TestRunPrintsDesignVector(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, run(nil, &b))
	out := b.String()
	_, section, ok := strings.Cut(out, "\n3. ")
	require.True(t, ok, "no third section in:\n%s", out)
	for name, want := range map[string]string{
		"token bucket":    "133",
		"GCRA":            "133",
		"leaky bucket":    "133",
		"fixed window":    "200",
		"sliding log":     "100",
		"sliding counter": "116",
		"sub-window k=6":  "100",
		"sub-window k=60": "100",
	} {
		assert.Regexp(t, regexp.MustCompile(`(?m)^  `+name+` +`+want+` `), section, name)
	}
}

func TestDesignVector(t *testing.T) {
	out, err := simulate(perMinute100(), designVector())
	require.NoError(t, err)
	got := map[string]int{}
	for i, c := range perMinute100() {
		got[c.long] = len(out[i].admitted)
	}
	assert.Equal(t, map[string]int{
		"token bucket": 133, "GCRA": 133, "leaky bucket": 133,
		"fixed window": 200, "sliding log": 100, "sliding counter": 116,
		"sub-window k=6": 100, "sub-window k=60": 100,
	}, got)
}

// TestScenarioFigures checks what the playground exists to show, for a few
// seeds: the sliding log never admits more than its limit in any window,
// GCRA decides exactly as the token bucket, the fixed window lets twice
// its limit through around an edge, and the sliding counter strays above
// its limit when last window's requests all came at its end.
func TestScenarioFigures(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		cs := perSecond10()
		arrivals, _ := burstyTraffic(seed)
		out, err := simulate(cs, arrivals)
		require.NoError(t, err)
		assert.Equal(t, out[0].admitted, out[1].admitted, "seed %d: GCRA must equal the token bucket", seed)
		assert.Equal(t, out[0].admitted, out[2].admitted, "seed %d: the leaky bucket admits as the token bucket", seed)
		assert.LessOrEqual(t, busiest(out[4].admitted, time.Second), 10, "seed %d: sliding log", seed)
		assert.Greater(t, busiest(out[3].admitted, time.Second), 10, "seed %d: fixed window at the edge", seed)
		assert.LessOrEqual(t, out[2].maxDelay, time.Second, "seed %d: a queue of 10 at 10/s waits at most 1 s", seed)
		assert.Positive(t, out[2].maxDelay, "seed %d: the burst must queue", seed)
		assert.Len(t, out[0].after, len(arrivals))
		// The sub-window counter with k buckets is exact over any span of
		// W - W/k + 1 ns, and lets at most twice its limit through in W.
		for i, k := range map[int]time.Duration{6: 5, 7: 50} {
			exact := time.Second - time.Second/k + 1
			assert.LessOrEqual(t, busiest(out[i].admitted, exact), 10, "seed %d: sub-window k=%d", seed, k)
			assert.LessOrEqual(t, busiest(out[i].admitted, time.Second), 20, "seed %d: sub-window k=%d", seed, k)
		}

		for _, s := range hourShapes(seed) {
			out, err := simulate(perMinute100(), s.arrivals)
			require.NoError(t, err)
			assert.Equal(t, out[0].admitted, out[1].admitted, "seed %d, %s: GCRA", seed, s.name)
			assert.LessOrEqual(t, busiest(out[4].admitted, time.Minute), 100, "seed %d, %s: sliding log", seed, s.name)
			for i, k := range map[int]time.Duration{6: 6, 7: 60} {
				exact := time.Minute - time.Minute/k + 1
				assert.LessOrEqual(t, busiest(out[i].admitted, exact), 100, "seed %d, %s: sub-window k=%d", seed, s.name, k)
			}
			switch s.name {
			case "edge pairs":
				assert.Equal(t, 200, busiest(out[3].admitted, time.Minute), "seed %d: fixed window", seed)
			case "late burst":
				assert.Greater(t, busiest(out[5].admitted, time.Minute), 150, "seed %d: sliding counter", seed)
			}
		}
	}
}

func TestBusiest(t *testing.T) {
	s := time.Second
	tests := []struct {
		name string
		ts   []time.Duration
		want int
	}{
		{"empty", nil, 0},
		{"one", []time.Duration{5 * s}, 1},
		{"same instant", []time.Duration{s, s, s}, 3},
		// The window is (x-W, x]: instants exactly W apart never share one.
		{"exactly a window apart", []time.Duration{0, s, 2 * s}, 1},
		{"just inside", []time.Duration{0, s - 1, 2*s - 2}, 2},
		{"crowd later", []time.Duration{0, 3 * s, 3*s + 1, 3*s + 2, 4 * s}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, busiest(tt.ts, s))
		})
	}
}

// TestTokenLevel checks the drawn level against the decisions it was
// rebuilt from: just before each request the bucket held at least one
// token exactly when the request was admitted (give or take the drawing's
// rounding, a milli-unit or two), and it never leaves [0, burst].
func TestTokenLevel(t *testing.T) {
	cs := perSecond10()
	arrivals, _ := burstyTraffic(1)
	out, err := simulate(cs, arrivals)
	require.NoError(t, err)
	pts := tokenLevel(arrivals, out[0].after, ratelimit.PerSecond(10), 10, burstySpan)

	require.NotEmpty(t, pts)
	assert.Equal(t, levelPoint{0, 10_000}, pts[0])
	assert.Equal(t, burstySpan, pts[len(pts)-1].t)
	lowest := int64(10_000)
	for i, p := range pts {
		assert.GreaterOrEqual(t, p.milli, int64(0))
		assert.LessOrEqual(t, p.milli, int64(10_000))
		if i > 0 {
			assert.GreaterOrEqual(t, p.t, pts[i-1].t)
		}
		lowest = min(lowest, p.milli)
	}
	assert.Less(t, lowest, int64(1000), "the burst must empty the bucket")

	// For a request later than the one before, the line has a point at its
	// instant before the decision (the refill up to then) and the decision's
	// point after it; a request at the same instant as the one before
	// follows that one's point directly.
	k := 0 // the previous decision's point
	for i, at := range arrivals {
		if i == 0 || at > arrivals[i-1] {
			for pts[k].t < at {
				k++
			}
		}
		before, after := pts[k].milli, pts[k+1]
		require.Equal(t, at, after.t, "request %d", i)
		assert.Equal(t, 10_000-int64(out[0].after[i])*10_000/int64(time.Second), after.milli, "request %d", i)
		if out[0].allowed[i] {
			assert.GreaterOrEqual(t, before, int64(1000-2), "request %d at %v was admitted", i, at)
		} else {
			assert.Less(t, before, int64(1000+2), "request %d at %v was refused", i, at)
		}
		k++
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	require.NoError(t, run([]string{"-svg", path}, io.Discard))
	svg, err := os.ReadFile(path)
	require.NoError(t, err)

	dec := xml.NewDecoder(bytes.NewReader(svg))
	var root string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if el, ok := tok.(xml.StartElement); ok && root == "" {
			root = el.Name.Local
			assert.Equal(t, "http://www.w3.org/2000/svg", el.Name.Space)
		}
	}
	assert.Equal(t, "svg", root)
	for _, c := range perSecond10() {
		assert.Contains(t, string(svg), ">"+c.long+"<")
	}
	assert.Contains(t, string(svg), "token bucket level")
}

func TestRunArguments(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, run([]string{"-h"}, &b), "-h prints usage and succeeds")
	assert.Contains(t, b.String(), "-svg")
	assert.Error(t, run([]string{"-nosuchflag"}, io.Discard))
	assert.Error(t, run([]string{"extra"}, io.Discard))
	assert.Error(t, run([]string{"-svg", filepath.Join(t.TempDir(), "no", "such", "dir.svg")}, io.Discard))
}

// TestCommittedChartIsCurrent keeps docs/playground.svg, which the README
// shows, in step with the program. To refresh it:
//
//	go run ./examples/playground -svg docs/playground.svg
func TestCommittedChartIsCurrent(t *testing.T) {
	committed, err := os.ReadFile(filepath.Join("..", "..", "docs", "playground.svg"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "chart.svg")
	require.NoError(t, run([]string{"-svg", path}, io.Discard))
	fresh, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(committed, fresh),
		"docs/playground.svg is stale: go run ./examples/playground -svg docs/playground.svg")
}
