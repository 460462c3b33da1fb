//go:build e2e

package gpupass

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestAuditRunsGpupassAudit: gpupass does not link the audit commands
// (sigstore); it runs gpupass-audit for them with the same arguments,
// streams and exit code, finds it beside itself, on PATH or in
// $GPUPASS_AUDIT_BIN, and says how to get it when it is missing.
func TestAuditRunsGpupassAudit(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass") // gpupass-audit beside it
	run := func(env []string, args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), env...)
		return testutil.Run(t, cmd)
	}
	t.Run("beside", func(t *testing.T) {
		dir := t.TempDir()
		// -o json before the command reaches gpupass-audit too.
		out, errOut, code := run(nil, "-o", "json", "audit", "keygen", "--out-prefix", filepath.Join(dir, "k"))
		if code != 0 || !strings.Contains(out, `"public_key"`) {
			t.Fatalf("audit keygen through gpupass: exit %d\n%s%s", code, out, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, "k.key")); err != nil {
			t.Fatal(err)
		}
		// Its exit code and its own error pass through unchanged.
		_, errOut, code = run(nil, "audit", "verify", "missing.zip", "--key", filepath.Join(dir, "k.pub"))
		if code != ExitUsage && code != ExitFindings || strings.Count(errOut, "missing.zip") != 1 {
			t.Errorf("audit verify of a missing zip: exit %d, stderr %q; want its error once", code, errOut)
		}
		out, _, code = run(nil, "audit", "verify", "--help")
		if code != 0 || !strings.Contains(out, "--agent-key") {
			t.Errorf("audit verify --help: exit %d\n%s", code, out)
		}
	})
	t.Run("missing", func(t *testing.T) {
		lone := filepath.Join(t.TempDir(), "gpupass")
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(lone, b, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(lone, "audit", "keygen")
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", AuditBinaryEnv+"=")
		_, errOut, code := testutil.Run(t, cmd)
		if code != ExitUsage || !strings.Contains(errOut, "gpupass-audit") || !strings.Contains(errOut, "go install github.com/gpupass/gpupass/cmd/gpupass-audit") {
			t.Errorf("without gpupass-audit: exit %d, stderr %q; want exit 2 saying where to get it", code, errOut)
		}
		// validate needs nothing more.
		cmd = exec.Command(lone, "validate", "--spec", filepath.Join(testutil.RepoRoot(t), "internal", "spec", "testdata", "specs", "design-example-fixed.yaml"))
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin")
		if out, errOut, code := testutil.Run(t, cmd); code != 0 {
			t.Errorf("validate without gpupass-audit: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("not the audit build", func(t *testing.T) {
		// $GPUPASS_AUDIT_BIN naming gpupass itself must not loop.
		_, errOut, code := run([]string{AuditBinaryEnv + "=" + bin}, "audit", "keygen")
		if code != ExitUsage || !strings.Contains(errOut, "without the audit commands") {
			t.Errorf("GPUPASS_AUDIT_BIN=gpupass: exit %d, stderr %q", code, errOut)
		}
	})
}
