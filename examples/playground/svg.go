package main

import (
	"fmt"
	"html"
	"strconv"
	"strings"
	"time"
)

// chart is the first scenario, ready to draw.
type chart struct {
	seed     uint64
	span     time.Duration
	limit    int          // the limit per second, drawn as a dashed line
	burst    int64        // the token bucket's burst, the top of its level
	offered  []int        // requests sent in each second
	events   []event      // stretches of traffic to point at
	series   []series     // one per algorithm
	leakyOut []int        // leaky-bucket requests that go on in each second
	level    []levelPoint // the token bucket's level
}

// series is one algorithm's panel.
type series struct {
	name, rule      string
	counts          []int // admitted in each second
	served, busiest int
}

// Colours from the Okabe-Ito palette, which stays distinct for readers
// with colour-blindness; one per algorithm, in the order of perSecond10.
var colours = []string{"#0072B2", "#56B4E9", "#009E73", "#D55E00", "#CC79A7", "#E69F00", "#000000", "#666666"}

// Layout, in pixels.
const (
	svgWidth   = 980
	plotLeft   = 230 // labels sit to the left of the plots
	plotWidth  = 720
	panelH     = 78 // a bar panel
	panelGap   = 18
	levelH     = 90 // the token level panel
	firstPanel = 112
	yMax       = 30 // requests per second at the top of a bar panel
)

// writeSVG draws the chart as a standalone SVG document. Every coordinate
// is computed in integer tenths of a pixel, so the file is the same on every
// platform.
func (c *chart) writeSVG(b *strings.Builder) {
	bins := len(c.offered)
	binW := int64(plotWidth * 10 / bins) // tenths
	x := func(t time.Duration) int64 { return plotLeft*10 + int64(t)*plotWidth*10/int64(c.span) }
	binX := func(k int) int64 { return plotLeft*10 + int64(k)*binW }
	// y maps a count in a panel whose top is top (px) to tenths.
	y := func(top int, n int) int64 {
		n = min(n, yMax)
		return int64(top+panelH)*10 - int64(n)*panelH*10/yMax
	}
	levelTop := firstPanel + len(c.series)*(panelH+panelGap) + 8
	bottom := levelTop + levelH
	height := bottom + 56

	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	w(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	w(`<text x="20" y="30" font-size="18" font-weight="bold" fill="#222">Seven algorithms, the same 20 s of bursty traffic, &#8220;10 per second&#8221;</text>` + "\n")
	w(`<text x="20" y="50" fill="#555">Requests admitted in each second by each algorithm. Virtual time, seeded traffic (seed %d): go run ./examples/playground -svg FILE</text>`+"\n", c.seed)

	// Legend.
	w(`<rect x="%d" y="62" width="14" height="10" fill="#e2e2e2"/><text x="%d" y="71" fill="#333">offered</text>`+"\n", plotLeft, plotLeft+18)
	w(`<rect x="%d" y="62" width="14" height="10" fill="#777"/><text x="%d" y="71" fill="#333">admitted</text>`+"\n", plotLeft+80, plotLeft+98)
	w(`<line x1="%d" y1="67" x2="%d" y2="67" stroke="#c00" stroke-width="1.5" stroke-dasharray="4 3"/><text x="%d" y="71" fill="#333">the limit, %d per second</text>`+"\n", plotLeft+170, plotLeft+192, plotLeft+198, c.limit)
	w(`<polyline points="%d,67 %d,67" stroke="#222" stroke-width="1.5" fill="none"/><circle cx="%d" cy="67" r="2.5" fill="#222"/><text x="%d" y="71" fill="#333">leaky bucket: requests leaving, after their Delay</text>`+"\n", plotLeft+355, plotLeft+377, plotLeft+366, plotLeft+383)

	// Events: a shaded band down through every panel, labelled on top.
	for _, e := range c.events {
		x0, x1 := x(e.from), x(e.to)
		w(`<rect x="%s" y="%d" width="%s" height="%d" fill="#fff3d6"/>`+"\n",
			tenths(x0), firstPanel-18, tenths(max(x1-x0, 20)), bottom-firstPanel+18)
		w(`<text x="%s" y="%d" font-size="11" fill="#8a6100">%s</text>`+"\n", tenths(x0+20), firstPanel-6, esc(e.short))
	}

	for i, s := range c.series {
		top := firstPanel + i*(panelH+panelGap)
		colour := colours[i%len(colours)]
		// Labels.
		w(`<text x="20" y="%d" font-size="14" font-weight="bold" fill="%s">%s</text>`+"\n", top+18, colour, esc(s.name))
		w(`<text x="20" y="%d" font-size="10" font-family="Menlo, Consolas, monospace" fill="#444">%s</text>`+"\n", top+36, esc(ruleLine(s.rule)))
		w(`<text x="20" y="%d" font-size="11" fill="#444">served %d, busiest 1 s: %d</text>`+"\n", top+54, s.served, s.busiest)
		// Frame and grid: 0, the limit, twice the limit.
		w(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>`+"\n", plotLeft, top+panelH, plotLeft+plotWidth, top+panelH)
		w(`<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="#ddd"/>`+"\n", plotLeft, tenths(y(top, 2*c.limit)), plotLeft+plotWidth, tenths(y(top, 2*c.limit)))
		w(`<text x="%d" y="%s" font-size="9" text-anchor="end" fill="#888">%d</text>`+"\n", plotLeft-4, tenths(y(top, 2*c.limit)+30), 2*c.limit)
		w(`<text x="%d" y="%s" font-size="9" text-anchor="end" fill="#888">%d</text>`+"\n", plotLeft-4, tenths(y(top, c.limit)+30), c.limit)
		// Bars: offered behind, admitted in front, its count above it.
		for k := range bins {
			if n := c.offered[k]; n > 0 {
				w(`<rect x="%s" y="%s" width="%s" height="%s" fill="#e2e2e2"/>`+"\n",
					tenths(binX(k)+20), tenths(y(top, n)), tenths(binW-40), tenths(y(top, 0)-y(top, n)))
			}
		}
		w(`<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="#c00" stroke-width="1.5" stroke-dasharray="4 3"/>`+"\n",
			plotLeft, tenths(y(top, c.limit)), plotLeft+plotWidth, tenths(y(top, c.limit)))
		for k := range bins {
			if n := c.offered[k]; n > yMax {
				w(`<text x="%s" y="%s" font-size="9" text-anchor="middle" fill="#888">%d&#8593;</text>`+"\n",
					tenths(binX(k)+binW/2), tenths(y(top, yMax)+90), n)
			}
			if n := s.counts[k]; n > 0 {
				w(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n",
					tenths(binX(k)+80), tenths(y(top, n)), tenths(binW-160), tenths(y(top, 0)-y(top, n)), colour)
				w(`<text x="%s" y="%s" font-size="9" text-anchor="middle" fill="#222" stroke="#fff" stroke-width="2.5" paint-order="stroke">%d</text>`+"\n",
					tenths(binX(k)+binW/2), tenths(y(top, n)-25), n)
			}
		}
		if s.name == "leaky bucket" && c.leakyOut != nil {
			var pts []string
			for k, n := range c.leakyOut {
				cx, cy := binX(k)+binW/2, y(top, n)
				pts = append(pts, tenths(cx)+","+tenths(cy))
				w(`<circle cx="%s" cy="%s" r="2.5" fill="#222"/>`+"\n", tenths(cx), tenths(cy))
			}
			w(`<polyline points="%s" stroke="#222" stroke-width="1.5" fill="none"/>`+"\n", strings.Join(pts, " "))
		}
	}

	// The token bucket's level.
	full := c.burst * 1000
	ly := func(milli int64) int64 { return int64(levelTop+levelH)*10 - milli*levelH*10/full }
	w(`<text x="20" y="%d" font-size="14" font-weight="bold" fill="%s">token bucket level</text>`+"\n", levelTop+18, colours[0])
	w(`<text x="20" y="%d" font-size="11" fill="#444">tokens in the bucket (burst %d);</text>`+"\n", levelTop+36, c.burst)
	w(`<text x="20" y="%d" font-size="11" fill="#444">each admitted request takes one</text>`+"\n", levelTop+52)
	for _, v := range []int64{0, c.burst / 2, c.burst} {
		w(`<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s"/>`+"\n", plotLeft, tenths(ly(v*1000)), plotLeft+plotWidth, tenths(ly(v*1000)), map[bool]string{true: "#999", false: "#ddd"}[v == 0])
		w(`<text x="%d" y="%s" font-size="9" text-anchor="end" fill="#888">%d</text>`+"\n", plotLeft-4, tenths(ly(v*1000)+30), v)
	}
	var pts []string
	for _, p := range c.level {
		pts = append(pts, tenths(x(p.t))+","+tenths(ly(p.milli)))
	}
	w(`<polyline points="%s" stroke="%s" stroke-width="1.5" fill="none" stroke-linejoin="round"/>`+"\n", strings.Join(pts, " "), colours[0])

	// Time axis.
	w(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>`+"\n", plotLeft, bottom+6, plotLeft+plotWidth, bottom+6)
	for s := 0; s <= bins; s++ {
		tx := binX(s)
		w(`<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#999"/>`+"\n", tenths(tx), bottom+6, tenths(tx), bottom+10)
		w(`<text x="%s" y="%d" font-size="10" text-anchor="middle" fill="#555">%d</text>`+"\n", tenths(tx), bottom+22, s)
	}
	w(`<text x="%d" y="%d" font-size="11" text-anchor="middle" fill="#555">seconds</text>`+"\n", plotLeft+plotWidth/2, bottom+40)
	w("</svg>\n")
}

// ruleLine shortens a rule's Go source to fit beside its panel.
func ruleLine(rule string) string {
	r := strings.NewReplacer("PerSecond(10)", "10/s", "time.Second", "1s", "Window: ", "", "Limit: ", "", "Rate: ", "")
	return r.Replace(rule)
}

// tenths formats a length given in tenths of a pixel.
func tenths(v int64) string {
	if v%10 == 0 {
		return strconv.FormatInt(v/10, 10)
	}
	return strconv.FormatInt(v/10, 10) + "." + strconv.FormatInt(v%10, 10)
}

func esc(s string) string { return html.EscapeString(s) }
