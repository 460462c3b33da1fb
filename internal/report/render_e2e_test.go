//go:build e2e

package report_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/browsertest"
)

// renderPage renders comment.md as GitHub shows a PR comment: the
// markdown to HTML (marked, GFM), then each ```mermaid block replaced by
// the diagram mermaid draws from its text, in the page.
const renderPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>PR comment</title>
<style>
body { margin: 0; background: #fff; color: #1f2328; font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
#comment { max-width: 880px; margin: 16px; padding: 16px; border: 1px solid #d1d9e0; border-radius: 6px; }
table { border-collapse: collapse; display: block; overflow: auto; }
th, td { border: 1px solid #d1d9e0; padding: 6px 13px; }
tr:nth-child(2n) { background: #f6f8fa; }
code { background: #eff1f3; padding: .2em .4em; border-radius: 6px; font-size: 85%; }
div.mermaid { text-align: center; }
</style>
<script src="marked.umd.js"></script>
<script src="mermaid.min.js"></script>
</head><body><div id="comment"></div>
<script>
mermaid.initialize({ startOnLoad: false });
(async () => {
  try {
    const md = await (await fetch("comment.md")).text();
    document.getElementById("comment").innerHTML = marked.parse(md, { gfm: true });
    const blocks = [...document.querySelectorAll("pre > code.language-mermaid")];
    for (const [i, code] of blocks.entries()) {
      const { svg } = await mermaid.render("mermaid-" + i, code.textContent);
      const div = document.createElement("div");
      div.className = "mermaid";
      div.innerHTML = svg;
      code.parentElement.replaceWith(div);
    }
    document.body.dataset.rendered = String(blocks.length);
  } catch (e) {
    document.body.dataset.error = String((e && e.message) || e);
  }
})();
</script></body></html>`

// measure reads the rendered chart back from the page: the axes' tick
// labels with their positions, each line's colour and path, the chart's
// title, the runs table's first column and the "Lines:" line under the
// chart, all as the browser shows them.
const measure = `(() => {
  const svg = document.querySelector("div.mermaid svg");
  if (!svg) return JSON.stringify({ error: "no rendered diagram in the page" });
  const at = e => (/translate\(\s*([-\d.e]+)[ ,]+([-\d.e]+)\s*\)/.exec(e.getAttribute("transform")) || []).slice(1).map(Number);
  const labels = axis => [...svg.querySelectorAll("g." + axis + " g.label text")].map(e => {
    const r = e.getBoundingClientRect();
    return { text: e.textContent, at: at(e), box: [r.left, r.right] };
  });
  const runs = [...document.querySelectorAll("h4")].find(h => h.textContent === "Runs");
  let table = runs && runs.nextElementSibling;
  return JSON.stringify({
    title: (svg.querySelector("g.chart-title text") || {}).textContent || "",
    y: labels("left-axis"),
    x: labels("bottom-axis"),
    lines: [...svg.querySelectorAll("g.plot path")].map(p => ({ stroke: p.getAttribute("stroke"), d: p.getAttribute("d") })),
    runs: table && table.tagName === "TABLE" ? [...table.querySelectorAll("tbody tr")].map(r => r.cells[0].textContent.trim()) : [],
    legend: [...document.querySelectorAll("#comment p")].map(p => p.textContent).find(s => s.startsWith("Lines:")) || "",
  });
})()`

type rendered struct {
	Error string
	Title string
	Y, X  []struct {
		Text string
		At   []float64
		Box  []float64 // left and right on the page
	}
	Lines  []struct{ Stroke, D string }
	Runs   []string
	Legend string
}

// legendDots are the colours the markdown's "Lines:" dots name; each
// must be the colour the line it names is drawn in.
var legendDots = map[string]string{"🔵": "#1f77b4", "🟠": "#ff7f0e", "🟢": "#2ca02c", "🔴": "#d62728"}

// TestCompareRenderedInChromium renders what `gpupass compare` writes as
// users see it, in headless Chromium: the PR comment's markdown with its
// Mermaid chart (the mermaid version GitHub renders with), the --svg
// chart, and the --png chart. The chart as drawn must start its y axis at
// 0 with its top tick above every value, draw every point at the value
// the run logged at that step (the first one included: not a mean of the
// steps around it), span the steps the runs share, and name its lines as
// the runs table does, in the colours the legend says. The screenshots
// are what docs/img shows (`make screenshots` retakes them).
func TestCompareRenderedInChromium(t *testing.T) {
	chrome := testutil.Tool(t, "chromium")
	mermaidJS := filepath.Join(testutil.ToolsDir(), "node_modules", "mermaid", "dist", "mermaid.min.js")
	markedJS := filepath.Join(testutil.ToolsDir(), "node_modules", "marked", "lib", "marked.umd.js")
	for _, f := range []string{mermaidJS, markedJS} {
		if _, err := os.Stat(f); err != nil {
			testutil.Missing(t, "%s (scripts/setup.d/60-mermaid.sh installs it)", f)
		}
	}
	shots := testutil.Screenshots(t, "report", map[string]string{
		"pr-comment": "pr-comment-mermaid.png", "chart-svg": "compare-chart-svg.png", "chart-png": "compare-chart.png",
	})
	gpupass := testutil.BuildBinary(t, "./cmd/gpupass")

	// Two runs logging every step, steep at first, so that a chart of
	// means of every few steps would draw the first point well below the
	// first value logged, and far from 0 (as a fine-tune's loss is), so
	// that an axis from the lowest value would not start at 0.
	const last = 240
	logged := map[string]map[int64]float64{"us-west-2": {}, "eu-central-1": {}}
	curves := map[string]func(s float64) float64{
		"us-west-2":    func(s float64) float64 { return 1.6 + 1.5*math.Exp(-s/15) + 0.02*math.Sin(s/3) },
		"eu-central-1": func(s float64) float64 { return 1.7 + 1.3*math.Exp(-s/25) + 0.02*math.Cos(s/4) },
	}
	dir := t.TempDir()
	args := []string{"compare"}
	for _, label := range []string{"us-west-2", "eu-central-1"} {
		var b strings.Builder
		for s := int64(1); s <= last; s++ {
			v := curves[label](float64(s))
			logged[label][s] = v
			fmt.Fprintf(&b, `{"step":%d,"loss":%s}`+"\n", s, strconv.FormatFloat(v, 'g', -1, 64))
		}
		// Relative to the command's directory, as a CI job names them.
		f := filepath.Join(label, "metrics.jsonl")
		if err := os.MkdirAll(filepath.Join(dir, label), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--label", label+"="+f)
	}
	md, svg, png := filepath.Join(dir, "comment.md"), filepath.Join(dir, "chart.svg"), filepath.Join(dir, "chart.png")
	cmd := exec.Command(gpupass, append(args, "--markdown", md, "--svg", svg, "--png", png)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=")
	if out, errOut, code := testutil.Run(t, cmd); code != 0 {
		t.Fatalf("gpupass %s: exit %d\n%s\n%s", strings.Join(cmd.Args[1:], " "), code, out, errOut)
	}

	mux := http.NewServeMux()
	serve := func(path, file, typ string) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", typ)
			http.ServeFile(w, r, file)
		})
	}
	serve("/mermaid.min.js", mermaidJS, "text/javascript")
	serve("/marked.umd.js", markedJS, "text/javascript")
	serve("/comment.md", md, "text/markdown; charset=utf-8")
	serve("/chart.svg", svg, "image/svg+xml")
	mux.HandleFunc("/comment.html", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(renderPage))
	})
	mux.HandleFunc("/svg.html", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><body style="margin:0;background:#fff"><img id="chart" src="chart.svg"></body>`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	br := browsertest.Start(t, ctx, chrome, 960, 800, shots)
	bctx := br.Ctx
	eval := func(expr string) string { t.Helper(); return br.Eval(t, expr) }
	shot := func(name string) { t.Helper(); br.Shot(t, name) }

	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/comment.html")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`!!(document.body.dataset.rendered || document.body.dataset.error)`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the comment did not render: %v", err)
	}
	if e := eval(`document.body.dataset.error || ""`); e != "" {
		t.Fatalf("mermaid cannot render the comment's chart: %s\n%s", e, readFile(t, md))
	}
	if n := eval(`document.body.dataset.rendered`); n != "1" {
		t.Fatalf("the comment has %s mermaid blocks, want 1:\n%s", n, readFile(t, md))
	}
	shot("pr-comment")
	var got rendered
	if err := json.Unmarshal([]byte(eval(measure)), &got); err != nil || got.Error != "" {
		t.Fatalf("reading the rendered chart: %v %s", err, got.Error)
	}
	checkChart(t, &got, logged, last)
	if t.Failed() {
		t.Logf("the comment's markdown:\n%s", readFile(t, md))
	}

	// The --svg chart as a browser shows it, and the --png as drawn.
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/svg.html")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("chart").complete`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatal(err)
	}
	if w := eval(`String(document.getElementById("chart").naturalWidth)`); w == "0" {
		t.Fatalf("Chromium cannot show the --svg chart:\n%.2000s", readFile(t, svg))
	}
	shot("chart-svg")
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	shots.Save(t, "chart-png", b)
}

// checkChart checks the Mermaid chart as Chromium drew it against the
// values the runs logged.
func checkChart(t *testing.T, got *rendered, logged map[string]map[int64]float64, last int64) {
	if !strings.Contains(got.Title, "loss") {
		t.Errorf("chart title %q, want the metric's name", got.Title)
	}

	// The y axis: from 0 at the bottom, its top tick over every value.
	if len(got.Y) < 2 {
		t.Fatalf("the y axis has %d tick labels", len(got.Y))
	}
	bottom, top := got.Y[0], got.Y[0]
	for _, l := range got.Y {
		if len(l.At) != 2 {
			t.Fatalf("y tick %q has no position", l.Text)
		}
		if l.At[1] > bottom.At[1] {
			bottom = l
		}
		if l.At[1] < top.At[1] {
			top = l
		}
	}
	y0, err0 := strconv.ParseFloat(bottom.Text, 64)
	y1, err1 := strconv.ParseFloat(top.Text, 64)
	if err0 != nil || err1 != nil || y1 <= y0 {
		t.Fatalf("y ticks %q (bottom) and %q (top) are not increasing numbers", bottom.Text, top.Text)
	}
	if y0 != 0 {
		t.Errorf("the y axis starts at %s, want 0 (a loss is drawn against zero)", bottom.Text)
	}
	value := func(py float64) float64 { return y0 + (py-bottom.At[1])*(y1-y0)/(top.At[1]-bottom.At[1]) }
	// Half a tick's pixels is far finer than a mean of a few steps moves
	// the steep first points, and coarser than rounding to pixels.
	tol := (y1 - y0) / (bottom.At[1] - top.At[1]) * 1.5

	// The x axis: numeric over the steps the runs share, its labels
	// apart (at 50 labels, one per point, they ran into one another).
	if len(got.X) < 2 {
		t.Fatalf("the x axis has %d tick labels", len(got.X))
	}
	var xs []string
	for i, l := range got.X {
		xs = append(xs, l.Text)
		if len(l.Box) != 2 || len(l.At) != 2 {
			t.Fatalf("x tick %q has no position", l.Text)
		}
		if i > 0 && l.Box[0] < got.X[i-1].Box[1] {
			t.Errorf("x axis labels %q and %q overlap (%.0f..%.0f, %.0f..%.0f px)", got.X[i-1].Text, l.Text, got.X[i-1].Box[0], got.X[i-1].Box[1], l.Box[0], l.Box[1])
		}
	}
	a, b := got.X[0], got.X[len(got.X)-1]
	s0, err0 := strconv.ParseFloat(a.Text, 64)
	s1, err1 := strconv.ParseFloat(b.Text, 64)
	if err0 != nil || err1 != nil || s1 <= s0 || b.At[0] <= a.At[0] {
		t.Fatalf("x axis labels %v are not increasing steps", xs)
	}
	stepAt := func(px float64) float64 { return s0 + (px-a.At[0])*(s1-s0)/(b.At[0]-a.At[0]) }
	pxPerStep := (b.At[0] - a.At[0]) / (s1 - s0)

	// Names: the legend line names the runs as the table does, in the	// Names: the legend line names the runs as the table does, in the
	// table's order, each with the colour its line is drawn in.
	wantNames := []string{"us-west-2", "eu-central-1"}
	if strings.Join(got.Runs, ",") != strings.Join(wantNames, ",") {
		t.Errorf("runs table names %q, want %q", got.Runs, wantNames)
	}
	legend := regexp.MustCompile(`(\p{So}) (\S+?)(?: ·|\.)`).FindAllStringSubmatch(strings.TrimPrefix(got.Legend, "Lines:"), -1)
	if len(legend) != len(got.Runs) || len(got.Lines) != len(got.Runs) {
		t.Fatalf("legend %q names %d lines, the chart draws %d, the runs table has %d", got.Legend, len(legend), len(got.Lines), len(got.Runs))
	}
	for i, m := range legend {
		if m[2] != got.Runs[i] {
			t.Errorf("legend line %d is named %q, the runs table's row %d %q", i+1, m[2], i+1, got.Runs[i])
		}
		if c := legendDots[m[1]]; !strings.EqualFold(c, got.Lines[i].Stroke) {
			t.Errorf("legend says %s %s (%s), the line is drawn in %s", m[1], m[2], c, got.Lines[i].Stroke)
		}
	}

	// Every point at the value logged at the step where it is drawn
	// (within half a step, as the points are spread evenly, and a
	// pixel), the first at the first step, the last at the last.
	maxLogged := math.Inf(-1)
	var first, final float64
	npts := 0
	for i, l := range got.Lines {
		name := got.Runs[i]
		pts := regexp.MustCompile(`[ML]\s*([-\d.e]+)[ ,]+([-\d.e]+)`).FindAllStringSubmatch(l.D, -1)
		if len(pts) < 2 {
			t.Errorf("%s: %d points drawn", name, len(pts))
			continue
		}
		npts = len(pts)
		bad := 0
		for j, p := range pts {
			px, _ := strconv.ParseFloat(p[1], 64)
			py, _ := strconv.ParseFloat(p[2], 64)
			at, v := stepAt(px), value(py)
			if j == 0 {
				first = at
			}
			final = at
			match, near, slack := false, math.NaN(), 0.5+1/pxPerStep
			for st := int64(math.Ceil(at - slack)); float64(st) <= at+slack; st++ {
				if want, ok := logged[name][st]; ok {
					maxLogged = max(maxLogged, want)
					match = match || math.Abs(v-want) <= tol
					near = want
				}
			}
			if !match && bad < 3 {
				bad++
				t.Errorf("%s: point %d drawn at step %.1f, value %.4g; logged there %.4g (|Δ| > %.2g)", name, j, at, v, near, tol)
			}
			if py < top.At[1]-0.5 || py > bottom.At[1]+0.5 {
				t.Errorf("%s at step %.1f: drawn at y=%g, outside the axis %s..%s (y=%g..%g)", name, at, py, bottom.Text, top.Text, bottom.At[1], top.At[1])
			}
		}
	}
	if math.Abs(first-1) > 1/pxPerStep || math.Abs(final-float64(last)) > 1/pxPerStep {
		t.Errorf("the lines are drawn from step %.1f to %.1f, want 1 to %d", first, final, last)
	}
	var strokes []string
	for _, l := range got.Lines {
		strokes = append(strokes, l.Stroke)
	}
	t.Logf("rendered: y axis %s..%s, x axis labels %v, lines from step %.1f to %.1f (%d points a line), lines %q in %v", bottom.Text, top.Text, xs, first, final, npts, got.Runs, strokes)
	if y1 < maxLogged {
		t.Errorf("the y axis tops out at %s, below the highest value drawn, %.5g as logged", top.Text, maxLogged)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
