// Command chart draws the peer benchmarks' results as an SVG of horizontal
// bar charts, one panel per scenario: the median over the run's passes as
// the bar, benchstat's 95% confidence interval as a whisker. This library's
// rules are blue, other libraries grey, the floors (a clock read, a map
// lookup) outlined.
//
//	go run ./cmd/chart -in ../docs/performance.txt -out ../docs/performance.svg
package main

import (
	"bytes"
	"flag"
	"fmt"
	"html"
	"log"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/ratekit/ratelimit/bench/internal/results"
)

type panel struct {
	title           string
	group, scenario string
	unit            string // the metric drawn
	axis            string // the axis label
}

// panels are drawn in rows of two. One-goroutine scenarios show CPU time
// per op, all-cores ones wall-clock time per op (see cmd/table).
var panels = []panel{
	{"Single key, one goroutine, allowed", "Single", "allowed", "cpu-ns/op", "CPU ns per Check"},
	{"Single key, one goroutine, denied", "Single", "denied", "cpu-ns/op", "CPU ns per Check"},
	{"Single key, all cores", "Single", "parallel", "ns/op", "ns per Check (wall clock)"},
	{"1,000,000 keys, one goroutine", "Keyed", "serial", "cpu-ns/op", "CPU ns per Check"},
	{"1,000,000 keys, all cores", "Keyed", "parallel", "ns/op", "ns per Check (wall clock)"},
	{"Heap per key at 1,000,000 keys", "Keyed", "insert", "heap-B/key", "bytes per key, key strings excluded"},
}

// Layout, in SVG units.
const (
	columns  = 2
	panelW   = 600
	labelW   = 170 // subject names
	valueW   = 90  // room right of the longest bar for its value
	barH     = 15
	barGap   = 5
	titleH   = 44
	axisH    = 34
	panelGap = 24
	margin   = 20
	headerH  = 84
)

const (
	colorOurs  = "#2b6cb0"
	colorPeer  = "#a0aec0"
	colorFloor = "#ffffff"
	colorText  = "#1a202c"
	colorMuted = "#4a5568"
)

func main() {
	in := flag.String("in", "docs/performance.txt", "benchmark output of the run")
	out := flag.String("out", "docs/performance.svg", "SVG file to write")
	flag.Parse()
	set, err := results.ReadFile(*in)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, draw(set), 0o644); err != nil {
		log.Fatal(err)
	}
}

type bar struct {
	key       results.Key
	v, lo, hi float64
}

func bars(s *results.Set, p panel) []bar {
	var out []bar
	for _, k := range s.Select(p.group, p.scenario, nil) {
		sum, ok := s.Summary(k, p.unit)
		if !ok {
			continue
		}
		out = append(out, bar{key: k, v: sum.Center, lo: sum.Lo, hi: sum.Hi})
	}
	slices.SortStableFunc(out, func(a, b bar) int {
		switch {
		case a.v < b.v:
			return -1
		case a.v > b.v:
			return 1
		}
		return 0
	})
	return out
}

// scale picks the axis maximum: the largest bar, unless it dwarfs the
// others, in which case bars beyond four times the median are clipped.
func scale(bs []bar) float64 {
	if len(bs) == 0 {
		return 1
	}
	vs := make([]float64, len(bs))
	for i, b := range bs {
		vs[i] = b.v
	}
	slices.Sort(vs)
	top := vs[len(vs)-1]
	if m := vs[len(vs)/2] * 4; top > m && m > 0 {
		top = m
	}
	step := tickStep(top)
	return step * math.Ceil(top/step-1e-9)
}

// tickStep returns 1, 2 or 5 times a power of ten, such that at most five
// steps reach v.
func tickStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v/(m*p) <= 5 {
			return m * p
		}
	}
	return 10 * p
}

func panelHeight(n int) int { return titleH + n*(barH+barGap) + axisH }

func draw(s *results.Set) []byte {
	var all [][]bar
	rows := (len(panels) + columns - 1) / columns
	rowH := make([]int, rows)
	for i, p := range panels {
		bs := bars(s, p)
		if len(bs) == 0 && p.unit == "cpu-ns/op" {
			p.unit, p.axis = "ns/op", "ns per Check"
			panels[i] = p
			bs = bars(s, p)
		}
		all = append(all, bs)
		rowH[i/columns] = max(rowH[i/columns], panelHeight(len(bs)))
	}
	width := margin*2 + columns*panelW + (columns-1)*panelGap
	height := margin*2 + headerH
	for _, h := range rowH {
		height += h + panelGap
	}
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n",
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="%d" font-size="20" font-weight="bold" fill="%s">ratelimit and other Go rate limiters</text>`+"\n",
		margin, margin+20, colorText)
	sub := fmt.Sprintf("Median of %d passes, whiskers: 95%% confidence interval. Shorter is better.", len(s.Passes))
	if m := s.Config["machine"]; len(m) > 0 {
		sub = fmt.Sprintf("Median of %d passes (whiskers: 95%% confidence interval); shorter is better. %s", len(s.Passes), m[0])
	}
	if g := s.Config["go"]; len(g) > 0 {
		sub += ", " + g[0] + "."
	}
	p(`<text x="%d" y="%d" font-size="12" fill="%s">%s</text>`+"\n", margin, margin+40, colorMuted, html.EscapeString(sub))
	legend(&b, margin, margin+50)

	y := margin + headerH
	for r := 0; r < rows; r++ {
		for c := 0; c < columns; c++ {
			i := r*columns + c
			if i >= len(panels) {
				break
			}
			x := margin + c*(panelW+panelGap)
			drawPanel(&b, panels[i], all[i], x, y)
		}
		y += rowH[r] + panelGap
	}
	p("</svg>\n")
	return b.Bytes()
}

func legend(b *bytes.Buffer, x, y int) {
	items := []struct{ fill, stroke, text string }{
		{colorOurs, colorOurs, "ratelimit (this library)"},
		{colorPeer, colorPeer, "other libraries"},
		{colorFloor, colorMuted, "floor: clock read / map lookup"},
	}
	for _, it := range items {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s" stroke="%s"/>`, x, y, it.fill, it.stroke)
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" fill="%s">%s</text>`+"\n", x+17, y+10, colorText, html.EscapeString(it.text))
		x += 30 + 7*len(it.text)
	}
}

func drawPanel(b *bytes.Buffer, pn panel, bs []bar, x, y int) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p(`<g transform="translate(%d,%d)">`+"\n", x, y)
	p(`<text x="0" y="16" font-size="14" font-weight="bold" fill="%s">%s</text>`+"\n", colorText, html.EscapeString(pn.title))
	plotW := float64(panelW - labelW - valueW)
	top := scale(bs)
	px := func(v float64) float64 { return math.Min(v, top) / top * plotW }
	gridTop, gridBottom := titleH-6, titleH+len(bs)*(barH+barGap)
	step := tickStep(top)
	for v := 0.0; v <= top*(1+1e-9); v += step {
		gx := float64(labelW) + px(v)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e2e8f0"/>`, gx, gridTop, gx, gridBottom)
		p(`<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="%s">%s</text>`+"\n",
			gx, gridBottom+13, colorMuted, short(v))
	}
	p(`<text x="%.1f" y="%d" font-size="11" text-anchor="middle" fill="%s">%s</text>`+"\n",
		float64(labelW)+plotW/2, gridBottom+28, colorMuted, html.EscapeString(pn.axis))
	for i, br := range bs {
		by := titleH + i*(barH+barGap)
		fill, stroke, weight := colorPeer, colorPeer, "normal"
		switch {
		case br.key.Ours():
			fill, stroke, weight = colorOurs, colorOurs, "bold"
		case br.key.Floor():
			fill, stroke = colorFloor, colorMuted
		}
		label := strings.TrimPrefix(br.key.Subject, "ratelimit.")
		p(`<text x="%d" y="%d" font-size="12" text-anchor="end" font-weight="%s" fill="%s">%s</text>`,
			labelW-8, by+barH-3, weight, colorText, html.EscapeString(label))
		w := math.Max(px(br.v), 1)
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s" stroke="%s"/>`, labelW, by, w, barH, fill, stroke)
		clipped := br.v > top
		if clipped {
			// A break mark: the bar runs off the axis.
			bx := float64(labelW) + w - 10
			p(`<path d="M%.1f %d l4 %d M%.1f %d l4 %d" stroke="#ffffff" stroke-width="2"/>`,
				bx, by-1, barH+2, bx+4, by-1, barH+2)
		} else if br.hi > br.lo && br.hi <= top && br.lo >= 0 {
			lo, hi := float64(labelW)+px(br.lo), float64(labelW)+px(br.hi)
			mid := float64(by) + barH/2
			p(`<path d="M%.1f %.1f H%.1f M%.1f %.1f v6 M%.1f %.1f v6" stroke="%s" stroke-width="1"/>`,
				lo, mid, hi, lo, mid-3, hi, mid-3, colorText)
		}
		tx := float64(labelW) + w + 6
		if !clipped && br.hi > br.v && br.hi <= top {
			tx = math.Max(tx, float64(labelW)+px(br.hi)+6)
		}
		p(`<text x="%.1f" y="%d" font-size="11" fill="%s">%s</text>`+"\n", tx, by+barH-3, colorText, full(br.v))
	}
	p("</g>\n")
}

// short formats an axis value.
func short(v float64) string {
	switch {
	case v >= 1e6:
		return trim(v/1e6) + "M"
	case v >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// full formats a bar's value.
func full(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
