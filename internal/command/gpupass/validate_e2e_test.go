//go:build e2e

package gpupass_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// run executes the built gpupass in dir with extra environment variables
// and returns stdout, stderr and the exit code.
func run(t *testing.T, bin, dir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// A clean environment: the test must not inherit a CI's GITHUB_* vars.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	return testutil.Run(t, cmd)
}

// TestE2EValidate builds the binary and uses it as a user would: init a
// project, validate it, break it, validate each corpus spec.
func TestE2EValidate(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := t.TempDir()

	out, errOut, code := run(t, bin, dir, nil, "init", "proj")
	if code != 0 {
		t.Fatalf("init: exit %d\n%s%s", code, out, errOut)
	}
	proj := filepath.Join(dir, "proj")

	out, errOut, code = run(t, bin, proj, nil, "validate")
	if code != 0 || !strings.Contains(out, "gpupass.yaml: valid") || !strings.Contains(out, "fingerprint: sha256:") {
		t.Fatalf("validate starter: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("colour written to a pipe")
	}

	// JSON: only JSON on stdout, with the fingerprint and canonical form.
	out, _, code = run(t, bin, proj, nil, "validate", "--output", "json")
	var res struct {
		Valid       bool
		Fingerprint string
		Canonical   map[string]any
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.Valid || res.Canonical["runtime"] == nil {
		t.Fatalf("validate -o json: exit %d, %+v\n%s", code, res, out)
	}

	// Break the spec: exit 1 with positioned findings.
	spec := filepath.Join(proj, "gpupass.yaml")
	b, _ := os.ReadFile(spec)
	broken := strings.Replace(string(b), "cuda: 12.1.105", "cuda: 12.1", 1)
	broken = strings.Replace(broken, "count: 1", "count: \"eight\"", 1)
	if err := os.WriteFile(spec, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(t, bin, proj, nil, "validate")
	if code != 1 {
		t.Errorf("broken spec: exit %d, want 1\n%s", code, out)
	}
	// The finding points at the cuda line of the starter spec, wherever
	// init's template puts it.
	cudaLine := 1 + strings.Count(broken[:strings.Index(broken, "cuda: 12.1")], "\n")
	for _, want := range []string{fmt.Sprintf("gpupass.yaml:%d:9: error [cuda.exact-version]", cudaLine), "[yaml.type] resources.count must be an integer"} {
		if !strings.Contains(out, want) {
			t.Errorf("broken spec output lacks %q:\n%s", want, out)
		}
	}

	// GitHub Actions: annotations on stdout, the fingerprint as step output.
	ghOut := filepath.Join(dir, "gh_output")
	os.WriteFile(spec, b, 0o644)
	_, _, code = run(t, bin, proj, []string{"GITHUB_ACTIONS=true", "GITHUB_OUTPUT=" + ghOut}, "validate")
	got, _ := os.ReadFile(ghOut)
	if code != 0 || !strings.Contains(string(got), res.Fingerprint) {
		t.Errorf("GitHub output: exit %d, GITHUB_OUTPUT %q, want fingerprint %s", code, got, res.Fingerprint)
	}

	// GPUPASS_SPEC selects the file like --spec.
	out, _, code = run(t, bin, dir, []string{"GPUPASS_SPEC=proj/gpupass.yaml"}, "validate")
	if code != 0 || !strings.Contains(out, "proj/gpupass.yaml: valid") {
		t.Errorf("GPUPASS_SPEC: exit %d\n%s", code, out)
	}

	// No spec anywhere: a usage error, exit 2.
	_, errOut, code = run(t, bin, t.TempDir(), nil, "validate")
	if code != 2 || !strings.Contains(errOut, "gpupass init") {
		t.Errorf("no spec: exit %d, stderr %q", code, errOut)
	}
}

// TestE2ECorpus validates every corpus spec through the binary and checks
// the exit code against the spec's `# expect:` header.
func TestE2ECorpus(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := filepath.Join(testutil.RepoRoot(t), "internal", "spec", "testdata", "specs")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 30 {
		t.Fatalf("corpus: %d files, %v", len(files), err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		out, errOut, code := run(t, bin, dir, nil, "validate", "--spec", name, "-o", "json")
		var res struct {
			Valid    bool
			Findings []struct{ Severity string }
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Errorf("%s: stdout is not JSON (%v)\n%s%s", name, err, out, errOut)
			continue
		}
		want := 1
		if res.Valid {
			want = 0
		}
		if code != want {
			t.Errorf("%s: exit %d, want %d (valid=%v)", name, code, want, res.Valid)
		}
		b, _ := os.ReadFile(f)
		header, _, _ := strings.Cut(string(b), "\n")
		if strings.Contains(header, "(valid)") && !res.Valid {
			t.Errorf("%s: expected valid, got findings %+v", name, res.Findings)
		}
	}
}
