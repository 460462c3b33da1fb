package auditcmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// TestCIStepAudit: the audit and audit-verify steps (gpupass -o github
// audit, audit verify) call the audit use case with the cosign-password
// input (--key-password) as a value. The process environment
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
	o := AuditOptions{Output: "github", RunFile: filepath.Join(dir, "run.json"), Key: filepath.Join(dir, "cosign.key"),
		Password: []byte("gpupass-test"), Out: zipPath, Getenv: getenv}
	if err := RunAudit(context.Background(), o, &out); err != nil {
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
	v := AuditVerifyOptions{Output: "github", Key: filepath.Join(dir, "cosign.pub"), Path: zipPath, Getenv: getenv}
	err := RunAuditVerify(context.Background(), v, &out)
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
		v.AgentKeys = []string{ak}
		err = RunAuditVerify(context.Background(), v, &out)
		if err != nil && gpupass.ExitCode(err) != gpupass.ExitFindings {
			t.Fatalf("audit-verify step: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "ok   agent-signature  conformance report signed by a pinned agent key") {
			t.Errorf("audit-verify step with agent-key printed %q, want the pinned key", out.String())
		}
	}
	// A wrong password is refused: the value given is the one used.
	o.Password, o.Out = []byte("wrong"), filepath.Join(dir, "other.zip")
	if err := RunAudit(context.Background(), o, &bytes.Buffer{}); err == nil {
		t.Error("audit step with a wrong cosign-password succeeded")
	}
}

// TestAuditErrorsNameFlagOrInput: the audit library refuses a public key
// to sign with in its own terms; `gpupass audit` names --key and, as the
// audit step (-o github), also its variable and the input cosign-key.
func TestAuditErrorsNameFlagOrInput(t *testing.T) {
	t.Parallel()
	keys, _ := auditFixture(t)
	dir := t.TempDir()
	pub := filepath.Join(keys, "cosign.pub")
	var out, errb bytes.Buffer
	code := gpupass.Main(context.Background(), []string{"audit", "alloc-7f3a", "--run-file", filepath.Join(keys, "run.json"), "--key", pub, "--out", filepath.Join(dir, "a.zip")},
		strings.NewReader(""), &out, &errb, gpupass.WithCommands(Command))
	if want := `--key "` + pub + `" is a public key: signing takes the private key`; code != gpupass.ExitUsage || !strings.Contains(errb.String(), want) {
		t.Errorf("audit: exit %d, stderr %q; want %q", code, errb.String(), want)
	}
	out.Reset()
	errb.Reset()
	code = gpupass.Main(context.Background(), []string{"-o", "github", "audit", "--run-file", filepath.Join(keys, "run.json"), "--key", pub, "--out", filepath.Join(dir, "b.zip")},
		strings.NewReader(""), &out, &errb, gpupass.WithCommands(Command))
	if want := `--key (GPUPASS_KEY, the cosign-key input) "` + pub + `" is a public key: signing takes the private key`; code != gpupass.ExitUsage || !strings.Contains(errb.String(), want) {
		t.Errorf("gpupass -o github audit: exit %d, stderr %q; want %q", code, errb.String(), want)
	}
}

// TestAuditVerifyStepRefusesAMangledKey: the audit-verify step with a
// cosign-key input that is neither a file nor a PEM key is one usage
// error that never echoes the value (it may be a mangled secret).
func TestAuditVerifyStepRefusesAMangledKey(t *testing.T) {
	t.Parallel()
	const secret = "tok-must-not-leak-9f3"
	var out, log bytes.Buffer
	err := RunAuditVerify(context.Background(), AuditVerifyOptions{Output: "github", Key: secret, Path: "audit-report.zip", ErrOut: &log,
		Getenv: func(string) string { return "" }}, &out)
	if gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(err.Error(), "--key (GPUPASS_KEY, the cosign-key input): neither a readable file nor a PEM key") {
		t.Errorf("err %v (exit %d), want a usage error naming the flag and the input", err, gpupass.ExitCode(err))
	}
	if all := out.String() + log.String() + err.Error(); strings.Contains(all, secret) {
		t.Errorf("the key's value reached the output:\n%s", all)
	}
}
