package report

import (
	"bytes"
	"cmp"
	"fmt"
	"html"
	"image/color"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/gpupass/gpupass/internal/metrics"
)

// The chart files: gonum/plot draws one figure, vgsvg writes it as SVG
// and vgimg as PNG, so both show the same axes, legend and notes.

// Size of the chart in points; at 96 DPI (the PNG's, and a browser's
// for the SVG's pt) that is 880x440 pixels, plus one line per note.
const (
	chartW     = 660 * vg.Length(1)
	chartH     = 330 * vg.Length(1)
	noteLine   = 13 * vg.Length(1)
	chartDPI   = 96
	maxNotes   = 8
	legendMinW = 110 * vg.Length(1)
	legendMaxW = 210 * vg.Length(1)
	// AutoLogDecades is the span of the positive values, in decades,
	// from which the y axis is logarithmic without --log-y: a loss that
	// falls from 10 to 0.1 puts every curve after the first steps in the
	// bottom few pixels of a linear axis.
	AutoLogDecades = 2
)

var (
	sans      = font.Font{Typeface: "Liberation", Variant: "Sans"}
	bandColor = color.NRGBA{0x1f, 0x77, 0xb4, 0x33}
	divColor  = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	grey      = color.RGBA{0x55, 0x55, 0x55, 0xff}
)

// ChartOptions says how SVG and PNG draw a report.
type ChartOptions struct {
	// LogY draws the y axis on a log scale. Without it the axis is
	// logarithmic anyway when the positive values span AutoLogDecades.
	LogY bool
}

// SVG writes the chart of r with the default options.
func SVG(w io.Writer, r *Report) error { return ChartOptions{}.SVG(w, r) }

// PNG writes the chart of r with the default options.
func PNG(w io.Writer, r *Report) error { return ChartOptions{}.PNG(w, r) }

// SVG writes a standalone chart of every run (its own steps, downsampled
// keeping spikes) for a CI artifact or to inline in a page: every text
// is escaped and no font is embedded (the text names Liberation Sans
// and its metric-compatible fallbacks), so it stays a few tens of kB.
func (o ChartOptions) SVG(w io.Writer, r *Report) (err error) {
	defer drawing(&err)
	f := newFigure(r, o)
	c := vgsvg.New(chartW, f.height)
	f.draw(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return fmt.Errorf("writing svg: %w", err)
	}
	out := b.Bytes()
	// The XML prologue has no business inside an HTML page that inlines
	// the chart; a standalone SVG does not need it either.
	if i := bytes.Index(out, []byte("<svg")); i > 0 {
		out = out[i:]
	}
	out = bytes.ReplaceAll(out, []byte("font-family:Liberation Sans;"), []byte("font-family:Liberation Sans,Arial,Helvetica,sans-serif;"))
	out = presentationAttrs(out)
	_, err = w.Write(out)
	return err
}

// styleAttr is one style attribute of vgsvg's output, with the space
// before it.
var styleAttr = regexp.MustCompile(`\s+style="([^"]*)"`)

// presentationAttrs rewrites vgsvg's style="fill:none;stroke:#1F77B4"
// as fill="none" stroke="#1F77B4": a page whose Content-Security-Policy
// forbids inline styles (the dashboard's: style-src 'self') ignores style
// attributes of an inlined SVG, and every path is then filled black.
// vgsvg writes only properties that are presentation attributes too.
func presentationAttrs(svg []byte) []byte {
	return styleAttr.ReplaceAllFunc(svg, func(m []byte) []byte {
		var b bytes.Buffer
		for _, decl := range strings.Split(string(styleAttr.FindSubmatch(m)[1]), ";") {
			k, v, ok := strings.Cut(decl, ":")
			if !ok || strings.TrimSpace(k) == "" {
				continue
			}
			fmt.Fprintf(&b, ` %s="%s"`, html.EscapeString(strings.TrimSpace(k)), html.EscapeString(strings.TrimSpace(v)))
		}
		return b.Bytes()
	})
}

// PNG writes the chart of SVG as a PNG, for places that do not show SVG
// (some artifact viewers, chat).
func (o ChartOptions) PNG(w io.Writer, r *Report) (err error) {
	defer drawing(&err)
	f := newFigure(r, o)
	c := vgimg.NewWith(vgimg.UseWH(chartW, f.height), vgimg.UseDPI(chartDPI))
	f.draw(draw.New(c))
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(w); err != nil {
		return fmt.Errorf("encoding png: %w", err)
	}
	return nil
}

// drawing turns a panic of gonum/plot (its way to refuse a value, e.g.
// one ≤ 0 on a log axis) into an error: a chart the data cannot make
// must not take the comparison, or the dashboard, down with it.
func drawing(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("drawing the chart: %v", p)
	}
}

// figure is a report's chart, laid out: the plot on the left, the legend
// on the right, the notes under both.
type figure struct {
	title  string
	plot   *plot.Plot // nil when nothing can be drawn
	legend plot.Legend
	// entries are the legend's, put in it once their names fit.
	entries []legendEntry
	notes   []string
	height  vg.Length
	// legendW is the legend column's width.
	legendW vg.Length
	// caption heads the legend.
	caption string
}

type legendEntry struct {
	name  string
	thumb plot.Thumbnailer
}

func (f *figure) addLegend(name string, thumb plot.Thumbnailer) {
	if thumb != nil {
		f.entries = append(f.entries, legendEntry{name, thumb})
	}
}

func style(size vg.Length, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(sans, size), Handler: plot.DefaultTextHandler}
}

func hexColor(h string) color.RGBA {
	v, _ := strconv.ParseUint(h[1:], 16, 32)
	return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 0xff}
}

func runColor(i int) color.RGBA { return hexColor(palette[i%len(palette)].hex) }

func newFigure(r *Report, o ChartOptions) *figure {
	f := &figure{title: r.Metric + " by step — " + r.Verdict}
	defer func() {
		if len(f.notes) > maxNotes {
			f.notes = append(f.notes[:maxNotes-1], fmt.Sprintf("… and %d more note(s): see the report", len(f.notes)-maxNotes+1))
		}
		f.height = chartH + noteLine*vg.Length(len(f.notes))
		if f.plot == nil {
			f.height = 3*noteLine + noteLine*vg.Length(len(f.notes))
		}
	}()

	// The ranges of what can be drawn.
	x0, x1 := int64(math.MaxInt64), int64(math.MinInt64)
	lo, hi, minPos, maxPos := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	nonFinite := 0
	for _, c := range r.Curves {
		finiteHere := 0
		for _, p := range c.Points {
			x0, x1 = min(x0, p.Step), max(x1, p.Step)
			if !finite(p.Value) {
				nonFinite++
				continue
			}
			finiteHere++
			lo, hi = min(lo, p.Value), max(hi, p.Value)
			if p.Value > 0 {
				minPos, maxPos = min(minPos, p.Value), max(maxPos, p.Value)
			}
		}
		if finiteHere == 0 && len(r.Curves) > 1 {
			f.notes = append(f.notes, c.Label+": no finite value to draw")
		}
	}
	if !finite(lo) {
		f.notes = append(f.notes, fmt.Sprintf("no finite %s values to draw: %d point(s), each NaN or infinite", r.Metric, nonFinite))
		return f
	}
	if x0 == x1 {
		x1 = x0 + 1
	}

	logY := o.LogY
	if logY && !finite(minPos) {
		logY = false
		f.notes = append(f.notes, "log scale asked for, but no value is above 0: drawn on a linear scale")
	}
	if !logY && finite(minPos) && lo > 0 && maxPos/minPos >= math.Pow(10, AutoLogDecades) {
		logY = true
		f.notes = append(f.notes, "log scale: the values span "+Sig3(math.Log10(maxPos/minPos))+" decades")
	}

	p := plot.New()
	f.plot = p
	p.Title.Text = f.title
	p.Title.TextStyle = style(13, color.Black)
	p.Title.TextStyle.XAlign = draw.XCenter
	p.Title.TextStyle.YAlign = draw.YTop
	p.Title.Padding = 6
	p.X.Label.Text = "step"
	p.Y.Label.Text = r.Metric
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		// gonum's styles place and turn the labels; only the font is ours.
		a.Label.TextStyle.Font = font.From(sans, 11)
		a.Tick.Label.Font, a.Tick.Label.Color = font.From(sans, 10), grey
		a.Color, a.Tick.Color = grey, grey
	}

	xt := niceTicks{integer: true}
	xMin, xMax, step := niceRange(float64(x0), float64(x1), true)
	xt.step = step
	p.X.Tick.Marker, p.X.Scale = xt, linearScale{}
	var yMin, yMax float64
	if logY {
		p.Y.Label.Text += " (log scale)"
		yMin, yMax = logFloor(minPos), logCeil(maxPos)
		if yMin == yMax {
			yMax = logCeil(yMax * 1.01)
		}
		// gonum takes an infinite bound for 0, which a log axis cannot
		// have.
		yMax = min(yMax, math.MaxFloat64)
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{}
		if n := countFinite(r.Curves, func(v float64) bool { return v <= 0 }); n > 0 {
			f.notes = append(f.notes, fmt.Sprintf("%d value(s) ≤ 0 not drawn on the log scale", n))
		}
	} else {
		if lo >= 0 {
			// A loss cannot be negative: an axis below 0 says it could.
			lo = 0
		}
		if len(r.Curves) > 1 && len(r.Pairs) > 0 {
			// The tolerance band whole, not cut at the top edge.
			for _, ring := range toleranceBand(r.Curves[0].Points, r.Tolerance, finite, lo, false) {
				for _, pt := range ring {
					if finite(pt.Y) {
						hi = max(hi, pt.Y)
					}
				}
			}
		}
		yt := niceTicks{}
		yMin, yMax, yt.step = niceRange(lo, hi, false)
		p.Y.Scale, p.Y.Tick.Marker = linearScale{}, yt
	}
	drawable := func(v float64) bool { return finite(v) && (!logY || v > 0) }

	// A grid behind everything.
	grid := plotter.NewGrid()
	grid.Vertical.Color, grid.Horizontal.Color = color.RGBA{0xe5, 0xe5, 0xe5, 0xff}, color.RGBA{0xe5, 0xe5, 0xe5, 0xff}
	grid.Vertical.Width, grid.Horizontal.Width = 0.5, 0.5
	p.Add(grid)

	f.caption = "run"
	if len(r.Curves) > 1 {
		f.caption = "runs (first = reference)"
	}
	f.legend = plot.NewLegend()
	f.legend.TextStyle = style(10, color.Black)
	f.legend.Top, f.legend.Left = true, true
	f.legend.Padding = 3
	f.legend.ThumbnailWidth = 18

	// The tolerance band of the reference run (the first: relative
	// differences are to it), where a point of another run must lie.
	var band plot.Thumbnailer
	if len(r.Curves) > 1 && len(r.Pairs) > 0 {
		var first plot.Thumbnailer
		for _, ring := range toleranceBand(r.Curves[0].Points, r.Tolerance, drawable, yMin, logY) {
			poly, err := plotter.NewPolygon(ring)
			if err != nil {
				continue
			}
			poly.Color = bandColor
			poly.LineStyle.Width = 0
			p.Add(poly)
			if first == nil {
				first = poly
			}
		}
		band = first
	}

	// Identical runs: the later one dashed, so both show.
	identical := map[string]string{}
	for _, pr := range r.Pairs {
		if pr.Error == "" && pr.CommonSteps > 0 && float64(pr.MaxAbsDelta) == 0 {
			if _, ok := identical[pr.B]; !ok {
				identical[pr.B] = pr.A
				what := "curves identical (max |Δ| 0)"
				if pr.NonFiniteSteps > 0 {
					what = "curves identical where finite (max |Δ| 0)"
				}
				f.notes = append(f.notes, what+": "+pr.Label()+"; "+pr.B+" dashed")
			}
		}
	}

	var nanMarks, restartMarks plotter.XYs
	var nanColors, restartColors []color.Color
	for i, c := range r.Curves {
		ls := draw.LineStyle{Color: runColor(i), Width: 1.5}
		if _, ok := identical[c.Label]; ok {
			ls.Width = 2
			ls.Dashes = []vg.Length{6, 4}
		}
		var seg plotter.XYs
		var thumb plot.Thumbnailer
		flush := func() {
			switch len(seg) {
			case 0:
			case 1:
				// A lone point has no line to show it.
				if s, err := plotter.NewScatter(seg); err == nil {
					s.GlyphStyle = draw.GlyphStyle{Color: ls.Color, Radius: 2, Shape: draw.CircleGlyph{}}
					p.Add(s)
				}
			default:
				if l, err := plotter.NewLine(seg); err == nil {
					l.LineStyle = ls
					p.Add(l)
					thumb = l
				}
			}
			seg = nil
		}
		var bad []string
		for _, pt := range c.Points {
			if !drawable(pt.Value) {
				flush()
				if !finite(pt.Value) {
					nanMarks = append(nanMarks, plotter.XY{X: float64(pt.Step), Y: yMax})
					nanColors = append(nanColors, ls.Color)
					bad = append(bad, strconv.FormatInt(pt.Step, 10))
				}
				continue
			}
			seg = append(seg, plotter.XY{X: float64(pt.Step), Y: pt.Value})
		}
		flush()
		if thumb == nil {
			l := &plotter.Line{LineStyle: ls}
			thumb = l
		}
		f.addLegend(c.Label, thumb)
		if len(bad) > 0 {
			f.notes = append(f.notes, c.Label+": NaN or Inf at step "+listSteps(bad)+" (× on the top edge)")
		}
		var at []string
		for _, rs := range c.Restarts {
			y := yMin
			if v, ok := valueNear(c.Points, rs.Resume); ok && drawable(v) {
				y = v
			}
			restartMarks = append(restartMarks, plotter.XY{X: float64(rs.Resume), Y: y})
			restartColors = append(restartColors, ls.Color)
			switch {
			case rs.NonFinite:
				at = append(at, fmt.Sprintf("%d (after a NaN or Inf at %d)", rs.Resume, rs.After))
			default:
				at = append(at, fmt.Sprintf("%d (after %d)", rs.Resume, rs.After))
			}
		}
		if len(at) > 0 {
			f.notes = append(f.notes, c.Label+": restarted at step "+listSteps(at)+" (▲)")
		}
	}

	if band != nil {
		f.addLegend("tolerance of "+r.Curves[0].Label, band)
	}
	// The first divergence of each pair that has one.
	divs := map[int64][]string{}
	for _, pr := range r.Pairs {
		if pr.FirstDivergence != nil {
			divs[*pr.FirstDivergence] = append(divs[*pr.FirstDivergence], pr.Label())
		}
	}
	steps := make([]int64, 0, len(divs))
	for s := range divs {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	for i, s := range steps {
		l, err := plotter.NewLine(plotter.XYs{{X: float64(s), Y: yMin}, {X: float64(s), Y: yMax}})
		if err != nil {
			continue
		}
		l.LineStyle = draw.LineStyle{Color: divColor, Width: 1.2, Dashes: []vg.Length{4, 3}}
		p.Add(l)
		lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: float64(s), Y: yMax}}, Labels: []string{"diverged: step " + strconv.FormatInt(s, 10)}})
		if err == nil {
			lab.TextStyle[0] = style(9, divColor)
			lab.TextStyle[0].YAlign = draw.YTop
			lab.Offset = vg.Point{X: 3, Y: -3 - 11*vg.Length(i)}
			p.Add(lab)
		}
		if i == 0 {
			f.addLegend("first divergence", l)
		}
		f.notes = append(f.notes, "first divergence at step "+strconv.FormatInt(s, 10)+": "+strings.Join(divs[s], ", ")+" (tolerance "+r.Tolerance.String()+")")
	}
	if len(nanMarks) > 0 {
		f.addLegend("NaN or Inf", marks(p, nanMarks, nanColors, draw.CrossGlyph{}))
	}
	if len(restartMarks) > 0 {
		f.addLegend("restart", marks(p, restartMarks, restartColors, draw.PyramidGlyph{}))
	}
	// Set last: plotters widen the axes to their data, the band too.
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xMin, xMax, yMin, yMax
	f.fitLegend()
	return f
}

// marks adds a glyph at each point in its run's colour.
func marks(p *plot.Plot, at plotter.XYs, colors []color.Color, shape draw.GlyphDrawer) plot.Thumbnailer {
	s, err := plotter.NewScatter(at)
	if err != nil {
		return nil
	}
	s.GlyphStyle = draw.GlyphStyle{Color: grey, Radius: 3.5, Shape: shape}
	s.GlyphStyleFunc = func(i int) draw.GlyphStyle {
		return draw.GlyphStyle{Color: colors[i], Radius: 3.5, Shape: shape}
	}
	p.Add(s)
	return s
}

// listSteps writes the first few of steps and how many more.
func listSteps(steps []string) string {
	const show = 3
	if len(steps) <= show {
		return strings.Join(steps, ", ")
	}
	return strings.Join(steps[:show], ", ") + fmt.Sprintf(" and %d more", len(steps)-show)
}

// valueNear is the value of the point drawn nearest to step (a curve is
// downsampled: the step itself may not be among its points).
func valueNear(pts []metrics.Point, step int64) (float64, bool) {
	if len(pts) == 0 {
		return 0, false
	}
	i, _ := slices.BinarySearchFunc(pts, step, func(p metrics.Point, s int64) int { return cmp.Compare(p.Step, s) })
	if i == len(pts) || (i > 0 && step-pts[i-1].Step < pts[i].Step-step) {
		i--
	}
	return pts[i].Value, true
}

func countFinite(cs []Curve, pred func(float64) bool) int {
	n := 0
	for _, c := range cs {
		for _, p := range c.Points {
			if finite(p.Value) && pred(p.Value) {
				n++
			}
		}
	}
	return n
}

// toleranceBand is the polygons around ref within which another run
// passes every check of tol: |Δ| ≤ abs and |Δ| ≤ rel·|ref|, whichever is
// tighter. A point that cannot be drawn breaks the band.
func toleranceBand(ref []metrics.Point, tol Tolerance, drawable func(float64) bool, floor float64, logY bool) []plotter.XYs {
	var out []plotter.XYs
	var up, down plotter.XYs
	flush := func() {
		if len(up) > 1 {
			poly := append(plotter.XYs{}, up...)
			for i := len(down) - 1; i >= 0; i-- {
				poly = append(poly, down[i])
			}
			out = append(out, poly)
		}
		up, down = nil, nil
	}
	for _, p := range ref {
		if !drawable(p.Value) {
			flush()
			continue
		}
		d := math.Inf(1)
		if tol.HasAbs {
			d = tol.Abs
		}
		if tol.HasRel {
			d = min(d, tol.Rel*math.Abs(p.Value))
		}
		if !finite(d) {
			flush()
			continue
		}
		lo := p.Value - d
		if logY && lo < floor {
			lo = floor
		}
		up = append(up, plotter.XY{X: float64(p.Step), Y: p.Value + d})
		down = append(down, plotter.XY{X: float64(p.Step), Y: lo})
	}
	flush()
	return out
}

// fitLegend sizes the legend column to its longest entry, within
// bounds; longer run names are cut with "…" (the tables name them in
// full).
func (f *figure) fitLegend() {
	sty := f.legend.TextStyle
	room := (legendMaxW-f.legend.ThumbnailWidth-8)*5/6 - sty.Width("  ")
	w := legendMinW
	for _, e := range f.entries {
		name := e.name
		if sty.Width(name) > room {
			r := []rune(name)
			for len(r) > 1 && sty.Width(string(r)+"…") > room {
				r = r[:len(r)-1]
			}
			name = string(r) + "…"
		}
		f.legend.Add(name, e.thumb)
		// A fifth more than Liberation Sans needs: a viewer of the SVG
		// without it or Arial draws the text in a wider font.
		w = max(w, f.legend.ThumbnailWidth+sty.Width("  "+name)*6/5+8)
	}
	w = max(w, style(10, grey).Width(f.caption)*6/5+8)
	f.legendW = min(w, legendMaxW)
}

func (f *figure) draw(dc draw.Canvas) {
	notes := style(10, color.Black)
	if f.plot == nil {
		title := style(13, color.Black)
		title.YAlign = draw.YTop
		dc.FillText(title, vg.Point{X: 10, Y: dc.Max.Y - 6}, f.title)
		for i, n := range f.notes {
			dc.FillText(notes, vg.Point{X: 10, Y: dc.Max.Y - 2*noteLine - noteLine*vg.Length(i+1)}, n)
		}
		return
	}
	notesH := noteLine * vg.Length(len(f.notes))
	plotArea := draw.Crop(dc, 0, -f.legendW, notesH, -4)
	f.plot.Draw(plotArea)
	// The legend: a caption, then one entry per run and per mark, at the
	// height of the data area's top.
	caption := style(10, grey)
	caption.YAlign = draw.YTop
	top := dc.Max.Y - 30
	left := dc.Max.X - f.legendW + 8
	dc.FillText(caption, vg.Point{X: left, Y: top}, f.caption)
	lc := draw.Crop(dc, dc.Size().X-f.legendW+8, 0, notesH, -(30 + 16))
	f.legend.Draw(lc)
	for i, n := range f.notes {
		dc.FillText(notes, vg.Point{X: 10, Y: dc.Min.Y + notesH - noteLine*vg.Length(i+1) + 3}, n)
	}
}

// logFloor is the largest 1, 2 or 5 times a power of ten at most v.
func logFloor(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if m*p <= v*(1+1e-9) {
			return m * p
		}
	}
	return p
}

// logCeil is the smallest 1, 2 or 5 times a power of ten at least v.
func logCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// niceRange widens [lo, hi] to whole multiples of a 1-2-5 step that
// gives about six ticks. Halves keep the arithmetic finite near the
// float64 limits.
func niceRange(lo, hi float64, integer bool) (float64, float64, float64) {
	if hi == lo {
		d := max(math.Abs(hi)*0.05, 0.5)
		if integer {
			d = 1
		}
		lo, hi = lo-d, hi+d
	}
	step := niceStep((hi/2 - lo/2) * 2 / 6)
	if integer {
		step = max(step, 1)
	}
	a, b := math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	if !finite(a) {
		a = lo
	}
	if !finite(b) {
		b = hi
	}
	return a, b, step
}

// niceStep is the smallest 1, 2 or 5 times a power of ten that is at
// least raw.
func niceStep(raw float64) float64 {
	if !finite(raw) || raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if s := m * p; s >= raw*(1-1e-9) && finite(s) {
			return s
		}
	}
	return 10 * p
}

// niceTicks puts a labelled tick at every multiple of step and an
// unlabelled one halfway.
type niceTicks struct {
	step    float64
	integer bool
}

func (t niceTicks) Ticks(lo, hi float64) []plot.Tick {
	step := t.step
	if step <= 0 || !finite(step) {
		_, _, step = niceRange(lo, hi, t.integer)
	}
	var out []plot.Tick
	first := math.Ceil(lo/step - 1e-9)
	for k := first; k*step <= hi*(1+1e-12)+step*1e-9 && len(out) < 40; k++ {
		v := k * step
		out = append(out, plot.Tick{Value: v, Label: tickLabel(v, step)})
		if half := v + step/2; half <= hi && (!t.integer || step >= 2) {
			out = append(out, plot.Tick{Value: half})
		}
	}
	return out
}

// tickLabel writes v with the decimals its step needs and no more: 0.15,
// 2000, 0.0005; exponent form only far from 1.
func tickLabel(v, step float64) string {
	if math.Abs(v) < step*1e-6 {
		return "0"
	}
	if a := math.Abs(v); a >= 1e9 || a < 1e-5 {
		digits := int(math.Floor(math.Log10(a))-math.Floor(math.Log10(step)+1e-9)) + 1
		return strconv.FormatFloat(v, 'g', max(digits, 1), 64)
	}
	decimals := max(0, -int(math.Floor(math.Log10(step)+1e-9)))
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', decimals, 64), 64)
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// logTicks labels each power of ten, and 2 and 5 times it when the axis
// spans at most two decades; other digits get an unlabelled tick.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	d0, d1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	few := d1-d0 <= 2
	var out []plot.Tick
	for d := d0; d <= d1; d++ {
		p := math.Pow(10, d)
		for m := 1.0; m < 10; m++ {
			v := m * p
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (few && (m == 2 || m == 5)) {
				t.Label = Sig3(v)
			}
			out = append(out, t)
		}
	}
	return out
}

// linearScale is plot.LinearScale computed on halves, so that an axis
// from -1e308 to 1e308 does not overflow to NaN coordinates.
type linearScale struct{}

func (linearScale) Normalize(lo, hi, x float64) float64 {
	return (x/2 - lo/2) / (hi/2 - lo/2)
}
