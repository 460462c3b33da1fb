//go:build e2e

package gpupass

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestAuditNeverStartedE2E audits, with the built gpupass against a real
// broker, a run cancelled before it started (issue #32, item 10): there
// is nothing to audit, which is how the command was called, not a finding
// about the run's proof. The answer is a usage error (exit 2) that says
// so and what to audit instead, without an HTTP 500: the broker's
// failed_precondition is a client-side (4xx) answer.
func TestAuditNeverStartedE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	// A registered node that never polls: the run stays matched.
	brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "eu-*"), brokertest.H100("eu-central-1", 2.5))
	spec, err := filepath.Abs(filepath.Join("..", "..", "..", "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gp := func(tok string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GPUPASS_BROKER_URL=" + b.URL, "GPUPASS_BROKER_TOKEN=" + tok, "COSIGN_PASSWORD=e2e-pw"}
		return testutil.Run(t, cmd)
	}
	if out, errOut, code := gp("", "audit", "keygen", "--out-prefix", "release"); code != ExitOK {
		t.Fatalf("keygen: exit %d\n%s%s", code, out, errOut)
	}
	submit := b.Token(t, store.RoleSubmit, "eu-*")
	out, errOut, code := gp(submit, "train", "-o", "json", "-s", spec, "--region", "eu-central-1", "--", "python3", "train.py")
	if code != ExitOK {
		t.Fatalf("train: exit %d\n%s%s", code, out, errOut)
	}
	id := strings.TrimSpace(out[strings.Index(out, `"id": "`)+7:])
	id = id[:strings.Index(id, `"`)]
	if out, errOut, code := gp(submit, "cancel", id); code != ExitOK || !strings.Contains(out, "cancelled") {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}

	out, errOut, code = gp(b.Token(t, store.RoleRead, "eu-*"), "audit", id, "--key", "release.key", "--out", "audit.zip")
	t.Logf("audit: exit %d: %s", code, errOut)
	if code != ExitUsage {
		t.Errorf("audit of a run cancelled before it started: exit %d, want %d\n%s%s", code, ExitUsage, out, errOut)
	}
	for _, want := range []string{id + " was cancelled before it started", "nothing to audit", "(400 failed_precondition)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	// The broker's answer names no command; the CLI adds the one that
	// lists the runs there are to audit, and it runs as printed.
	if !strings.HasSuffix(strings.TrimSpace(errOut), "; gpupass runs lists the runs") {
		t.Errorf("stderr does not end naming gpupass runs:\n%s", errOut)
	}
	if out, errRuns, code := gp(b.Token(t, store.RoleRead, "eu-*"), "runs"); code != ExitOK || !strings.Contains(out, id) {
		t.Errorf("gpupass runs as printed: exit %d\n%s%s", code, out, errRuns)
	}
	if strings.Contains(errOut, "500") {
		t.Errorf("stderr shows an HTTP 500 for a client-side refusal:\n%s", errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "audit.zip")); err == nil {
		t.Error("an audit zip was written for a run that never started")
	}
}
