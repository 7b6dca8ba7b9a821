package datapath

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// palette gives each mode a colour; plain is grey.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"}

type plotBar struct {
	mode          string
	med, min, max float64
	ok            bool
}

type plotGroup struct {
	label, sub string
	bars       []plotBar
}

// plot draws, for every size keep selects and every queue count, one bar
// per mode measured there: its rate (round trips per second for rr)
// relative to plain in the same run (median, whiskers min–max), with the
// goal as a line when there is one.
func (t *table) plot(title string, goal float64, keep func(Size) bool) string {
	var modes []string
	for _, m := range t.opts.Modes {
		for _, size := range t.opts.Sizes {
			for _, q := range t.opts.Queues {
				if keep(size) && t.has(size.Name, q, m.Name) && !slices.Contains(modes, m.Name) {
					modes = append(modes, m.Name)
				}
			}
		}
	}
	var groups []plotGroup
	for _, size := range t.opts.Sizes {
		for _, q := range t.opts.Queues {
			if !keep(size) || !t.hasGroup(size.Name, q) {
				continue
			}
			g := plotGroup{label: fmt.Sprintf("%s, %d %s", size.Name, q, plural(q, "queue", "queues"))}
			if size.Proto == protoTCP {
				g.sub = fmt.Sprintf("plain %.2f Gbit/s", t.spread(size.Name, q, "plain", func(s Sample) float64 { return s.Gbps }).Median)
			} else {
				g.sub = fmt.Sprintf("plain %s kpps", kpps(t.spread(size.Name, q, "plain", func(s Sample) float64 { return s.PPS }).Median))
			}
			for _, m := range modes {
				r, ok := t.ratio(size.Name, q, m)
				g.bars = append(g.bars, plotBar{mode: m, med: r.Median, min: r.Min, max: r.Max, ok: ok})
			}
			groups = append(groups, g)
		}
	}
	sub := fmt.Sprintf("median of %d runs, whiskers min–max; dashed: plain (1.0)", t.opts.Runs)
	if goal > 0 {
		sub += fmt.Sprintf(", red: goal %.2gx", goal)
	}
	return barChart(title, sub, groups, modes, goal)
}

func modeNames(ms []Mode) []string {
	var n []string
	for _, m := range ms {
		n = append(n, m.Name)
	}
	return n
}

func barChart(title, subtitle string, groups []plotGroup, modes []string, goal float64) string {
	const (
		barW   = 18
		gap    = 36
		left   = 56
		top    = 64
		plotH  = 300
		bottom = 64
	)
	groupW := len(modes)*barW + gap
	width := left + max(1, len(groups))*groupW + 170
	height := top + plotH + bottom
	ymax := math.Max(1.2, goal*1.15)
	for _, g := range groups {
		for _, b := range g.bars {
			if b.ok {
				ymax = math.Max(ymax, b.max*1.1)
			}
		}
	}
	step := niceStep(ymax / 6)
	ymax = math.Ceil(ymax/step) * step
	y := func(v float64) float64 { return top + plotH - v/ymax*plotH }
	color := func(i int) string {
		if modes[i] == "plain" {
			return "#9d9d9d"
		}
		return palette[i%len(palette)]
	}

	var s strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&s, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	p(`<text x="%d" y="40" fill="#555">%s</text>`+"\n", left, html.EscapeString(subtitle))
	plotRight := left + len(groups)*groupW
	for v := 0.0; v <= ymax+1e-9; v += step {
		p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, plotRight, y(v), y(v))
		p(`<text x="%d" y="%.1f" text-anchor="end" fill="#333">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
	}
	p(`<text transform="translate(14 %d) rotate(-90)" text-anchor="middle" fill="#333">× plain (same run)</text>`+"\n", top+plotH/2)
	for gi, g := range groups {
		x0 := left + gi*groupW + gap/2
		for bi, b := range g.bars {
			if !b.ok {
				continue
			}
			x := float64(x0 + bi*barW)
			p(`<rect x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s: %.2fx (%.2f–%.2f)</title></rect>`+"\n",
				x+1, y(b.med), barW-2, y(0)-y(b.med), color(bi), html.EscapeString(b.mode), b.med, b.min, b.max)
			cx := x + barW/2
			if b.max > b.min {
				p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#222"/>`+"\n", cx, cx, y(b.min), y(b.max))
				p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#222"/>`+"\n", cx-3, cx+3, y(b.max), y(b.max))
				p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#222"/>`+"\n", cx-3, cx+3, y(b.min), y(b.min))
			}
			p(`<text transform="translate(%.1f %.1f) rotate(-90)" font-size="9" fill="#222">%.2f</text>`+"\n", cx+3, math.Min(y(b.max), y(b.med))-4, b.med)
		}
		cx := x0 + len(g.bars)*barW/2
		p(`<text x="%d" y="%d" text-anchor="middle" fill="#222">%s</text>`+"\n", cx, top+plotH+18, html.EscapeString(g.label))
		p(`<text x="%d" y="%d" text-anchor="middle" fill="#666">%s</text>`+"\n", cx, top+plotH+34, html.EscapeString(g.sub))
	}
	p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, plotRight, y(0), y(0))
	p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="5 4"/>`+"\n", left, plotRight, y(1), y(1))
	if goal > 0 {
		p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#d62728" stroke-dasharray="2 3"/>`+"\n", left, plotRight, y(goal), y(goal))
		p(`<text x="%d" y="%.1f" fill="#d62728">goal %.2gx</text>`+"\n", plotRight+4, y(goal)+4, goal)
	}
	for i, m := range modes {
		ly := top + 10 + i*18
		p(`<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", plotRight+60, ly-10, color(i))
		p(`<text x="%d" y="%d">%s</text>`+"\n", plotRight+78, ly, html.EscapeString(m))
	}
	p("</svg>\n")
	return s.String()
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
