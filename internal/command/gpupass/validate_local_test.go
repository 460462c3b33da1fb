package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

const torchPython = "/usr/bin/python3"

var (
	pyOnce  sync.Once
	pyFacts map[string]string
	pyErr   error
)

// realPython returns the interpreter that has torch here, or calls
// Missing, and a function that gives the values it reports (asked once:
// importing torch takes seconds).
func realPython(t *testing.T) func(key string) string {
	t.Helper()
	if _, err := os.Stat(torchPython); err != nil {
		testutil.Missing(t, "%s", torchPython)
	}
	pyOnce.Do(func() {
		var out []byte
		out, pyErr = exec.Command(torchPython, "-c", `import sys, json, torch, numpy
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "torch": torch.__version__,
  "torch_cuda": torch.version.cuda or "", "numpy": numpy.__version__}))`).Output()
		if pyErr == nil {
			pyErr = json.Unmarshal(out, &pyFacts)
		}
	})
	if pyErr != nil {
		testutil.Missing(t, "torch and numpy in %s (apt python3-torch): %v", torchPython, pyErr)
	}
	return func(key string) string {
		v, ok := pyFacts[key]
		if !ok {
			t.Fatalf("no %s from %s", key, torchPython)
		}
		return v
	}
}

// localSpec writes the testdata spec with numpy pinned to the version
// installed here, so numpy is the one package that matches.
func localSpec(t *testing.T, numpy string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/local/gpupass.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "gpupass.yaml")
	if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("NUMPY_VERSION"), []byte(numpy)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantLines are the mismatch lines this machine must produce: computed
// from the real interpreter, nvcc and NVML state, never hard-coded.
func wantLines(t *testing.T, ask func(string) string) []string {
	var want []string
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("an NVIDIA driver is loaded: the driver line depends on it")
	}
	want = append(want, "Mismatch in NVIDIA driver version: expected 535.104.05, got not found")
	if _, err := exec.LookPath("nvcc"); err == nil {
		t.Skip("nvcc is installed: the CUDA line depends on it")
	}
	want = append(want, "Mismatch in CUDA version: expected 12.1.105, got not found")
	if py := ask("python"); py != "3.10.12" {
		want = append(want, "Mismatch in Python version: expected 3.10.12, got "+py)
	}
	if tv := ask("torch"); tv != "2.1.0+cu121" {
		want = append(want, "Mismatch in PyTorch version: expected 2.1.0+cu121, got "+tv)
	}
	if tc := ask("torch_cuda"); tc != "" && !strings.HasPrefix(tc, "12.1") {
		want = append(want, "Mismatch in PyTorch CUDA build: expected 12.1, got "+majorMinor(tc))
	}
	return append(want, "Mismatch in package flash-attn: expected 2.5.5, got not installed")
}

func TestValidateLocalText(t *testing.T) {
	t.Parallel()
	ask := realPython(t)
	specPath := localSpec(t, ask("numpy"))
	want := wantLines(t, ask)
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"validate", "--spec", specPath, "--local", "--python", torchPython}, nil, &stdout, &stderr)
	if code != ExitFindings {
		t.Errorf("exit code %d, want %d; stderr: %s", code, ExitFindings, stderr.String())
	}
	var got []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(l, "Mismatch in ") {
			got = append(got, l)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mismatch lines (-want +got):\n%s\nstdout:\n%s", diff, stdout.String())
	}
	if !strings.Contains(stdout.String(), "Note: NVML not available: ") {
		t.Errorf("no NVML note in:\n%s", stdout.String())
	}
}

func TestValidateLocalJSON(t *testing.T) {
	t.Parallel()
	ask := realPython(t)
	specPath := localSpec(t, ask("numpy"))
	want := wantLines(t, ask)
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"validate", "--spec", specPath, "--local", "--python", torchPython, "--output", "json"}, nil, &stdout, &stderr)
	if code != ExitFindings {
		t.Errorf("exit code %d, want %d; stderr: %s", code, ExitFindings, stderr.String())
	}
	// stdout holds only JSON: validate's document with the local check
	// under "local" (a validate that prints the check as a second value
	// is accepted too).
	dec := json.NewDecoder(&stdout)
	var local *LocalResult
	for {
		var doc map[string]json.RawMessage
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stdout is not only JSON: %v", err)
		}
		raw, ok := doc["local"]
		if !ok {
			if _, isLocal := doc["mismatches"]; !isLocal {
				continue
			}
			raw, _ = json.Marshal(doc)
		}
		local = &LocalResult{}
		if err := json.Unmarshal(raw, local); err != nil {
			t.Fatal(err)
		}
	}
	if local == nil {
		t.Fatal("no local document on stdout")
	}
	var got []string
	for _, m := range local.Mismatches {
		got = append(got, m.Line())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mismatches (-want +got):\n%s", diff)
	}
	if local.Measured.PyTorch != ask("torch") || local.Python != torchPython {
		t.Errorf("measured %+v python %q", local.Measured, local.Python)
	}
	if local.SpecFingerprint == "" || local.RuntimeFingerprint == local.SpecFingerprint {
		t.Errorf("fingerprints spec %q runtime %q: must differ on a mismatching machine", local.SpecFingerprint, local.RuntimeFingerprint)
	}
}

func TestValidateLocalNoPython(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "python3")
	specPath := localSpec(t, "1.26.4")
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"validate", "--spec", specPath, "--local", "--python", missing}, nil, &stdout, &stderr)
	if code != ExitFindings {
		t.Errorf("exit code %d, want %d; stderr: %s", code, ExitFindings, stderr.String())
	}
	for _, want := range []string{
		"Mismatch in Python version: expected 3.10.12, got not found\n",
		"Mismatch in PyTorch version: expected 2.1.0+cu121, got not found\n",
		"Mismatch in package numpy: expected 1.26.4, got not found\n",
		"Note: python not found: " + missing + "\n",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}
