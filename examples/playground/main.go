// Command playground runs the seven rate-limiting algorithms side by side on
// the same traffic, on virtual time, and prints what each admits.
//
// First, 20 seconds of bursty traffic against "10 per second": background
// requests, a burst, requests on both sides of a window edge and a
// sustained overload, with what each algorithm admitted in every second,
// then how many it served and refused, its busiest second (any span of
// 1 s, not only whole seconds) and the longest wait it imposed. Then an
// hour of steady, bursty and edge-shaped traffic against "100 per minute",
// showing how far each algorithm strays from the exact limit: the most it
// admitted in any 60 s. Last, the design's worked example.
//
// Usage:
//
//	go run ./examples/playground [-seed N] [-svg FILE]
//
// -svg writes a chart of the first scenario (admitted requests per second
// for each algorithm, and the token bucket's level over time) as an SVG file
// a browser opens. The traffic is drawn from a seeded PCG generator and time
// is a [ratelimit.ManualClock], so the output depends on the seed alone.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratekit/ratelimit"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "playground:", err)
		os.Exit(1)
	}
}

// run is the whole program: it parses args (without the program name),
// prints to stdout, and writes the chart if asked to.
func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("playground", flag.ContinueOnError)
	fs.SetOutput(stdout)
	seed := fs.Uint64("seed", 1, "seed for the traffic generator")
	svgPath := fs.String("svg", "", "write a chart of the first scenario to this SVG `file`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	p := &printer{w: stdout}
	p.printf("ratelimit playground: seven algorithms, the same traffic, virtual time (seed %d)\n", *seed)

	ch, err := burstyScenario(p, *seed)
	if err != nil {
		return err
	}
	if err := hourScenario(p, *seed); err != nil {
		return err
	}
	if err := designScenario(p); err != nil {
		return err
	}
	if p.err != nil {
		return p.err
	}

	if *svgPath != "" {
		var b strings.Builder
		ch.writeSVG(&b)
		if err := os.WriteFile(*svgPath, []byte(b.String()), 0o644); err != nil {
			return err
		}
		p.printf("\nwrote the chart to %s\n", *svgPath)
	}
	return p.err
}

// burstyScenario runs and prints the first scenario and returns its chart.
func burstyScenario(p *printer, seed uint64) (*chart, error) {
	cs := perSecond10()
	arrivals, events := burstyTraffic(seed)
	out, err := simulate(cs, arrivals)
	if err != nil {
		return nil, err
	}

	p.printf("\n1. Twenty seconds of bursty traffic against \"10 per second\"\n\n")
	for _, c := range cs {
		p.printf("  %-16s %s\n", c.long, c.desc)
	}
	p.printf("\n  traffic: %d requests, about 3 a second in the background, and\n", len(arrivals))
	for _, e := range events {
		p.printf("    %5.2f-%5.2f s  %s\n", e.from.Seconds(), e.to.Seconds(), e.name)
	}

	const bins = int(burstySpan / time.Second)
	offered := perBin(arrivals, time.Second, bins)
	admitted := make([][]int, len(cs))
	for i, o := range out {
		admitted[i] = perBin(o.admitted, time.Second, bins)
	}
	leakyOut := perBin(out[2].goesOn, time.Second, bins)

	p.printf("\n  Admitted in each second (\"leaky out\": the leaky bucket's admitted\n")
	p.printf("  requests that go on in that second, once their Delay is over)\n\n")
	head := []string{"second", "offered"}
	for _, c := range cs {
		head = append(head, c.name)
		if c.name == "leaky" {
			head = append(head, "leaky out")
		}
	}
	rows := [][]string{head}
	for s := range bins {
		row := []string{fmt.Sprintf("%2d-%2d", s, s+1), itoa(offered[s])}
		for i, c := range cs {
			row = append(row, itoa(admitted[i][s]))
			if c.name == "leaky" {
				row = append(row, itoa(leakyOut[s]))
			}
		}
		rows = append(rows, row)
	}
	p.table(rows)

	p.printf("\n  Per algorithm (busiest 1 s: the most admitted in any span of one second;\n")
	p.printf("  longest wait: the leaky bucket's longest Delay)\n\n")
	rows = [][]string{{"", "served", "refused", "busiest 1 s", "longest wait", "longest RetryAfter"}}
	for i, c := range cs {
		o := out[i]
		wait := "-"
		if o.maxDelay > 0 {
			wait = o.maxDelay.String()
		}
		rows = append(rows, []string{c.long, itoa(len(o.admitted)), itoa(o.refused),
			itoa(busiest(o.admitted, time.Second)), wait, o.maxRetry.String()})
	}
	p.table(rows)

	ch := &chart{
		seed:     seed,
		span:     burstySpan,
		limit:    10,
		burst:    10,
		offered:  offered,
		events:   events,
		level:    tokenLevel(arrivals, out[0].after, ratelimit.PerSecond(10), 10, burstySpan),
		leakyOut: leakyOut,
	}
	for i, c := range cs {
		ch.series = append(ch.series, series{
			name:    c.long,
			rule:    c.desc,
			counts:  admitted[i],
			served:  len(out[i].admitted),
			busiest: busiest(out[i].admitted, time.Second),
		})
	}
	return ch, nil
}

// hourScenario runs and prints the hour of each traffic shape against
// 100 per minute.
func hourScenario(p *printer, seed uint64) error {
	cs := perMinute100()
	shapes := hourShapes(seed)
	outs := make([][]outcome, len(shapes))
	for i, s := range shapes {
		out, err := simulate(cs, s.arrivals)
		if err != nil {
			return err
		}
		outs[i] = out
	}

	p.printf("\n2. An hour against \"100 per minute\": how far each strays from the limit\n\n")
	for _, c := range cs {
		p.printf("  %-16s %s\n", c.long, c.desc)
	}
	p.printf("\n")
	for _, s := range shapes {
		p.printf("  %-11s %5d requests: %s\n", s.name, len(s.arrivals), s.about)
	}

	p.printf("\n  The most admitted in any 60 s (over the limit of 100 in brackets).\n")
	p.printf("  Only the sliding log never exceeds it; the sub-window counter strays\n")
	p.printf("  less the more buckets it has; the buckets allow a full burst on top of\n")
	p.printf("  the rate, by design.\n\n")
	head := []string{""}
	for _, s := range shapes {
		head = append(head, s.name)
	}
	rows := [][]string{head}
	for i, c := range cs {
		row := []string{c.long}
		for j := range shapes {
			n := busiest(outs[j][i].admitted, time.Minute)
			cell := itoa(n)
			if n > 100 {
				cell += fmt.Sprintf(" (+%d)", n-100)
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	p.table(rows)

	p.printf("\n  Admitted in the hour (at 100 a minute, an hour is 6000)\n\n")
	rows = [][]string{head}
	for i, c := range cs {
		row := []string{c.long}
		for j := range shapes {
			row = append(row, itoa(len(outs[j][i].admitted)))
		}
		rows = append(rows, row)
	}
	p.table(rows)
	return nil
}

// designScenario prints the design's example: 200 requests, 10 a second
// from 50 s to 70 s, against 100 per minute.
func designScenario(p *printer) error {
	cs := perMinute100()
	out, err := simulate(cs, designVector())
	if err != nil {
		return err
	}
	p.printf("\n3. The same 200 requests, 10 a second from 50 s to 70 s, against \"100 per minute\"\n\n")
	rows := [][]string{{"", "admitted", "busiest 60 s"}}
	for i, c := range cs {
		rows = append(rows, []string{c.long, itoa(len(out[i].admitted)), itoa(busiest(out[i].admitted, time.Minute))})
	}
	p.table(rows)
	return nil
}

// levelPoint is the token bucket's level, in milli-units, at an instant.
type levelPoint struct {
	t     time.Duration
	milli int64
}

// tokenLevel rebuilds the level of a token bucket (rate, burst) over span
// from the ResetAfter of its decision on each arrival: right after a
// decision the bucket misses exactly ResetAfter's worth of refill, and
// between decisions it refills in a straight line until it is full. The
// result is the corners of that line.
func tokenLevel(arrivals, after []time.Duration, rate ratelimit.Rate, burst int64, span time.Duration) []levelPoint {
	full := burst * int64(ratelimit.Unit)
	perSpan := rate.Count * int64(ratelimit.Unit) // milli-units per rate.Per
	earned := func(d time.Duration) int64 { return int64(d) * perSpan / int64(rate.Per) }
	toFill := func(m int64) time.Duration {
		return time.Duration((m*int64(rate.Per) + perSpan - 1) / perSpan)
	}
	pts := []levelPoint{{0, full}}
	refillTo := func(t time.Duration) {
		last := pts[len(pts)-1]
		if last.milli < full {
			if at := last.t + toFill(full-last.milli); at < t {
				last = levelPoint{at, full}
				pts = append(pts, last)
			}
		}
		if t > last.t {
			pts = append(pts, levelPoint{t, min(full, last.milli+earned(t-last.t))})
		}
	}
	for i, t := range arrivals {
		refillTo(t)
		pts = append(pts, levelPoint{t, full - earned(after[i])})
	}
	refillTo(span)
	return pts
}

// printer writes formatted text and keeps the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// table prints rows as columns two spaces apart, indented by two: the first
// column left-aligned, the others right-aligned.
func (p *printer) table(rows [][]string) {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		b.WriteString("  ")
		for i, cell := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-len(cell))
			if i == 0 {
				b.WriteString(cell + pad)
			} else {
				b.WriteString(pad + cell)
			}
		}
		p.printf("%s\n", strings.TrimRight(b.String(), " "))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
