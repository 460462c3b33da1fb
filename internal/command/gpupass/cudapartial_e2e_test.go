//go:build e2e

package gpupass

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestValidateCUDAMajorMinorAtOnceE2E runs the built gpupass validate on a
// spec whose cuda is "12.4" (major.minor only), then on the same spec with
// the exact toolkit the fix hint names (issue #32, item 10). The findings
// that depend on the CUDA release (driver, PyTorch's CUDA tag, compiled
// packages) are reported in the first run, against the release it names,
// so fixing cuda brings no new ones: every finding of the second run was
// in the first.
func TestValidateCUDAMajorMinorAtOnceE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := t.TempDir()
	const spec = `name: mm
runtime:
  cuda: %s
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.0+cu121
  packages:
    - bitsandbytes==0.43.0
    - deepspeed==0.14.0
security:
  fips-compliant: false
  no-internet-access: false
resources:
  accelerator: h100-sxm5
  count: 1
`
	type finding struct{ Rule, Path, Message string }
	validate := func(cuda string) (map[string]finding, int) {
		t.Helper()
		p := filepath.Join(dir, "gpupass.yaml")
		if err := os.WriteFile(p, []byte(strings.Replace(spec, "%s", cuda, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "validate", "-o", "json", "-s", p)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
		stdout, stderr, code := testutil.Run(t, cmd)
		var doc struct{ Findings []finding }
		if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
			t.Fatalf("validate -o json: %v\n%s%s", err, stdout, stderr)
		}
		got := map[string]finding{}
		for _, f := range doc.Findings {
			got[f.Rule+" "+f.Path] = f
		}
		return got, code
	}
	first, code := validate(`"12.4"`)
	if code != ExitFindings {
		t.Errorf(`cuda "12.4": exit %d, want %d`, code, ExitFindings)
	}
	for _, want := range []string{"cuda.exact-version runtime.cuda", "driver.too-old runtime.nvidia-driver",
		"torch.cuda-mismatch runtime.pytorch", "package.cuda-unsupported runtime.packages[0]"} {
		if _, ok := first[want]; !ok {
			t.Errorf(`cuda "12.4": no %s finding; got %v`, want, first)
		}
	}
	// The fix hint's exact version: what a user pastes.
	hint := first["cuda.exact-version runtime.cuda"]
	second, _ := validate("12.4.131")
	for k, f := range second {
		if _, ok := first[k]; !ok {
			t.Errorf("fixing cuda as told (%+v) brought a new finding: %s: %s", hint, k, f.Message)
		}
	}
	if _, ok := second["cuda.exact-version runtime.cuda"]; ok {
		t.Errorf("cuda 12.4.131 still has cuda.exact-version: %v", second)
	}
}
