//go:build e2e

package main_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// trainPython is the interpreter that has torch (Debian's python3-torch).
const trainPython = "/usr/bin/python3"

// train runs the PyTorch example for steps; with toFile it writes JSONL
// through GPUPASS_METRICS_FILE, else its stdout (a log with
// gpupass:metric lines) is saved. It returns the metrics path.
func train(t *testing.T, dir, name string, toFile bool, extra ...string) string {
	t.Helper()
	script := filepath.Join(testutil.RepoRoot(t), "examples", "train", "train.py")
	if _, err := os.Stat(script); err != nil {
		testutil.Missing(t, "examples/train/train.py")
	}
	if err := exec.Command(trainPython, "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "%s with torch (python3-torch)", trainPython)
	}
	cmd := exec.Command(trainPython, append([]string{script, "--steps", "120"}, extra...)...)
	cmd.Env = append(os.Environ(), "GPUPASS_METRICS_FILE=", "GPUPASS_RESUME_FROM=", "GPUPASS_CHECKPOINT_DIR=")
	path := filepath.Join(dir, name+".log")
	if toFile {
		path = filepath.Join(dir, name+".jsonl")
		cmd.Env = append(cmd.Env, "GPUPASS_METRICS_FILE="+path)
	}
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 3) {
		t.Fatalf("train.py %s: %v", name, err)
	}
	if !toFile {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

type result struct {
	Verdict string
	Runs    []struct {
		Label     string
		Points    int
		LastStep  int64 `json:"last_step"`
		NonFinite int   `json:"non_finite"`
	}
	Pairs []struct {
		A, B            string
		CommonSteps     int    `json:"common_steps"`
		MaxAbsDelta     any    `json:"max_abs_delta"`
		FirstDivergence *int64 `json:"first_divergence_step"`
	}
}

func compare(t *testing.T, bin string, args ...string) (result, string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"compare", "-o", "json", "--post", "none"}, args...)...)
	cmd.Env = append(os.Environ(), "GITHUB_STEP_SUMMARY=", "GITHUB_ACTIONS=", "GITLAB_CI=")
	stdout, stderr, code := testutil.Run(t, cmd)
	var r result
	if stdout != "" {
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("stdout is not one JSON document: %v\n%s", err, stdout)
		}
	}
	return r, stderr, code
}

// TestCompareExampleRuns trains the example three times (two healthy
// "regions", one with a NaN injected) and compares them as a user would.
func TestCompareExampleRuns(t *testing.T) {
	dir := t.TempDir()
	us := train(t, dir, "us", true)
	eu := train(t, dir, "eu", false)
	ap := train(t, dir, "ap", true, "--nan-at-step", "40")
	bin := testutil.BuildBinary(t, "./cmd/gpupass")

	svg, junit := filepath.Join(dir, "chart.svg"), filepath.Join(dir, "compare.xml")
	r, stderr, code := compare(t, bin, "--label", "us="+us, "--label", "eu="+eu, "--fail-on-divergence", "--svg", svg, "--junit", junit)
	if code != 0 {
		t.Fatalf("healthy runs: exit %d, stderr %s", code, stderr)
	}
	if r.Verdict != "consistent" || len(r.Runs) != 2 || r.Runs[0].Points != 120 || r.Runs[1].Points != 120 {
		t.Errorf("healthy runs: %+v", r)
	}
	// Same seed, same CPU: the curves are identical.
	if len(r.Pairs) != 1 || r.Pairs[0].CommonSteps != 120 || r.Pairs[0].MaxAbsDelta != float64(0) {
		t.Errorf("pair %+v, want 120 common steps and max |Δ| 0", r.Pairs)
	}
	for _, p := range []string{svg, junit} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := xml.Unmarshal(b, new(struct{})); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}

	// Identical curves are both visible (one dashed) and said to be.
	if b, _ := os.ReadFile(svg); !strings.Contains(string(b), ">curves identical (max |Δ| 0): us vs eu; eu dashed</text>") || !strings.Contains(string(b), ">eu</text>") {
		t.Errorf("chart of the healthy runs lacks its legend or the identical-curves note:\n%s", b)
	}

	nanSVG, nanPNG := filepath.Join(dir, "nan.svg"), filepath.Join(dir, "nan.png")
	r, stderr, code = compare(t, bin, "--label", "us="+us, "--label", "ap="+ap, "--tolerance", "abs=0.01", "--fail-on-divergence", "--svg", nanSVG, "--png", nanPNG)
	if code != 1 {
		t.Fatalf("NaN run: exit %d, want 1 (findings); stderr %s", code, stderr)
	}
	if !strings.Contains(stderr, "runs diverged") {
		t.Errorf("stderr %q lacks the divergence", stderr)
	}
	if r.Verdict != "diverged" || r.Runs[1].NonFinite != 1 || r.Runs[1].LastStep != 40 {
		t.Errorf("NaN run: %+v", r)
	}
	if fd := r.Pairs[0].FirstDivergence; fd == nil || *fd != 40 {
		t.Errorf("first divergence %v, want step 40 (the NaN)", fd)
	}
	b, _ := os.ReadFile(nanSVG)
	for _, want := range []string{">diverged: step 40</text>", ">ap: NaN or Inf at step 40 (× on the top edge)</text>", ">tolerance of us</text>"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("chart of the NaN run lacks %s:\n%s", want, b)
		}
	}
	if p, err := os.ReadFile(nanPNG); err != nil || !bytes.HasPrefix(p, []byte("\x89PNG")) {
		t.Errorf("--png: %v", err)
	}

	// Text mode prints the markdown report.
	text := exec.Command(bin, "compare", "--post", "none", us, eu)
	text.Env = append(os.Environ(), "GITHUB_STEP_SUMMARY=")
	out, err := text.Output()
	if err != nil || !strings.Contains(string(out), "✅ gpupass compare: consistent") || !strings.Contains(string(out), "xychart-beta") {
		t.Errorf("text output (%v):\n%s", err, out)
	}
}
