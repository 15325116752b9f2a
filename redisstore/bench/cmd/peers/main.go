// Command peers writes the Markdown table of BenchmarkPeers's passes: for
// each subject and number of goroutines, the median over the passes of
// checks per second and of Redis CPU per check (the commands' own time
// from INFO commandstats, and the server process's), each with its range
// over the passes and its ratio to redis_rate's median at the same number
// of goroutines. It reads the benchmark's raw output (run.sh's OUT) on
// standard input and writes Markdown on standard output.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// peer is the reference the ratios are taken against.
const peer = "redis_rate/gcra"

var line = regexp.MustCompile(`^BenchmarkPeers/(\S+)/w(\d+)(?:-\d+)?\s`)

// metrics are the columns, by the unit the benchmark reports them in.
var metrics = []string{"checks/s", "redis-µs/check", "server-cpu-µs/check", "p99-µs"}

type key struct {
	name    string
	workers int
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	samples := map[key]map[string][]float64{}
	var order []key
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		w, _ := strconv.Atoi(m[2])
		k := key{m[1], w}
		if samples[k] == nil {
			samples[k] = map[string][]float64{}
			order = append(order, k)
		}
		f := strings.Fields(sc.Text())
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				samples[k][f[i+1]] = append(samples[k][f[i+1]], v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(order) == 0 {
		return fmt.Errorf("no BenchmarkPeers lines")
	}
	slices.SortStableFunc(order, func(a, b key) int { return a.workers - b.workers })
	fmt.Fprintln(out, "| subject | goroutines | passes | checks/s (range) | × redis_rate | Redis µs/check, commandstats (range) | × redis_rate | server CPU µs/check (range) | × redis_rate | p99 µs |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|")
	for _, k := range order {
		s := samples[k]
		ref := samples[key{peer, k.workers}]
		row := []string{k.name, strconv.Itoa(k.workers), strconv.Itoa(len(s["checks/s"]))}
		for _, m := range metrics[:3] {
			med, lo, hi := stats(s[m])
			row = append(row, fmt.Sprintf("%.1f (%.1f–%.1f)", med, lo, hi))
			if r, _, _ := stats(ref[m]); r > 0 {
				row = append(row, fmt.Sprintf("%.2f", med/r))
			} else {
				row = append(row, "–")
			}
		}
		med, _, _ := stats(s["p99-µs"])
		row = append(row, fmt.Sprintf("%.0f", med))
		fmt.Fprintln(out, "| "+strings.Join(row, " | ")+" |")
	}
	return nil
}

// stats returns the median, least and greatest of v (zeros for none).
func stats(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}
