package compare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
)

func writeLines(t *testing.T, dir, name string, lines ...string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func tolerance(t *testing.T, s string) report.Tolerance {
	t.Helper()
	tol, err := report.ParseTolerance(s)
	if err != nil {
		t.Fatal(err)
	}
	return tol
}

func refs(paths ...string) []Input {
	var in []Input
	for _, p := range paths {
		in = append(in, Input{Ref: p})
	}
	return in
}

// TestEdgeInputs runs inputs that cannot be compared fully: no common
// steps, a single point, NaN and Inf values. Each must give a report that
// says so, and Divergence decides the exit code.
func TestEdgeInputs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	early := writeLines(t, dir, "early.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":1.5}`, `{"step":20,"loss":1}`)
	late := writeLines(t, dir, "late.jsonl", `{"step":100,"loss":0.9}`, `{"step":110,"loss":0.8}`)
	single := writeLines(t, dir, "single.jsonl", `{"step":10,"loss":1.5}`)
	blowup := writeLines(t, dir, "blowup.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":NaN}`, `{"step":20,"loss":Infinity}`)
	tests := []struct {
		name      string
		inputs    []string
		wantCode  int // of Divergence
		wantErr   string
		wantJSON  []string
		wantLines []string
	}{
		{"no overlap", []string{early, late}, exitcode.Findings, "runs cannot be compared: early (steps 0..20) and late (steps 100..110) have no steps in common",
			[]string{`"verdict": "inconclusive"`, `"error": "early (steps 0..20) and late (steps 100..110) have no steps in common"`},
			[]string{"⚠️ gpupass compare: inconclusive", "no step range common to all runs"}},
		{"single point", []string{early, single}, 0, "",
			[]string{`"verdict": "consistent"`, `"common_steps": 1`},
			[]string{"single: a single point", "| early vs single | 1 "}},
		{"NaN and Inf shown", []string{early, blowup}, exitcode.Findings, "runs diverged",
			[]string{`"final_loss": "+Inf"`, `"non_finite": 2`, `"max_abs_delta": 0`},
			[]string{"| +Inf       | 2 (step 0) ", "blowup: 2 NaN/Inf value(s) in the run (kept; they fail every tolerance check)", "2 common step(s) with NaN/Inf"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			jsonPath := filepath.Join(t.TempDir(), "r.json")
			res, err := Run(context.Background(), Options{Runs: refs(tc.inputs...), Tolerance: tolerance(t, "abs=0.1"), Files: Files{JSON: jsonPath}})
			if err != nil {
				t.Fatal(err)
			}
			err = res.Divergence()
			if code := exitcode.Of(err); (err == nil && tc.wantCode != 0) || (err != nil && code != tc.wantCode) || (tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("divergence %v (exit %d), want exit %d and %q", err, code, tc.wantCode, tc.wantErr)
			}
			js, _ := os.ReadFile(jsonPath)
			for _, want := range tc.wantJSON {
				if !strings.Contains(string(js), want) {
					t.Errorf("JSON lacks %s:\n%s", want, js)
				}
			}
			var md bytes.Buffer
			if err := res.WriteText(&md); err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.wantLines {
				if !strings.Contains(md.String(), want) {
					t.Errorf("markdown lacks %q:\n%s", want, md.String())
				}
			}
		})
	}
}

// fakeSource stands in for the broker's metrics API; a run listed in
// running has not ended.
type fakeSource map[string]*metrics.Series

func (f fakeSource) Metrics(_ context.Context, id, _ string) (*metrics.Series, error) {
	shared, ok := f[id]
	if !ok {
		return nil, fmt.Errorf("allocation %s not found", id)
	}
	// A series of its own per call, as the broker's source gives: the
	// use case normalizes what it gets, and subtests run in parallel.
	c := *shared
	c.Points, c.Notes = slices.Clone(shared.Points), slices.Clone(shared.Notes)
	s := &c
	if strings.HasSuffix(id, "-running") {
		return nil, &RunNotDoneError{ID: id, Region: s.Label, State: "running", Series: s}
	}
	return s, nil
}

// TestInputs checks how runs are named, priced and read, and that bad
// options are *fielderr.Error naming the Options field (the command layer
// renames it to the flag or input the user gave).
func TestInputs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us := writeLines(t, dir, "us.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":1.5}`)
	eu := writeLines(t, dir, "eu.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":1.5}`)
	curve := func(region string) *metrics.Series {
		return &metrics.Series{Label: region, Source: "broker", Metric: "loss", Points: []metrics.Point{{Step: 10, Value: 1.5}, {Step: 0, Value: 2}}}
	}
	src := fakeSource{"alloc-eu1": curve("eu-west"), "alloc-eu2": curve("eu-west"), "alloc-ap-running": curve("ap-south")}
	tests := []struct {
		name       string
		o          Options
		wantLabels []string
		wantField  string // of an *fielderr.Error
		wantErr    string
	}{
		{"files named by stem", Options{Runs: refs(us, eu)}, []string{"us", "eu"}, "", ""},
		{"a ref twice is one run", Options{Runs: []Input{{Ref: us}, {Name: "usa", Ref: us}, {Ref: eu}}}, []string{"usa", "eu"}, "", ""},
		{"allocations by region, clashes by id", Options{Runs: refs(us, "alloc-eu1", "alloc-eu2"), Source: src}, []string{"us", "eu-west alloc-eu1", "eu-west alloc-eu2"}, "", ""},
		{"running allowed", Options{Runs: refs(us, "alloc-ap-running"), Source: src, AllowRunning: true}, []string{"us", "ap-south"}, "", ""},
		{"running refused", Options{Runs: refs(us, "alloc-ap-running"), Source: src}, nil, "", "or set AllowRunning to compare the partial curve"},
		{"one run under two names", Options{Runs: []Input{{Name: "a", Ref: "alloc-eu1"}, {Name: "b", Ref: "alloc-eu1"}, {Ref: us}}, Source: src}, nil, "Runs", `Runs "b=alloc-eu1": the names "a" and "b" are given to the same run alloc-eu1`},
		{"name twice", Options{Runs: []Input{{Name: "a", Ref: us}, {Name: "a", Ref: eu}}}, nil, "Runs", `Runs "a=` + eu + `": the name "a" is given twice`},
		{"price of no run", Options{Runs: refs(us, eu), Prices: []Price{{Name: "zz", PerHour: 1}}}, nil, "Prices", `Prices "zz": no run named "zz"`},
		{"bad post mode", Options{Runs: refs(us, eu), Post: "slack"}, nil, "Post", `Post "slack": must be auto, github, gitlab or none`},
		{"nothing", Options{}, nil, "", "nothing to compare"},
		{"allocation without a source", Options{Runs: refs(us, "alloc-7f3a")}, nil, "", "alloc-7f3a: no such file, and allocation ids need the broker"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.o.Tolerance = tolerance(t, "5%")
			res, err := Run(context.Background(), tc.o)
			if tc.wantErr != "" {
				var ie *fielderr.Error
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || (tc.wantField != "") != errors.As(err, &ie) || (ie != nil && ie.Field != tc.wantField) {
					t.Fatalf("err %v, want %q (input error field %q)", err, tc.wantErr, tc.wantField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range res.Report.Runs {
				got = append(got, r.Label)
			}
			if strings.Join(got, ",") != strings.Join(tc.wantLabels, ",") {
				t.Errorf("labels %q, want %q", got, tc.wantLabels)
			}
		})
	}
}

// TestNameAllowRunning checks that every run not done in a joined error
// names the option the user gives.
func TestNameAllowRunning(t *testing.T) {
	t.Parallel()
	pts := &metrics.Series{Points: []metrics.Point{{Step: 1}}}
	err := errors.Join(&RunNotDoneError{ID: "a", Series: pts}, &RunNotDoneError{ID: "b", Series: pts})
	NameAllowRunning(err, "pass --allow-running")
	if n := strings.Count(err.Error(), "or pass --allow-running to compare"); n != 2 {
		t.Errorf("%d of 2 errors name the flag:\n%v", n, err)
	}
}

// TestRunLinks checks that the caller's links and a page per broker run
// (not per file) reach the report: on the dashboard address when one is
// given, else the page the broker named (its --public-url), else none.
func TestRunLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us := writeLines(t, dir, "us.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":1.5}`)
	pts := []metrics.Point{{Step: 0, Value: 2}, {Step: 10, Value: 1.5}}
	src := fakeSource{
		"alloc-eu1": {Label: "eu-west", Source: "broker:alloc-eu1", Metric: "loss", Points: pts},
		"alloc-ap1": {Label: "ap-south", Source: "broker:alloc-ap1", Metric: "loss", Points: pts, DashboardURL: "https://public.example.com/ui/runs/alloc-ap1"},
	}
	ciRun := report.Link{Label: "CI run", URL: "https://ci.example.com/runs/1"}
	tests := []struct {
		name string
		dash string
		want []report.Link
	}{
		{"no dashboard address", "", []report.Link{ciRun, {Label: "run ap-south", URL: "https://public.example.com/ui/runs/alloc-ap1"}}},
		{"dashboard address", "https://dash.example.com/", []report.Link{ciRun,
			{Label: "run eu-west", URL: "https://dash.example.com/ui/runs/alloc-eu1"}, {Label: "run ap-south", URL: "https://dash.example.com/ui/runs/alloc-ap1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := Run(context.Background(), Options{Runs: refs(us, "alloc-eu1", "alloc-ap1"), Source: src, Links: []report.Link{ciRun}, DashboardURL: tc.dash})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, res.Report.Links); diff != "" {
				t.Errorf("links (-want +got):\n%s", diff)
			}
			if !strings.Contains(string(res.Markdown), "**Links:** [CI run](https://ci.example.com/runs/1)") {
				t.Errorf("the markdown lacks the links line:\n%s", res.Markdown)
			}
		})
	}
}

// TestPartial: with Partial, runs that have not ended give an
// in-progress report, not a verdict: every run with its state and
// figures so far (a run that has logged nothing yet too), the curves of
// those that have logged, no pairs, no divergence even where the curves
// so far differ past the tolerance. Once none is running, Partial changes
// nothing.
func TestPartial(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us := writeLines(t, dir, "us.jsonl", `{"step":0,"loss":2}`, `{"step":10,"loss":1.5}`)
	src := fakeSource{
		"alloc-ap-running": {Label: "ap-south", Source: "broker:alloc-ap-running", Metric: "loss", State: "running", Points: []metrics.Point{{Step: 0, Value: 2}, {Step: 5, Value: 9}}},
		"alloc-sa-running": {Label: "sa-east", Source: "broker:alloc-sa-running", Metric: "loss", State: "matched"},
		"alloc-eu1":        {Label: "eu-west", Source: "broker:alloc-eu1", Metric: "loss", State: "succeeded", Points: []metrics.Point{{Step: 0, Value: 2}, {Step: 10, Value: 1.5}}},
	}
	o := Options{Runs: refs(us, "alloc-ap-running", "alloc-sa-running"), Source: src, Partial: true, Tolerance: tolerance(t, "5%")}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Report
	type row struct {
		Label, State string
		Running      bool
		Points       int
	}
	var got []row
	for _, r := range rep.Runs {
		got = append(got, row{r.Label, r.State, r.Running, r.Points})
	}
	want := []row{{"us", "", false, 2}, {"ap-south", "running", true, 2}, {"sa-east", "matched", true, 0}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("runs (-want +got):\n%s", d)
	}
	if rep.Verdict != report.InProgress || len(rep.Pairs) != 0 || res.Divergence() != nil {
		t.Errorf("verdict %q, %d pairs, divergence %v: want in progress, none, nil", rep.Verdict, len(rep.Pairs), res.Divergence())
	}
	md := string(res.Markdown)
	for _, w := range []string{"### ⏳ gpupass compare: in progress", "**Not a verdict yet:** 2 of 3 run(s) have not ended", "| ap-south | ⏳ running ", "| sa-east  | ⏳ matched ", "| 5         | 9 ", "| n/a       | n/a ", "🔵 us · 🟠 ap-south."} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q:\n%s", w, md)
		}
	}
	if strings.Contains(md, "diverged") || strings.Contains(md, "Pairs") {
		t.Errorf("an in-progress report reads as a verdict:\n%s", md)
	}

	// Right after submission nothing is logged yet: still a report,
	// with every report file written (the CI step writes them all).
	files := Files{Markdown: filepath.Join(dir, "r.md"), JSON: filepath.Join(dir, "r.json"), SVG: filepath.Join(dir, "r.svg"), PNG: filepath.Join(dir, "r.png"), JUnit: filepath.Join(dir, "r.xml")}
	early, err := Run(context.Background(), Options{Runs: refs("alloc-sa-running"), Source: src, Partial: true, Files: files})
	if err != nil {
		t.Fatalf("nothing logged yet: %v", err)
	}
	if early.Report.Verdict != report.InProgress || !strings.Contains(string(early.Markdown), "| sa-east | ⏳ matched ") {
		t.Errorf("nothing logged yet: verdict %q\n%s", early.Report.Verdict, early.Markdown)
	}
	for _, f := range []string{files.Markdown, files.JSON, files.SVG, files.PNG, files.JUnit} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("nothing logged yet: %s not written (%v)", f, err)
		}
	}

	// Every run ended: the verdict, as without Partial.
	o.Runs = refs(us, "alloc-eu1")
	partial, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.Partial = false
	plain, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(plain.Markdown), string(partial.Markdown)); d != "" || partial.Report.Verdict != report.Consistent {
		t.Errorf("Partial with every run ended: verdict %q, markdown (-without +with):\n%s", partial.Report.Verdict, d)
	}
}
