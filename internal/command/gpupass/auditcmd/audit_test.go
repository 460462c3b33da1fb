package auditcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
)

// auditFixture copies the audit package's fixture (run record, cosign
// key pair encrypted with "gpupass-test", agent key) into a temp dir.
func auditFixture(t *testing.T) (dir string, getenv func(string) string) {
	t.Helper()
	dir = t.TempDir()
	for _, name := range []string{"run.json", "cosign.key", "cosign.pub", "agent.pub"} {
		b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "internal", "audit", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{audit.PasswordEnv: "gpupass-test"}
	return dir, func(k string) string { return env[k] }
}

func TestRunAuditAndVerify(t *testing.T) {
	t.Parallel()
	dir, getenv := auditFixture(t)
	zipPath := filepath.Join(dir, "audit-report.zip")
	var out bytes.Buffer
	err := RunAudit(context.Background(), AuditOptions{
		AllocationID: "alloc-7f3a", Out: zipPath, RunFile: filepath.Join(dir, "run.json"),
		Key: filepath.Join(dir, "cosign.key"), Attest: true, Output: "json", Getenv: getenv,
	}, &out)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	var res AuditResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("audit --output json is not JSON: %v\n%s", err, out.String())
	}
	want := AuditResult{Path: zipPath, AllocationID: "alloc-7f3a", ManifestSHA256: res.ManifestSHA256, Files: 10, Signing: "key", Attested: true, Match: true, Simulated: true}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("audit result (-want +got):\n%s", diff)
	}

	verify := func(zip string, agentKeys ...string) (map[string]any, error) {
		var vout bytes.Buffer
		err := RunAuditVerify(context.Background(), AuditVerifyOptions{
			Path: zip, Key: filepath.Join(dir, "cosign.pub"), AgentKeys: agentKeys, Output: "json", Getenv: getenv,
		}, &vout)
		var m map[string]any
		if jerr := json.Unmarshal(vout.Bytes(), &m); jerr != nil {
			t.Fatalf("verify --output json is not JSON: %v (err %v)\n%s", jerr, err, vout.String())
		}
		return m, err
	}
	m, err := verify(zipPath, filepath.Join(dir, "agent.pub"))
	if err != nil || m["ok"] != true {
		t.Fatalf("verify: %v %v", err, m)
	}

	// Text output, with extraction.
	var tout bytes.Buffer
	exDir := filepath.Join(dir, "extracted")
	if err := RunAuditVerify(context.Background(), AuditVerifyOptions{Path: zipPath, Key: filepath.Join(dir, "cosign.pub"), Extract: exDir, Output: "text", Getenv: getenv}, &tout); err != nil {
		t.Fatalf("verify text: %v\n%s", err, tout.String())
	}
	for _, want := range []string{"SIMULATED", "ok   signature", "ok   manifest", "warn agent-signature  unpinned:", "pin the node's key with --agent-key agent.pub", "with warnings: unpinned", "ok   fingerprint", "ok   attestation", "extracted the report's files into " + exDir, "verified " + zipPath} {
		if !strings.Contains(tout.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, tout.String())
		}
	}
	if _, err := os.Stat(filepath.Join(exDir, audit.FileManifest)); err != nil {
		t.Errorf("not extracted: %v", err)
	}

	// An agent key list with a validity window that ended before the report.
	list, _ := json.Marshal([]map[string]string{{"pem": mustRead(t, filepath.Join(dir, "agent.pub")), "not_after": "2026-01-01T00:00:00Z"}})
	expired := filepath.Join(dir, "agents.json")
	if err := os.WriteFile(expired, list, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err = verify(zipPath, expired)
	if gpupass.ExitCode(err) != gpupass.ExitFindings || m["failed_layer"] != audit.LayerAgent {
		t.Errorf("expired agent key: exit %d, failed_layer %v", gpupass.ExitCode(err), m["failed_layer"])
	}

	// Tamper one byte of the run summary inside the zip.
	bad := testutil.RewriteZip(t, zipPath, audit.FileRunSummary, func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"restarts": 1`), []byte(`"restarts": 0`), 1)
	})
	badPath := filepath.Join(dir, "bad.zip")
	if err := os.WriteFile(badPath, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err = verify(badPath)
	if gpupass.ExitCode(err) != gpupass.ExitFindings || m["ok"] != false || m["failed_layer"] != audit.LayerManifest {
		t.Errorf("tampered zip: exit %d, result %v", gpupass.ExitCode(err), m)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRunAuditErrors(t *testing.T) {
	t.Parallel()
	dir, getenv := auditFixture(t)
	running := filepath.Join(dir, "running.json")
	b, _ := os.ReadFile(filepath.Join(dir, "run.json"))
	if err := os.WriteFile(running, bytes.Replace(b, []byte(`"state": "succeeded"`), []byte(`"state": "running"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	base := AuditOptions{AllocationID: "alloc-7f3a", Out: filepath.Join(dir, "out.zip"), RunFile: filepath.Join(dir, "run.json"), Key: filepath.Join(dir, "cosign.key"), Getenv: getenv}
	tests := []struct {
		name     string
		mutate   func(*AuditOptions)
		wantCode int
		want     string
	}{
		{"in progress", func(o *AuditOptions) { o.RunFile = running }, gpupass.ExitFindings, "still in progress"},
		{"other allocation", func(o *AuditOptions) { o.AllocationID = "alloc-other" }, gpupass.ExitUsage, `not "alloc-other"`},
		{"no run file and no broker", func(o *AuditOptions) { o.RunFile = "" }, gpupass.ExitUsage, "--broker-url"},
		{"no key", func(o *AuditOptions) { o.Key = "" }, gpupass.ExitUsage, "gpupass audit keygen"},
		{"wrong password", func(o *AuditOptions) {
			o.Getenv = func(k string) string { return map[string]string{audit.PasswordEnv: "nope"}[k] }
		}, gpupass.ExitUsage, "wrong password"},
		{"public key as signing key", func(o *AuditOptions) { o.Key = filepath.Join(dir, "cosign.pub") }, gpupass.ExitUsage, "public key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := base
			tc.mutate(&o)
			err := RunAudit(context.Background(), o, &bytes.Buffer{})
			if gpupass.ExitCode(err) != tc.wantCode || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("exit %d err %v; want exit %d and %q", gpupass.ExitCode(err), err, tc.wantCode, tc.want)
			}
			if strings.Contains(err.Error(), "gpupass-test") {
				t.Errorf("error leaks the key password: %v", err)
			}
		})
	}
}

func TestRunAuditKeygen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	getenv := func(k string) string { return map[string]string{audit.PasswordEnv: "pw"}[k] }
	prefix := filepath.Join(dir, "release")
	var out bytes.Buffer
	if err := RunAuditKeygen(context.Background(), AuditKeygenOptions{Prefix: prefix, Output: "json", Getenv: getenv}, &out); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %s", out.String())
	}
	if diff := cmp.Diff(map[string]string{"private_key": prefix + ".key", "public_key": prefix + ".pub"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := audit.LoadPrivateKey(audit.KeyRef(prefix+".key"), []byte("pw"), getenv, nil); err != nil {
		t.Errorf("the written key does not load: %v", err)
	}
	if err := RunAuditKeygen(context.Background(), AuditKeygenOptions{Prefix: prefix, Getenv: getenv}, &out); gpupass.ExitCode(err) != gpupass.ExitUsage {
		t.Errorf("second keygen without --force: %v", err)
	}
}

// TestAuditCommandWiring drives the cobra tree in process.
func TestAuditCommandWiring(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		wantCode int
		want     string
	}{
		{[]string{"audit"}, gpupass.ExitUsage, "missing ALLOC"},
		{[]string{"audit", "verify"}, gpupass.ExitUsage, "missing the audit report: name its zip"},
		{[]string{"audit", "verify", "x.zip"}, gpupass.ExitUsage, "--key is required"},
		{[]string{"audit", "keygen", "extra"}, gpupass.ExitUsage, "unknown command"},
		{[]string{"audit", "verify", "--help"}, gpupass.ExitOK, "--agent-key"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := gpupass.Main(context.Background(), tc.args, nil, &out, &errb, gpupass.WithCommands(Command))
			if code != tc.wantCode || !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Fatalf("exit %d, want %d; output %q %q; want %q", code, tc.wantCode, out.String(), errb.String(), tc.want)
			}
		})
	}
}

// auditReport builds the fixture's attested report and returns its path.
func auditReport(t *testing.T) (dir, zipPath string, getenv func(string) string) {
	t.Helper()
	dir, getenv = auditFixture(t)
	zipPath = filepath.Join(dir, "audit-report.zip")
	err := RunAudit(context.Background(), AuditOptions{
		AllocationID: "alloc-7f3a", Out: zipPath, RunFile: filepath.Join(dir, "run.json"),
		Key: filepath.Join(dir, "cosign.key"), Attest: true, Getenv: getenv,
	}, io.Discard)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	return dir, zipPath, getenv
}

// TestAuditVerifyEmptyAgentKeyList: --agent-key asks for pinning, so a
// key list that holds no key must not fall back to the report's own key.
func TestAuditVerifyEmptyAgentKeyList(t *testing.T) {
	t.Parallel()
	dir, zipPath, getenv := auditReport(t)
	agents := filepath.Join(dir, "agents.json")
	if err := os.WriteFile(agents, []byte("[]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := RunAuditVerify(context.Background(), AuditVerifyOptions{
		Path: zipPath, Key: filepath.Join(dir, "cosign.pub"), AgentKeys: []string{agents}, Getenv: getenv,
	}, &out)
	if err == nil || !strings.Contains(err.Error(), agents) || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("verify with an empty --agent-key list: err %v, want one naming %s as empty\n%s", err, agents, out.String())
	}
	if strings.Contains(out.String(), "verified") {
		t.Errorf("output claims verification:\n%s", out.String())
	}
}

// TestAuditOutputIsTheFormat: -o means the output format on audit as on
// every command (issue #33, item 4). A zip given to it, which once named
// the report, is refused before anything is read or written, with --out
// as the fix; -o json prints JSON that parses.
func TestAuditOutputIsTheFormat(t *testing.T) {
	t.Parallel()
	dir, zipPath, _ := auditReport(t)
	t.Run("a zip", func(t *testing.T) {
		t.Parallel()
		zip := filepath.Join(t.TempDir(), "report.zip")
		var out, errb bytes.Buffer
		code := gpupass.Main(context.Background(), []string{"audit", "alloc-7f3a", "--run-file", filepath.Join(dir, "run.json"), "--key", filepath.Join(dir, "cosign.key"), "-o", zip},
			nil, &out, &errb, gpupass.WithCommands(Command))
		want := fmt.Sprintf("gpupass: -o %s: --output is the output format (text, json, github or gitlab); write the zip with --out %s\n", zip, zip)
		if code != gpupass.ExitUsage || out.String() != "" || errb.String() != want {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stderr %q", code, out.String(), errb.String(), gpupass.ExitUsage, want)
		}
		if _, err := os.Stat(zip); !os.IsNotExist(err) {
			t.Errorf("audit wrote %s", zip)
		}
	})
	t.Run("json", func(t *testing.T) {
		t.Parallel()
		var out, errb bytes.Buffer
		code := gpupass.Main(context.Background(), []string{"audit", "verify", zipPath, "--key", filepath.Join(dir, "cosign.pub"), "-o", "json"},
			nil, &out, &errb, gpupass.WithCommands(Command))
		var got struct {
			File string `json:"file"`
			OK   bool   `json:"ok"`
		}
		if err := json.Unmarshal(out.Bytes(), &got); code != gpupass.ExitOK || err != nil || got.File != zipPath || !got.OK {
			t.Errorf("exit %d (%s), not verify's JSON (%v): %q", code, errb.String(), err, out.String())
		}
	})
}
