package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpupass/gpupass/internal/metrics"
)

var update = flag.Bool("update", false, "rewrite golden files")

const t0 = int64(1772352000) * 1e9 // 2026-03-01T08:00:00Z

// curve builds a run logging every `every` steps up to last, one step a
// second, loss decaying from 2.5 with a per-run offset.
func curve(label string, every, last int64, offset float64) *metrics.Series {
	s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "loss", Format: "jsonl", Start: t0 - 30e9, PricePerHour: 3.5}
	for st := int64(0); st <= last; st += every {
		s.Points = append(s.Points, metrics.Point{Step: st, Value: 0.5 + 2*math.Exp(-float64(st)/40) + offset, Time: t0 + st*1e9})
	}
	return s
}

func scenarios() map[string]struct {
	series []*metrics.Series
	tol    Tolerance
} {
	diverging := curve("ap|south", 10, 100, 0)
	for i := range diverging.Points {
		if diverging.Points[i].Step >= 60 {
			diverging.Points[i].Value += 0.3
		}
	}
	diverging.Points[8].Value = math.NaN()
	diverging.Problems.Add("line 7", "not a JSON object")
	diverging.Restarts = 1
	diverging.Start, diverging.PricePerHour = 0, 0
	noTimes := curve("late", 10, 50, 0)
	for i := range noTimes.Points {
		noTimes.Points[i].Step += 500
		noTimes.Points[i].Time = 0
	}
	// Two identical runs of a fast step, logged for about a second: the
	// throughput needs more than three digits, the cost is under a cent,
	// the loss difference is zero everywhere.
	fast := func(label string) *metrics.Series {
		s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "loss", Format: "jsonl", Start: t0 - 1e9, PricePerHour: 3.5}
		for st := int64(0); st <= 2800; st += 100 {
			s.Points = append(s.Points, metrics.Point{Step: st, Value: 2 - float64(st)/2000, Time: t0 + st*1e9/2812})
		}
		return s
	}
	return map[string]struct {
		series []*metrics.Series
		tol    Tolerance
	}{
		"identical":  {[]*metrics.Series{fast("us-west-2"), fast("eu-central-1")}, DefaultTolerance},
		"consistent": {[]*metrics.Series{curve("us", 10, 100, 0), curve("eu", 5, 100, 0.01)}, Tolerance{Abs: 0.05, HasAbs: true, Rel: 0.02, HasRel: true}},
		"diverged":   {[]*metrics.Series{curve("us", 10, 100, 0), curve("eu", 5, 100, 0.01), diverging}, Tolerance{Abs: 0.1, HasAbs: true}},
		"no-overlap": {[]*metrics.Series{curve("us", 10, 100, 0), noTimes}, DefaultTolerance},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s (-want +got):\n%s", path, d)
	}
}

func TestRenderGolden(t *testing.T) {
	t.Parallel()
	renderers := map[string]func(*bytes.Buffer, *Report) error{
		"md":   func(b *bytes.Buffer, r *Report) error { return Markdown(b, r) },
		"json": func(b *bytes.Buffer, r *Report) error { return JSON(b, r) },
		"xml":  func(b *bytes.Buffer, r *Report) error { return JUnit(b, r) },
	}
	for name, sc := range scenarios() {
		for ext, render := range renderers {
			t.Run(name+"."+ext, func(t *testing.T) {
				t.Parallel()
				r, err := Build(sc.series, sc.tol)
				if err != nil {
					t.Fatal(err)
				}
				var b bytes.Buffer
				if err := render(&b, r); err != nil {
					t.Fatal(err)
				}
				golden(t, name+"."+ext, b.Bytes())
				switch ext {
				case "json":
					if !json.Valid(b.Bytes()) {
						t.Error("invalid JSON")
					}
				case "xml":
					if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
						t.Errorf("invalid XML: %v", err)
					}
				}
			})
		}
	}
}

func TestFigures(t *testing.T) {
	t.Parallel()
	sc := scenarios()["diverged"]
	r, err := Build(sc.series, sc.tol)
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != Diverged {
		t.Errorf("verdict %s, want diverged", r.Verdict)
	}
	us := r.Runs[0]
	wall, tp, ttf := 100.0, 1.0, 30.0
	cost := 130.0 / 3600 * 3.5
	want := Run{
		Label: "us", Source: "us.jsonl", Format: "jsonl", Metric: "loss", Points: 11, FirstStep: 0, LastStep: 100,
		FinalLoss: Float(0.5 + 2*math.Exp(-2.5)), MinLoss: Float(0.5 + 2*math.Exp(-2.5)), MinStep: 100,
		WallSeconds: &wall, StepsPerSecond: &tp, TimeToFirstStep: &ttf, CostUSD: &cost, PricePerHour: 3.5,
	}
	if d := cmp.Diff(want, us, cmpopts.EquateApprox(0, 1e-9)); d != "" {
		t.Errorf("us (-want +got):\n%s", d)
	}
	ap := r.Runs[2]
	if ap.NonFinite != 1 || ap.Restarts != 1 || ap.TimeToFirstStep != nil || ap.CostUSD != nil {
		t.Errorf("ap: non-finite %d restarts %d ttf %v cost %v", ap.NonFinite, ap.Restarts, ap.TimeToFirstStep, ap.CostUSD)
	}
	// us vs eu: eu is +0.01 everywhere; us vs ap diverges at step 60.
	ue, ua := r.Pairs[0], r.Pairs[1]
	if ue.Verdict != Consistent || ue.FirstDivergence != nil || math.Abs(float64(ue.MaxAbsDelta)-0.01) > 1e-9 || ue.CommonSteps != 11 {
		t.Errorf("us vs eu: %+v", ue)
	}
	if ua.Verdict != Diverged || ua.FirstDivergence == nil || *ua.FirstDivergence != 60 || ua.NonFiniteSteps != 1 {
		t.Errorf("us vs ap: %+v", ua)
	}
	if ua.Checks[0].Failures != 5 {
		t.Errorf("us vs ap failures %d, want 5 (steps 60..100, NaN at 80 included)", ua.Checks[0].Failures)
	}
	if got := float64(ua.MaxAbsDelta); math.Abs(got-0.3) > 1e-9 || ua.MaxAbsDeltaStep != 60 {
		t.Errorf("max |Δ| %v at %d, want 0.3 at 60", got, ua.MaxAbsDeltaStep)
	}
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		series []*metrics.Series
		want   string
	}{
		{"none", nil, "no runs to compare"},
		{"duplicate", []*metrics.Series{curve("us", 10, 20, 0), curve("us", 10, 20, 0)}, `label "us": names both us.jsonl and us.jsonl`},
		{"unlabelled", []*metrics.Series{{Source: "x.csv"}}, "label: the run from x.csv has none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Build(tc.series, DefaultTolerance)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSinglePointAndSingleRun(t *testing.T) {
	t.Parallel()
	one := &metrics.Series{Label: "solo", Source: "s", Metric: "loss", Points: []metrics.Point{{Step: 5, Value: 1}}}
	r, err := Build([]*metrics.Series{one}, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, f := range []func() error{func() error { return Markdown(&b, r) }, func() error { return SVG(&b, r) }, func() error { return JUnit(&b, r) }, func() error { return JSON(&b, r) }} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"only one run", "solo: a single point", "x-axis \"step\" [5]"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestParseTolerance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Tolerance
		wantErr string
	}{
		{"", DefaultTolerance, ""},
		{"0.05", Tolerance{Abs: 0.05, HasAbs: true}, ""},
		{"2%", Tolerance{Rel: 0.02, HasRel: true}, ""},
		{"abs=0.1, rel=0.5%", Tolerance{Abs: 0.1, HasAbs: true, Rel: 0.005, HasRel: true}, ""},
		{"rel=0.03", Tolerance{Rel: 0.03, HasRel: true}, ""},
		{"abs=5%", Tolerance{}, "abs takes a plain number"},
		{"-1", Tolerance{}, "not a non-negative number"},
		{"max=1", Tolerance{}, `unknown kind "max"`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseTolerance(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestDownsampleKeepsSpikes(t *testing.T) {
	t.Parallel()
	var p []metrics.Point
	for i := range 10000 {
		p = append(p, metrics.Point{Step: int64(i), Value: 1})
	}
	p[4321].Value = 50
	p[7000].Value = math.NaN()
	d := Downsample(p, 100)
	if len(d) > 102 {
		t.Errorf("%d points, want at most 102", len(d))
	}
	var spike, nan bool
	for _, q := range d {
		spike = spike || q.Value == 50
		nan = nan || math.IsNaN(q.Value)
	}
	if !spike || !nan || d[0].Step != 0 || d[len(d)-1].Step != 9999 {
		t.Errorf("spike %v nan %v ends %d..%d", spike, nan, d[0].Step, d[len(d)-1].Step)
	}
}

func TestChartExtremeValues(t *testing.T) {
	t.Parallel()
	a := &metrics.Series{Label: "a", Points: []metrics.Point{{Step: 0, Value: -1e308}, {Step: 10, Value: 1e308}}}
	b := &metrics.Series{Label: "b", Points: []metrics.Point{{Step: 0, Value: math.NaN()}, {Step: 10, Value: math.Inf(1)}}}
	r, err := Build([]*metrics.Series{a, b}, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := Markdown(&md, r); err != nil {
		t.Fatal(err)
	}
	_, chart, _ := strings.Cut(md.String(), "xychart-beta")
	chart, _, _ = strings.Cut(chart, "```")
	if strings.Contains(chart, "Inf") || strings.Contains(chart, "NaN") || strings.Count(chart, "line [") != 1 {
		t.Errorf("chart:\n%s", chart)
	}
	if !strings.Contains(md.String(), "chart: no finite values to draw for b") {
		t.Error("dropped run not noted")
	}
	var svg bytes.Buffer
	if err := SVG(&svg, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(svg.String(), "NaN\"") || strings.Contains(svg.String(), "NaN,") {
		t.Errorf("NaN coordinate in SVG:\n%s", svg.String())
	}
	// On a log axis only 1e308 is drawable: the axis ends at the largest
	// float64, not at +Inf (which gonum takes for 0 and then refuses).
	for _, render := range []func(io.Writer, *Report) error{ChartOptions{LogY: true}.SVG, ChartOptions{LogY: true}.PNG} {
		if err := render(io.Discard, r); err != nil {
			t.Errorf("log y: %v", err)
		}
	}
}

// TestRunTimes covers the time figures at their edges: millisecond stamps
// shared by several steps, a start stamped after the first step (clocks
// of broker and node disagree), a price with and without a start.
func TestRunTimes(t *testing.T) {
	t.Parallel()
	pts := func(times ...int64) []metrics.Point {
		var p []metrics.Point
		for i, tm := range times {
			p = append(p, metrics.Point{Step: int64(i + 1), Value: 1, Time: tm})
		}
		return p
	}
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name  string
		s     metrics.Series
		tp    *float64
		ttf   *float64
		cost  *float64
		price float64
	}{
		{"tied last stamp counts the highest step", metrics.Series{Points: pts(t0, t0+1e9, t0+2e9, t0+2e9)}, f(1.5), nil, nil, 0},
		{"start before first step", metrics.Series{Start: t0 - 4e9, PricePerHour: 3.6, Points: pts(t0, t0+1e9, t0+2e9)}, f(1), f(4), f(0.006), 3.6},
		{"start after first step: no time to first step", metrics.Series{Start: t0 + 5e8, PricePerHour: 3.6, Points: pts(t0, t0+1e9, t0+2e9)}, f(1), nil, f(0.002), 3.6},
		{"no stamps", metrics.Series{PricePerHour: 3.6, Points: pts(0, 0)}, nil, nil, nil, 3.6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.s.Label = "r"
			got := runFigures(&tc.s)
			approx := cmpopts.EquateApprox(0, 1e-12)
			if d := cmp.Diff(tc.tp, got.StepsPerSecond, approx); d != "" {
				t.Errorf("steps/s (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.ttf, got.TimeToFirstStep, approx); d != "" {
				t.Errorf("time to first step (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.cost, got.CostUSD, approx); d != "" {
				t.Errorf("cost (-want +got):\n%s", d)
			}
			if got.PricePerHour != tc.price {
				t.Errorf("price %v, want %v", got.PricePerHour, tc.price)
			}
		})
	}
}

// A run whose log is disputed keeps its figures, but no verdict it is
// part of can be consistent or diverged: its points may be forged.
func TestDisputedRunIsInconclusive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		offsetB float64
	}{{"curves agree", 0}, {"curves diverge", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b, c := curve("us", 10, 200, 0), curve("eu", 10, 200, tc.offsetB), curve("ap", 10, 200, 0)
			b.Disputed = "log disputed: 1 record(s) were sent twice with different content (first at seq 7)"
			r, err := Build([]*metrics.Series{a, b, c}, DefaultTolerance)
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != Inconclusive || r.Runs[1].Disputed != b.Disputed {
				t.Errorf("verdict %s, run eu disputed %q; want inconclusive and the note", r.Verdict, r.Runs[1].Disputed)
			}
			for _, p := range r.Pairs {
				involved := p.A == "eu" || p.B == "eu"
				if involved != (p.Verdict == Inconclusive && cmp.Equal(p.Disputed, []string{"eu"}) && p.CommonSteps > 0) {
					t.Errorf("pair %s vs %s: verdict %s, disputed %v, %d common steps", p.A, p.B, p.Verdict, p.Disputed, p.CommonSteps)
				}
			}
			var md, ju bytes.Buffer
			if err := Markdown(&md, r); err != nil {
				t.Fatal(err)
			}
			if err := JUnit(&ju, r); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(md.String(), "⚠️ log disputed: eu") || !strings.Contains(ju.String(), `type="LogDisputed"`) {
				t.Errorf("renderings do not flag the disputed log:\n%s\n%s", md.String(), ju.String())
			}
		})
	}
}

// TestSlurmRunLine: a run trained on Slurm names its cluster, job, node
// and partition on its line of the report and in the JSON.
func TestSlurmRunLine(t *testing.T) {
	t.Parallel()
	a, b := curve("us", 10, 100, 0), curve("hpc", 10, 100, 0)
	b.Slurm = &metrics.Slurm{Cluster: "hpc1", JobID: "4021", Node: "gpu-n17", Partition: "a100"}
	r, err := Build([]*metrics.Series{a, b}, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var md, js bytes.Buffer
	if err := Markdown(&md, r); err != nil {
		t.Fatal(err)
	}
	if err := JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(md.String(), "\n") {
		if strings.HasPrefix(l, "| hpc |") {
			line = l
		}
	}
	if !strings.Contains(line, "slurm job 4021 on gpu-n17 (cluster hpc1, partition a100)") {
		t.Errorf("the hpc run's line %q does not name its slurm job:\n%s", line, md.String())
	}
	if !strings.Contains(js.String(), `"slurm": {`) || !strings.Contains(js.String(), `"job_id": "4021"`) {
		t.Errorf("JSON lacks the slurm placement:\n%s", js.String())
	}
}
