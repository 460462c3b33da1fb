//go:build e2e

package gpupass_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// torchPython returns a Python that imports torch (Debian's python3-torch
// lives under /usr/bin/python3, not the first python3 on PATH).
func torchPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if err := exec.Command(p, "-c", "import torch").Run(); err == nil {
			return p
		}
	}
	testutil.Missing(t, "a python3 that imports torch (scripts/setup.d/10-python.sh)")
	return ""
}

type metric struct {
	Step int
	Loss float64
	Time string `json:"ts"`
}

func readMetrics(t *testing.T, path string) []metric {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []metric
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m metric
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// TestE2EInitStarterTrains runs the starter's train.py for real: it must
// write one metric line per step, learn (loss falls), checkpoint, and
// resume from a checkpoint the way the agent's NaN guard restarts it.
func TestE2EInitStarterTrains(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := t.TempDir()
	if out, err := exec.Command(bin, "init", dir, "--force").CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	metrics := filepath.Join(dir, "metrics.jsonl")
	ckpt := filepath.Join(dir, "ckpt")
	train := func(steps string, extra ...string) {
		cmd := exec.Command(py, "train.py")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "EXAMPLE_STEPS="+steps, "GPUPASS_METRICS_FILE="+metrics, "GPUPASS_CHECKPOINT_DIR="+ckpt)
		cmd.Env = append(cmd.Env, extra...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("train.py: %v\n%s", err, out)
		}
	}
	train("60")
	ms := readMetrics(t, metrics)
	if len(ms) != 60 || ms[0].Step != 1 || ms[59].Step != 60 {
		t.Fatalf("got %d metric lines (%+v...), want steps 1..60", len(ms), ms[:min(len(ms), 2)])
	}
	if !(ms[59].Loss < ms[0].Loss/10) {
		t.Errorf("loss did not fall: first %g, last %g", ms[0].Loss, ms[59].Loss)
	}
	if !strings.HasSuffix(ms[0].Time, "Z") {
		t.Errorf("timestamp %q is not UTC", ms[0].Time)
	}
	resume := filepath.Join(ckpt, "ckpt-00000050.pt")
	if _, err := os.Stat(resume); err != nil {
		t.Fatalf("no checkpoint at step 50: %v", err)
	}
	train("70", "GPUPASS_RESUME_FROM="+resume)
	ms = readMetrics(t, metrics)
	if len(ms) != 80 {
		t.Fatalf("resume: %d metric lines, want 80", len(ms))
	}
	if ms[60].Step != 51 || ms[79].Step != 70 {
		t.Errorf("resume: steps %d..%d, want 51..70", ms[60].Step, ms[79].Step)
	}
}
