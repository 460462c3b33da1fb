package report

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
)

const (
	svgW, svgH                 = 880, 440
	svgLeft, svgRight          = 70, 170
	svgTop, svgBottom          = 40, 50
	svgPlotW, svgPlotH float64 = svgW - svgLeft - svgRight, svgH - svgTop - svgBottom
)

// SVG writes a standalone line chart of every run (its own steps,
// downsampled keeping spikes) for a CI artifact. NaN/Inf points break the
// line and are marked on the top edge.
func SVG(w io.Writer, r *Report) error {
	var b bytes.Buffer
	x0, x1 := int64(math.MaxInt64), int64(math.MinInt64)
	y0, y1 := math.Inf(1), math.Inf(-1)
	for _, c := range r.Curves {
		for _, p := range c.Points {
			x0, x1 = min(x0, p.Step), max(x1, p.Step)
			if finite(p.Value) {
				y0, y1 = min(y0, p.Value), max(y1, p.Value)
			}
		}
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", svgW, svgH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">%s by step — %s</text>`+"\n", svgLeft, html.EscapeString(r.Metric), html.EscapeString(r.Verdict))
	if x0 > x1 || !finite(y0) {
		b.WriteString(`<text x="70" y="200">no finite values to draw</text>` + "\n</svg>\n")
		_, err := w.Write(b.Bytes())
		return err
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	y0, y1 = axisRange(y0, y1)
	sx := func(s int64) float64 { return svgLeft + float64(s-x0)/float64(x1-x0)*svgPlotW }
	// Halves keep the arithmetic finite for values near the float64 limits.
	sy := func(v float64) float64 { return svgTop + (y1/2-v/2)/(y1/2-y0/2)*svgPlotH }
	// Frame, ticks and grid.
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%s" height="%s" fill="none" stroke="#888888"/>`+"\n", svgLeft, svgTop, f1(svgPlotW), f1(svgPlotH))
	for i := 0; i <= 4; i++ {
		v := y0 + (y1/2-y0/2)*float64(i)/2
		y := sy(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%s" y2="%s" stroke="#eeeeee"/>`+"\n", svgLeft, f1(y), f1(svgLeft+svgPlotW), f1(y))
		fmt.Fprintf(&b, `<text x="%d" y="%s" text-anchor="end">%s</text>`+"\n", svgLeft-6, f1(y+4), Num(round5(v)))
		s := x0 + (x1-x0)*int64(i)/4
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%d</text>`+"\n", f1(sx(s)), f1(svgTop+svgPlotH+18), s)
	}
	fmt.Fprintf(&b, `<text x="%s" y="%d" text-anchor="middle">step</text>`+"\n", f1(svgLeft+svgPlotW/2), svgH-8)
	for i, c := range r.Curves {
		col := palette[i%len(palette)].hex
		var seg []byte
		flush := func() {
			if len(seg) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", col, bytes.TrimSpace(seg))
				seg = seg[:0]
			}
		}
		for _, p := range c.Points {
			if !finite(p.Value) {
				flush()
				fmt.Fprintf(&b, `<circle cx="%s" cy="%d" r="3" fill="%s"><title>%s at step %d</title></circle>`+"\n", f1(sx(p.Step)), svgTop, col, Num(p.Value), p.Step)
				continue
			}
			seg = append(seg, f1(sx(p.Step))...)
			seg = append(seg, ',')
			seg = append(seg, f1(sy(p.Value))...)
			seg = append(seg, ' ')
		}
		flush()
		ly := svgTop + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", svgW-svgRight+15, ly, svgW-svgRight+35, ly, col)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", svgW-svgRight+40, ly+4, html.EscapeString(c.Label))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func f1(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
