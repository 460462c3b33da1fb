package auditcmd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// TestCIStepAudit: the audit and audit-verify steps call the audit use
// case with the cosign-password input as a value. The process environment
// is not touched (COSIGN_PASSWORD stays unset, here and for the steps that
// follow in the same job), and the typed result sets the step output.
func TestCIStepAudit(t *testing.T) {
	dir, _ := auditFixture(t)
	t.Setenv(audit.PasswordEnv, "") // the signer must not find it there
	os.Unsetenv(audit.PasswordEnv)
	env := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": filepath.Join(dir, "output"), "GITHUB_STEP_SUMMARY": filepath.Join(dir, "summary")}
	getenv := func(k string) string { return env[k] }
	zipPath := filepath.Join(dir, "audit-report.zip")
	var out bytes.Buffer
	o := &gpupass.CIStepOptions{Global: &gpupass.GlobalOptions{Output: "text", Audit: Plugin{}}, Command: "audit", RunFile: filepath.Join(dir, "run.json"), CosignKey: filepath.Join(dir, "cosign.key"),
		CosignPassword: "gpupass-test", AuditPath: zipPath, Getenv: getenv}
	if err := gpupass.RunCIStep(context.Background(), o, &out); err != nil {
		t.Fatalf("audit step: %v\n%s", err, out.String())
	}
	if v, set := os.LookupEnv(audit.PasswordEnv); set {
		t.Errorf("the audit step set %s=%q in the process environment", audit.PasswordEnv, v)
	}
	if !strings.Contains(out.String(), "wrote "+zipPath) {
		t.Errorf("audit step printed %q, want the report it wrote", out.String())
	}
	if b, _ := os.ReadFile(env["GITHUB_OUTPUT"]); !strings.Contains(string(b), zipPath) {
		t.Errorf("audit-path output missing: %s", b)
	}
	out.Reset()
	v := &gpupass.CIStepOptions{Global: &gpupass.GlobalOptions{Output: "text", Audit: Plugin{}}, Command: "audit-verify", CosignKey: filepath.Join(dir, "cosign.pub"), AuditPath: zipPath, Getenv: getenv}
	err := gpupass.RunCIStep(context.Background(), v, &out)
	// The fixture run is simulated, so verify reports findings; what
	// matters here is that it read and checked the signature.
	if err != nil && gpupass.ExitCode(err) != gpupass.ExitFindings {
		t.Fatalf("audit-verify step: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "signature") {
		t.Errorf("audit-verify step printed %q, want the signature layer", out.String())
	}
	// Without the agent-key input the agent-signature layer warns; with
	// it, a file or the PEM itself, the key is pinned.
	if !strings.Contains(out.String(), "warn agent-signature  unpinned:") {
		t.Errorf("audit-verify step without agent-key printed %q, want the unpinned warning", out.String())
	}
	pem, err := os.ReadFile(filepath.Join(dir, "agent.pub"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ak := range []string{filepath.Join(dir, "agent.pub"), string(pem)} {
		out.Reset()
		v.AgentKey = ak
		err = gpupass.RunCIStep(context.Background(), v, &out)
		if err != nil && gpupass.ExitCode(err) != gpupass.ExitFindings {
			t.Fatalf("audit-verify step: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "ok   agent-signature  conformance report signed by a pinned agent key") {
			t.Errorf("audit-verify step with agent-key printed %q, want the pinned key", out.String())
		}
	}
	// A wrong password is refused: the value given is the one used.
	o.CosignPassword, o.AuditPath = "wrong", filepath.Join(dir, "other.zip")
	if err := gpupass.RunCIStep(context.Background(), o, &bytes.Buffer{}); err == nil {
		t.Error("audit step with a wrong cosign-password succeeded")
	}
}

// TestAuditErrorsNameFlagOrInput: the audit library refuses a public key
// to sign with in its own terms; `gpupass audit` names --key and the
// audit step names its input cosign-key, neither the other's.
func TestAuditErrorsNameFlagOrInput(t *testing.T) {
	t.Parallel()
	keys, _ := auditFixture(t)
	dir := t.TempDir()
	pub := filepath.Join(keys, "cosign.pub")
	var out, errb bytes.Buffer
	code := gpupass.Main(context.Background(), []string{"audit", "alloc-7f3a", "--run-file", filepath.Join(keys, "run.json"), "--key", pub, "--out", filepath.Join(dir, "a.zip")},
		strings.NewReader(""), &out, &errb, gpupass.WithAudit(Plugin{}))
	if want := `--key "` + pub + `" is a public key: signing takes the private key`; code != gpupass.ExitUsage || !strings.Contains(errb.String(), want) {
		t.Errorf("audit: exit %d, stderr %q; want %q", code, errb.String(), want)
	}
	o := &gpupass.CIStepOptions{Global: &gpupass.GlobalOptions{Output: "text", Audit: Plugin{}}, Command: "audit", RunFile: filepath.Join(keys, "run.json"),
		CosignKey: pub, AuditPath: filepath.Join(dir, "b.zip"), ReportDir: filepath.Join(dir, "rep"), Getenv: func(string) string { return "" }}
	err := gpupass.RunCIStep(context.Background(), o, &bytes.Buffer{})
	if want := `input cosign-key "` + pub + `" is a public key: signing takes the private key`; gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(fmt.Sprint(err), want) || strings.Contains(fmt.Sprint(err), "--") {
		t.Errorf("ci step: %v (exit %d); want %q and no flag", err, gpupass.ExitCode(err), want)
	}
}
