package report

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strconv"
)

// PNG writes the chart of SVG as a PNG, for places that do not show SVG
// (some artifact viewers, chat). Only the standard library draws it: lines,
// frame, grid and tick numbers in a 3x5 digit font; run names are in the
// legend of the markdown report and the SVG, colours in the same order.
func PNG(w io.Writer, r *Report) error {
	img := image.NewRGBA(image.Rect(0, 0, svgW, svgH))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
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
	grey, light := color.RGBA{0x88, 0x88, 0x88, 0xff}, color.RGBA{0xee, 0xee, 0xee, 0xff}
	if x0 <= x1 && finite(y0) {
		if x1 == x0 {
			x1 = x0 + 1
		}
		y0, y1 = axisRange(y0, y1)
		sx := func(s int64) float64 { return svgLeft + float64(s-x0)/float64(x1-x0)*svgPlotW }
		sy := func(v float64) float64 { return svgTop + (y1/2-v/2)/(y1/2-y0/2)*svgPlotH }
		for i := 0; i <= 4; i++ {
			v := y0 + (y1/2-y0/2)*float64(i)/2
			y := sy(v)
			line(img, svgLeft, y, svgLeft+svgPlotW, y, light, 1)
			digits(img, svgLeft-6, int(y)-2, Num(round5(v)), grey, true)
			s := x0 + (x1-x0)*int64(i)/4
			digits(img, int(sx(s))+2*len(strconv.FormatInt(s, 10)), svgTop+int(svgPlotH)+10, strconv.FormatInt(s, 10), grey, true)
		}
		for i, c := range r.Curves {
			col := hexColor(palette[i%len(palette)].hex)
			var px, py float64
			have := false
			for _, p := range c.Points {
				if !finite(p.Value) {
					have = false
					x := sx(p.Step)
					line(img, x-3, svgTop, x+3, svgTop, col, 3)
					continue
				}
				x, y := sx(p.Step), sy(p.Value)
				if have {
					line(img, px, py, x, y, col, 2)
				}
				px, py, have = x, y, true
			}
			ly := float64(svgTop + 10 + 20*i)
			line(img, svgW-svgRight+15, ly, svgW-svgRight+35, ly, col, 3)
		}
	}
	rect := func(xa, ya, xb, yb float64) {
		line(img, xa, ya, xb, ya, grey, 1)
		line(img, xb, ya, xb, yb, grey, 1)
		line(img, xb, yb, xa, yb, grey, 1)
		line(img, xa, yb, xa, ya, grey, 1)
	}
	rect(svgLeft, svgTop, svgLeft+svgPlotW, svgTop+svgPlotH)
	if err := png.Encode(w, img); err != nil {
		return fmt.Errorf("encoding png: %w", err)
	}
	return nil
}

func hexColor(h string) color.RGBA {
	v, _ := strconv.ParseUint(h[1:], 16, 32)
	return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 0xff}
}

// line draws a segment of the given width by stepping along its longer
// axis (no anti-aliasing: this is an artifact, not a publication).
func line(img *image.RGBA, xa, ya, xb, yb float64, c color.RGBA, width int) {
	n := int(math.Max(math.Abs(xb-xa), math.Abs(yb-ya))) + 1
	if n > 1<<16 {
		n = 1 << 16
	}
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		x, y := int(math.Round(xa+(xb-xa)*t)), int(math.Round(ya+(yb-ya)*t))
		for dx := -(width - 1) / 2; dx <= width/2; dx++ {
			for dy := -(width - 1) / 2; dy <= width/2; dy++ {
				if image.Pt(x+dx, y+dy).In(img.Rect) {
					img.SetRGBA(x+dx, y+dy, c)
				}
			}
		}
	}
}

// font3x5 holds the glyphs tick labels need, rows top to bottom, 3 bits
// each.
var font3x5 = map[rune][5]uint8{
	'0': {7, 5, 5, 5, 7}, '1': {2, 6, 2, 2, 7}, '2': {7, 1, 7, 4, 7}, '3': {7, 1, 7, 1, 7},
	'4': {5, 5, 7, 1, 1}, '5': {7, 4, 7, 1, 7}, '6': {7, 4, 7, 5, 7}, '7': {7, 1, 1, 1, 1},
	'8': {7, 5, 7, 5, 7}, '9': {7, 5, 7, 1, 7}, '.': {0, 0, 0, 0, 2}, '-': {0, 0, 7, 0, 0},
	'+': {0, 2, 7, 2, 0}, 'e': {0, 7, 7, 4, 7}, 'N': {5, 7, 7, 7, 5}, 'a': {0, 6, 1, 7, 7},
	'I': {7, 2, 2, 2, 7}, 'n': {0, 6, 5, 5, 5}, 'f': {3, 4, 6, 4, 4},
}

// digits draws s at 2x scale, right-aligned at x when right is set.
func digits(img *image.RGBA, x, y int, s string, c color.RGBA, right bool) {
	const scale, adv = 2, 8
	if right {
		x -= len(s) * adv
	}
	for i, r := range s {
		g, ok := font3x5[r]
		if !ok {
			continue
		}
		for row := range 5 {
			for col := range 3 {
				if g[row]&(4>>col) == 0 {
					continue
				}
				for dx := range scale {
					for dy := range scale {
						p := image.Pt(x+i*adv+col*scale+dx, y+row*scale+dy)
						if p.In(img.Rect) {
							img.SetRGBA(p.X, p.Y, c)
						}
					}
				}
			}
		}
	}
}
