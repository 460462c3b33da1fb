//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// upCompareJSON is the part of `compare -o json` the e2e test checks.
type upCompareJSON struct {
	Metric    string `json:"metric"`
	Verdict   string `json:"verdict"`
	Simulated bool   `json:"simulated"`
	Runs      []struct {
		Label           string   `json:"label"`
		Source          string   `json:"source"`
		Format          string   `json:"format"`
		Points          int      `json:"points"`
		FirstStep       int64    `json:"first_step"`
		LastStep        int64    `json:"last_step"`
		FinalLoss       float64  `json:"final_loss"`
		MinLoss         float64  `json:"min_loss"`
		MinStep         int64    `json:"min_step"`
		WallSeconds     *float64 `json:"wall_seconds"`
		StepsPerSecond  *float64 `json:"steps_per_second"`
		TimeToFirstStep *float64 `json:"time_to_first_step_seconds"`
		CostUSD         *float64 `json:"cost_usd"`
		PricePerHour    float64  `json:"price_per_hour"`
		Restarts        int      `json:"restarts"`
		NonFinite       int      `json:"non_finite"`
		Simulated       bool     `json:"simulated"`
		Notes           []string `json:"notes"`
	} `json:"runs"`
	Pairs []struct {
		A               string  `json:"a"`
		B               string  `json:"b"`
		CommonSteps     int     `json:"common_steps"`
		MaxAbsDelta     float64 `json:"max_abs_delta"`
		MaxAbsDeltaStep int64   `json:"max_abs_delta_step"`
		RelFinalDiff    float64 `json:"rel_final_diff"`
		FirstDivergence *int64  `json:"first_divergence_step"`
		Verdict         string  `json:"verdict"`
	} `json:"pairs"`
}

type junitDoc struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Suites   []struct {
		Cases []struct {
			Name      string    `xml:"name,attr"`
			Classname string    `xml:"classname,attr"`
			Failure   *struct{} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// apiSeries is a run's loss series as the broker's metrics API returns it.
type apiSeries struct {
	run   *gpupassv1.Run
	steps []int64
	loss  []float64
	times []int64
}

// TestUpCompareAllocations is issue #5's end-to-end path: `gpupass up`,
// the PyTorch example trained in two regions (with a NaN restart from a
// checkpoint in each, so the run record carries a restart), then `gpupass
// compare ALLOC ALLOC` with no broker flags. Every figure of the output is
// checked against the series and run record the broker API returns; a run
// with another learning rate must fail --fail-on-divergence with exit 1;
// an unfinished, a cancelled and an unknown run get clear answers.
func TestUpCompareAllocations(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2", "eu-central-1"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// gp runs gpupass as a user would after `up`: no broker flags, outside
	// CI (nothing to post) unless the test sets CI variables.
	gp := func(extraEnv []string, args ...string) (string, string, int) {
		t.Helper()
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(append(cmd.Env, "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=", "GPUPASS_BROKER_URL=", "GPUPASS_BROKER_TOKEN="), extraEnv...)
		return testutil.Run(t, cmd)
	}
	train := func(name string, regions []string, follow bool, script ...string) {
		t.Helper()
		args := []string{"train", "--spec", "examples/train/gpupass.yaml", "--workdir", "examples/train", "--name", name}
		for _, r := range regions {
			args = append(args, "--region", r)
		}
		if follow {
			args = append(args, "--follow")
		}
		out, errOut, code := gp(nil, append(append(args, "--", py, "train.py"), script...)...)
		if code != 0 {
			t.Fatalf("train %s: exit %d\n%s\n%s", name, code, upstack.Tail(out, 3000), errOut)
		}
	}
	byName := func(name string) *gpupassv1.Run {
		t.Helper()
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Runs {
			if r.Name == name {
				return r
			}
		}
		t.Fatalf("no run named %s", name)
		return nil
	}
	series := func(id string) apiSeries {
		t.Helper()
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		s := apiSeries{run: mr.Msg.Run}
		for _, p := range mr.Msg.Points {
			if v, ok := p.Values["loss"]; ok {
				s.steps, s.loss, s.times = append(s.steps, p.Step), append(s.loss, v), append(s.times, p.TimeUnixNano)
			}
		}
		return s
	}

	// Same seed in both regions, a NaN at step 15 in each: the agents
	// restart from the step-10 checkpoint. Then the eu region again with
	// another learning rate.
	const steps = 40
	train("cmp", []string{"us-west-2", "eu-central-1"}, true, "--steps", "40", "--checkpoint-every", "10", "--nan-at-step", "15")
	train("cmp-lr", []string{"eu-central-1"}, true, "--steps", "40", "--lr", "0.2")
	us, eu, lr := byName("cmp-us-west-2"), byName("cmp-eu-central-1"), byName("cmp-lr-eu-central-1")
	sUS, sEU, sLR := series(us.Id), series(eu.Id), series(lr.Id)
	for _, s := range []apiSeries{sUS, sEU, sLR} {
		if s.run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || len(s.steps) != steps || s.steps[0] != 1 || s.steps[steps-1] != steps {
			t.Fatalf("%s (%s): %s with %d points %v, want succeeded with steps 1..%d", s.run.Id, s.run.Region, s.run.State, len(s.steps), s.steps, steps)
		}
	}
	if sUS.run.Restarts != 1 || sEU.run.Restarts != 1 {
		t.Fatalf("restarts on the run records: us %d eu %d, want 1 each (the NaN at step 15)", sUS.run.Restarts, sEU.run.Restarts)
	}

	// compare the two regions: every output, checked against the API.
	svg, junit, jsonFile, md, pngFile, summary := filepath.Join(dir, "c.svg"), filepath.Join(dir, "c.xml"), filepath.Join(dir, "c.json"),
		filepath.Join(dir, "c.md"), filepath.Join(dir, "c.png"), filepath.Join(dir, "summary.md")
	out, errOut, code := gp([]string{"GITHUB_STEP_SUMMARY=" + summary}, "compare", us.Id, eu.Id, "-o", "json", "--tolerance", "abs=0.001",
		"--fail-on-divergence", "--svg", svg, "--junit", junit, "--json", jsonFile, "--markdown", md, "--png", pngFile)
	if code != 0 {
		t.Fatalf("compare %s %s: exit %d\n%s\n%s", us.Id, eu.Id, code, out, errOut)
	}
	var got upCompareJSON
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("stdout is not one JSON document (%v):\n%s", err, out)
	}
	if got.Verdict != report.Consistent || got.Metric != "loss" || !got.Simulated || len(got.Runs) != 2 || len(got.Pairs) != 1 {
		t.Fatalf("report %+v, want a consistent, simulated comparison of 2 runs", got)
	}
	for i, s := range []apiSeries{sUS, sEU} {
		r := got.Runs[i]
		last := len(s.loss) - 1
		minV, minStep := math.Inf(1), int64(0)
		for j, v := range s.loss {
			if v < minV {
				minV, minStep = v, s.steps[j]
			}
		}
		ttf := float64(s.times[0]-s.run.StartedUnixNano) / 1e9
		wall := float64(s.times[last]-s.times[0]) / 1e9
		cost := float64(s.times[last]-s.run.StartedUnixNano) / 3.6e12 * s.run.PricePerHour
		switch {
		case r.Label != s.run.Region || r.Source != "broker:"+s.run.Id || r.Format != "gpupass-broker":
			t.Errorf("run %d: label %q source %q format %q, want the region %s and broker:%s", i, r.Label, r.Source, r.Format, s.run.Region, s.run.Id)
		case r.Points != steps || r.FirstStep != 1 || r.LastStep != steps:
			t.Errorf("%s: %d points %d..%d, want %d points 1..%d", r.Label, r.Points, r.FirstStep, r.LastStep, steps, steps)
		case r.FinalLoss != s.loss[last] || r.MinLoss != minV || r.MinStep != minStep:
			t.Errorf("%s: final %v min %v at %d; the API's series has final %v min %v at %d", r.Label, r.FinalLoss, r.MinLoss, r.MinStep, s.loss[last], minV, minStep)
		case r.Restarts != int(s.run.Restarts) || r.PricePerHour != s.run.PricePerHour || r.PricePerHour <= 0 || !r.Simulated || r.NonFinite != 0:
			t.Errorf("%s: restarts %d price %v simulated %v non-finite %d; run record: restarts %d price %v", r.Label, r.Restarts, r.PricePerHour, r.Simulated, r.NonFinite, s.run.Restarts, s.run.PricePerHour)
		case r.TimeToFirstStep == nil || math.Abs(*r.TimeToFirstStep-ttf) > 1e-9 || ttf <= 0:
			t.Errorf("%s: time to first step %s, want %v (first metric after the run's start)", r.Label, fptr(r.TimeToFirstStep), ttf)
		case r.WallSeconds == nil || math.Abs(*r.WallSeconds-wall) > 1e-9 || r.StepsPerSecond == nil || math.Abs(*r.StepsPerSecond-float64(steps-1)/wall) > 1e-9:
			t.Errorf("%s: wall %s steps/s %s, want %v and %v", r.Label, fptr(r.WallSeconds), fptr(r.StepsPerSecond), wall, float64(steps-1)/wall)
		case r.CostUSD == nil || math.Abs(*r.CostUSD-cost) > 1e-12:
			t.Errorf("%s: cost %s, want %v ($%v/h on the run record × time since start)", r.Label, fptr(r.CostUSD), cost, s.run.PricePerHour)
		}
	}
	maxD, maxStep := 0.0, int64(0)
	for j := range sUS.loss {
		if d := math.Abs(sEU.loss[j] - sUS.loss[j]); d > maxD {
			maxD, maxStep = d, sUS.steps[j]
		}
	}
	p := got.Pairs[0]
	if p.A != "us-west-2" || p.B != "eu-central-1" || p.CommonSteps != steps || p.MaxAbsDelta != maxD || (maxD > 0 && p.MaxAbsDeltaStep != maxStep) ||
		p.FirstDivergence != nil || p.Verdict != report.Consistent {
		t.Errorf("pair %+v, want us-west-2 vs eu-central-1 at %d steps, max |Δ| %v at step %d, consistent", p, steps, maxD, maxStep)
	}

	// The files: the JSON file is stdout's report, markdown is the step
	// summary too, SVG and PNG are images of both curves, JUnit has one
	// passing test case for the one pair and bound.
	if b, err := os.ReadFile(jsonFile); err != nil || strings.TrimSpace(string(b)) != strings.TrimSpace(out) {
		t.Errorf("--json file differs from stdout (%v):\n%s", err, b)
	}
	mdb, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"✅ gpupass compare: consistent", "| us-west-2 ", "| eu-central-1 ", "broker:" + us.Id, "| us-west-2 vs eu-central-1 ",
		report.Num(sUS.loss[steps-1]), "xychart-beta", "🔵 us-west-2 · 🟠 eu-central-1", "**Simulated**"} {
		if !strings.Contains(string(mdb), want) {
			t.Errorf("markdown lacks %q:\n%s", want, mdb)
		}
	}
	if b, _ := os.ReadFile(summary); string(b) != string(mdb)+"\n" {
		t.Errorf("GITHUB_STEP_SUMMARY is not the markdown report:\n%s", b)
	}
	svgb, err := os.ReadFile(svg)
	if err != nil || xml.Unmarshal(svgb, new(struct{})) != nil {
		t.Fatalf("SVG unreadable: %v", err)
	}
	// Both runs drawn in their colours (gonum/plot's paths: line and
	// legend swatch, as attributes: the dashboard's CSP drops inline
	// styles) and named in the legend.
	if blue, orange := strings.Count(string(svgb), `stroke="#1F77B4"`), strings.Count(string(svgb), `stroke="#FF7F0E"`); blue < 2 || orange < 2 || !strings.Contains(string(svgb), ">us-west-2</text>") || !strings.Contains(string(svgb), ">eu-central-1</text>") {
		t.Errorf("SVG has %d blue and %d orange strokes and these labels:\n%s", blue, orange, upstack.Tail(string(svgb), 1500))
	}
	if f, err := os.Open(pngFile); err != nil {
		t.Error(err)
	} else {
		img, err := png.Decode(f)
		f.Close()
		if err != nil || img.Bounds().Dx() < 100 {
			t.Errorf("PNG: %v", err)
		}
	}
	var ju junitDoc
	if b, err := os.ReadFile(junit); err != nil || xml.Unmarshal(b, &ju) != nil {
		t.Fatalf("JUnit unreadable: %v\n%s", err, b)
	}
	if ju.Tests != 1 || ju.Failures != 0 || len(ju.Suites) != 1 || len(ju.Suites[0].Cases) != 1 || ju.Suites[0].Cases[0].Failure != nil ||
		!strings.Contains(ju.Suites[0].Cases[0].Classname, "us-west-2_vs_eu-central-1") {
		t.Errorf("JUnit %+v, want one passing case for us-west-2 vs eu-central-1", ju)
	}

	// Another learning rate diverges: exit 1 with --fail-on-divergence,
	// at the first step where |Δ| passes the bound.
	junit2 := filepath.Join(dir, "lr.xml")
	out, errOut, code = gp(nil, "compare", us.Id, lr.Id, "-o", "json", "--tolerance", "abs=0.001", "--fail-on-divergence", "--junit", junit2)
	if code != 1 || !strings.Contains(errOut, "runs diverged (tolerance |Δ| ≤ 0.001)") {
		t.Fatalf("compare against lr 0.2: exit %d, want 1 and the divergence\n%s", code, errOut)
	}
	got = upCompareJSON{}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stdout: %v\n%s", err, out)
	}
	var firstDiv *int64
	for j := range sUS.loss {
		if math.Abs(sLR.loss[j]-sUS.loss[j]) > 0.001 {
			s := sUS.steps[j]
			firstDiv = &s
			break
		}
	}
	p = got.Pairs[0]
	if got.Verdict != report.Diverged || p.Verdict != report.Diverged || firstDiv == nil || p.FirstDivergence == nil || *p.FirstDivergence != *firstDiv ||
		p.B != "eu-central-1" || got.Runs[1].FinalLoss != sLR.loss[steps-1] {
		t.Errorf("lr pair %+v (verdict %s), want diverged first at step %v", p, got.Verdict, firstDiv)
	}
	ju = junitDoc{}
	if b, err := os.ReadFile(junit2); err != nil || xml.Unmarshal(b, &ju) != nil || ju.Failures != 1 || ju.Suites[0].Cases[0].Failure == nil {
		t.Errorf("JUnit of the diverged pair: %v %+v", err, ju)
	}
	// Text mode: the markdown on stdout; two runs of one region are told
	// apart by id.
	out, errOut, code = gp(nil, "compare", eu.Id, lr.Id, "--tolerance", "abs=0.001")
	if code != 0 || !strings.Contains(out, "❌ gpupass compare: diverged") || !strings.Contains(out, "| eu-central-1 "+eu.Id+" vs eu-central-1 "+lr.Id+" ") {
		t.Errorf("text compare of one region's runs: exit %d\n%s\n%s", code, out, errOut)
	}

	// A run still training: refused with what to do; --allow-running
	// compares the partial curve and says so; once cancelled, the report
	// says how it ended.
	train("cmp-long", []string{"us-west-2"}, false, "--steps", "100000", "--sleep", "0.2")
	long := byName("cmp-long-us-west-2")
	upstack.WaitFor(t, ctx, "the long run to log metrics", func() bool {
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: long.Id}))
		return err == nil && len(mr.Msg.Points) >= 3
	})
	_, errOut, code = gp(nil, "compare", us.Id, long.Id)
	if code != 2 || !strings.Contains(errOut, long.Id+" (us-west-2) is still running (") || !strings.Contains(errOut, "--allow-running") {
		t.Errorf("compare of a running run: exit %d, want 2 and a clear message: %s", code, errOut)
	}
	out, errOut, code = gp(nil, "compare", us.Id, long.Id, "--allow-running", "-o", "json")
	got = upCompareJSON{}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.Runs[1].Points < 3 ||
		!strings.Contains(strings.Join(got.Runs[1].Notes, " "), long.Id+" was still running when compared: its figures are partial") {
		t.Errorf("--allow-running: exit %d %v %+v\n%s", code, err, got, errOut)
	}
	if _, errOut, code := gp(nil, "cancel", long.Id); code != 0 {
		t.Fatalf("cancel: exit %d %s", code, errOut)
	}
	upstack.WaitFor(t, ctx, "the long run to be cancelled", func() bool {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: long.Id}))
		return err == nil && resp.Msg.Run.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
	})
	out, errOut, code = gp(nil, "compare", us.Id, long.Id, "-o", "json")
	got = upCompareJSON{}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || !strings.Contains(strings.Join(got.Runs[1].Notes, " "), "the run ended cancelled") {
		t.Errorf("compare of a cancelled run: exit %d %v %+v\n%s", code, err, got, errOut)
	}
	// An id the broker does not know.
	_, errOut, code = gp(nil, "compare", us.Id, "alloc-00000000")
	if code != 2 || !strings.Contains(errOut, "alloc-00000000: no such run on the broker at "+cfg.BrokerURL) || strings.Contains(errOut, cfg.Token) {
		t.Errorf("unknown id: exit %d %s", code, errOut)
	}
}

func fptr(f *float64) string {
	if f == nil {
		return "absent"
	}
	return strconv.FormatFloat(*f, 'g', -1, 64)
}
