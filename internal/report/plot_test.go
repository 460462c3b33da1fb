package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/metrics"
)

// svgTexts is every <text> of an SVG in document order: what a reader
// of the chart reads (title, ticks, axis labels, legend, notes).
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var out []string
	in := false
	var cur strings.Builder
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("invalid XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "text" {
				in = true
				cur.Reset()
			}
		case xml.CharData:
			if in {
				cur.Write(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" {
				in = false
				out = append(out, cur.String())
			}
		}
	}
}

// nanAttr finds a NaN or Inf in an attribute (a coordinate).
var nanAttr = regexp.MustCompile(`="[^"]*(NaN|Inf)[^"]*"`)

// jsonlSeries reads a JSONL log as compare does.
func jsonlSeries(t *testing.T, label, log string) *metrics.Series {
	t.Helper()
	s, err := metrics.ReadJSONL(strings.NewReader(log), label+".jsonl", metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Label = label
	return s
}

// chartCases are the charts whose text is golden: the report scenarios
// and the cases of issue #36.
func chartCases(t *testing.T) map[string]struct {
	series []*metrics.Series
	tol    Tolerance
	opt    ChartOptions
} {
	cases := map[string]struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{}
	for name, sc := range scenarios() {
		cases[name] = struct {
			series []*metrics.Series
			tol    Tolerance
			opt    ChartOptions
		}{sc.series, sc.tol, ChartOptions{}}
	}
	// A loss from 10 to 0.001: linear, every curve after step 30 would
	// sit on the bottom edge.
	decay := func(label string, f float64) *metrics.Series {
		s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "loss"}
		for st := int64(0); st <= 150; st += 5 {
			s.Points = append(s.Points, metrics.Point{Step: st, Value: 10 * math.Exp(-float64(st)/15) * f})
		}
		return s
	}
	cases["auto-log"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{[]*metrics.Series{decay("us", 1), decay("eu", 1.01)}, DefaultTolerance, ChartOptions{}}
	sc := scenarios()["consistent"]
	cases["log-y"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{sc.series, sc.tol, ChartOptions{LogY: true}}
	// The loss blows up at step 50; the run restarts from its step-40
	// checkpoint and trains on.
	var ref, restarted strings.Builder
	for st := 0; st <= 100; st += 10 {
		fmt.Fprintf(&ref, "{\"step\":%d,\"loss\":%g}\n", st, 2.5-float64(st)/50)
		if st == 50 {
			restarted.WriteString("{\"step\":50,\"loss\":NaN}\n{\"event\":\"restart\"}\n{\"step\":40,\"loss\":1.7}\n")
		}
		// The restarted run does not redo the same arithmetic.
		drift := 0.0
		if st >= 40 {
			drift = 0.004
		}
		fmt.Fprintf(&restarted, "{\"step\":%d,\"loss\":%g}\n", st, 2.5-float64(st)/50+drift)
	}
	cases["nan-restart"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{[]*metrics.Series{jsonlSeries(t, "us", ref.String()), jsonlSeries(t, "eu", restarted.String())}, DefaultTolerance, ChartOptions{}}
	// A metric that crosses 0 (a reward, a log-likelihood) asked for on a
	// log axis: what is ≤ 0 cannot be drawn there, and the chart says so.
	signed := func(label string, off float64) *metrics.Series {
		s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "reward"}
		for st := int64(0); st <= 100; st += 10 {
			s.Points = append(s.Points, metrics.Point{Step: st, Value: float64(st)/10 - 2 + off})
		}
		return s
	}
	cases["log-y-nonpositive"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{[]*metrics.Series{signed("us", 0), signed("eu", 0.01)}, Tolerance{Abs: 0.1, HasAbs: true}, ChartOptions{LogY: true}}
	cases["log-y-negative"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{[]*metrics.Series{signed("us", -20)}, DefaultTolerance, ChartOptions{LogY: true}}
	cases["no-finite"] = struct {
		series []*metrics.Series
		tol    Tolerance
		opt    ChartOptions
	}{[]*metrics.Series{jsonlSeries(t, "us", "{\"step\":1,\"loss\":NaN}\n{\"step\":2,\"loss\":Infinity}\n")}, DefaultTolerance, ChartOptions{}}
	return cases
}

// TestChartGolden: the text of each chart (ticks, axis labels, legend
// names, notes) against testdata/chart-NAME.txt; go test -update
// rewrites them.
func TestChartGolden(t *testing.T) {
	t.Parallel()
	for name, tc := range chartCases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := Build(tc.series, tc.tol)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := tc.opt.SVG(&b, r); err != nil {
				t.Fatal(err)
			}
			if m := nanAttr.Find(b.Bytes()); m != nil {
				t.Errorf("NaN coordinate in the SVG: %s", m)
			}
			golden(t, "chart-"+name+".txt", []byte(strings.Join(svgTexts(t, b.Bytes()), "\n")+"\n"))
		})
	}
}

// TestChartMarks checks what the goldens show, one point of issue #36 at
// a time, so a golden rewritten with -update cannot quietly lose one.
func TestChartMarks(t *testing.T) {
	t.Parallel()
	cases := chartCases(t)
	texts := func(name string) []string {
		tc := cases[name]
		r, err := Build(tc.series, tc.tol)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := tc.opt.SVG(&b, r); err != nil {
			t.Fatal(err)
		}
		return svgTexts(t, b.Bytes())
	}
	for _, tc := range []struct {
		chart string
		want  []string
		not   []string
	}{
		// y from 0 for a loss, nice ticks, labelled axes, named legend.
		{"consistent", []string{"loss by step — consistent", "0", "0.5", "1", "1.5", "2", "2.5", "3", "step", "loss", "runs (first = reference)", "us", "eu", "tolerance of us"}, []string{"-0.0327"}},
		{"identical", []string{"curves identical (max |Δ| 0): us-west-2 vs eu-central-1; eu-central-1 dashed", "0", "500", "3000"}, nil},
		{"auto-log", []string{"loss (log scale)", "log scale: the values span 4.35 decades", "0.001", "0.01", "0.1", "1", "10"}, nil},
		{"log-y", []string{"loss (log scale)", "0.5", "1", "2"}, []string{"log scale: the values span"}},
		{"diverged", []string{"diverged: step 60", "first divergence", "first divergence at step 60: us vs ap|south, eu vs ap|south (tolerance |Δ| ≤ 0.1)", "ap|south: NaN or Inf at step 80 (× on the top edge)", "NaN or Inf", "tolerance of us"}, nil},
		{"nan-restart", []string{"eu: restarted at step 40 (after a NaN or Inf at 50) (▲)", "restart"}, nil},
		{"log-y-nonpositive", []string{"reward (log scale)", "5 value(s) ≤ 0 not drawn on the log scale"}, nil},
		{"log-y-negative", []string{"reward", "-20", "-12", "log scale asked for, but no value is above 0: drawn on a linear scale"}, []string{"reward (log scale)"}},
		{"no-finite", []string{"no finite loss values to draw: 2 point(s), each NaN or infinite"}, []string{"step"}},
	} {
		got := texts(tc.chart)
		for _, w := range tc.want {
			if !contains(got, w) {
				t.Errorf("%s chart lacks %q; texts:\n%s", tc.chart, w, strings.Join(got, "\n"))
			}
		}
		for _, w := range tc.not {
			if contains(got, w) {
				t.Errorf("%s chart shows %q", tc.chart, w)
			}
		}
	}
}

// TestChartBandInsideAxis: the y axis reaches the top of the reference
// run's tolerance band. A loss starting at exactly 1 (a round number)
// once ended the axis at 1, and the band above the first points was cut
// off at the top edge (the dashboard's compare page showed it).
func TestChartBandInsideAxis(t *testing.T) {
	t.Parallel()
	log := ""
	for st := 1; st <= 12; st++ {
		log += fmt.Sprintf("{\"step\":%d,\"loss\":%g}\n", st, 1/float64(st))
	}
	r, err := Build([]*metrics.Series{jsonlSeries(t, "us", log), jsonlSeries(t, "eu", log)}, Tolerance{Rel: 0.05, HasRel: true})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := (ChartOptions{}).SVG(&b, r); err != nil {
		t.Fatal(err)
	}
	// Ticks every 0.2: the axis must go on to 1.2 to hold 1.05.
	if texts := svgTexts(t, b.Bytes()); !contains(texts, "1.2") {
		t.Errorf("no y tick 1.2: the axis ends under the band's top, 1.05 (step 1's loss 1, +5%%); texts:\n%s", strings.Join(texts, "\n"))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestChartEscapesLabels: a run name is text in the SVG, never markup, and
// the SVG needs no inline styles, so the dashboard can inline the chart.
func TestChartEscapesLabels(t *testing.T) {
	t.Parallel()
	evil := `<script>alert("x")</script>&amp;`
	a, b := curve(evil, 10, 100, 0), curve("b", 10, 100, 0.5)
	r, err := Build([]*metrics.Series{a, b}, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := SVG(&out, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "<script") {
		t.Fatalf("label written as markup:\n%s", out.String())
	}
	texts := svgTexts(t, out.Bytes())
	if !contains(texts, evil) {
		t.Errorf("label not shown as text; texts:\n%s", strings.Join(texts, "\n"))
	}
	// The dashboard's Content-Security-Policy (style-src 'self') drops
	// inline style attributes: the SVG styles by attributes.
	if styleAttr.MatchString(out.String()) || !strings.Contains(out.String(), `fill="none"`) {
		t.Errorf("the SVG uses style attributes, which a page without 'unsafe-inline' ignores:\n%.600s", out.String())
	}
	if strings.HasPrefix(out.String(), "<?xml") {
		t.Error("the SVG starts with an XML prologue: it cannot be inlined in HTML as is")
	}
}

func TestNiceTicks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lo, hi  float64
		integer bool
		want    []string
	}{
		// The loss chart: bounds 0.17395..2.4 split evenly before.
		{0, 2.4, false, []string{"0", "0.5", "1", "1.5", "2", "2.5"}},
		{0, 0.0123, false, []string{"0", "0.005", "0.01", "0.015"}},
		{0.17395, 0.38061, false, []string{"0.15", "0.2", "0.25", "0.3", "0.35", "0.4"}},
		{-3, 7, false, []string{"-4", "-2", "0", "2", "4", "6", "8"}},
		{0, 2800, true, []string{"0", "500", "1000", "1500", "2000", "2500", "3000"}},
		{500, 550, true, []string{"500", "510", "520", "530", "540", "550"}},
		{5, 5, true, []string{"4", "5", "6"}},
		{0, 3e10, false, []string{"0", "5e+09", "1e+10", "1.5e+10", "2e+10", "2.5e+10", "3e+10"}},
	} {
		lo, hi, step := niceRange(tc.lo, tc.hi, tc.integer)
		var got []string
		for _, tk := range (niceTicks{step: step, integer: tc.integer}).Ticks(lo, hi) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("ticks of %g..%g (-want +got):\n%s", tc.lo, tc.hi, d)
		}
	}
	var got []string
	for _, tk := range (logTicks{}).Ticks(0.001, 10) {
		if tk.Label != "" {
			got = append(got, tk.Label)
		}
	}
	if d := cmp.Diff([]string{"0.001", "0.01", "0.1", "1", "10"}, got); d != "" {
		t.Errorf("log ticks (-want +got):\n%s", d)
	}
}

func TestPNG(t *testing.T) {
	t.Parallel()
	sc := scenarios()["diverged"]
	r, err := Build(sc.series, sc.tol)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := PNG(&b, r); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 880 || got.Y < 440 || got.Y > 440+maxNotes*18 {
		t.Errorf("size %v, want 880 wide and 440 high plus the notes", got)
	}
	if c := color.RGBAModel.Convert(img.At(1, 1)).(color.RGBA); c != (color.RGBA{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("background %v, want white", c)
	}
	// Every run's colour is drawn, and text (black) is.
	count := map[color.RGBA]int{}
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			count[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	for i := range r.Curves {
		if want := runColor(i); count[want] < 20 {
			t.Errorf("run %d (%s) drawn in %d pixel(s)", i, palette[i].hex, count[want])
		}
	}
	if count[color.RGBA{0, 0, 0, 0xff}] < 200 {
		t.Errorf("%d black pixels: no text?", count[color.RGBA{0, 0, 0, 0xff}])
	}
}
