//go:build e2e

package gpupass

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestAuditE2E drives the real binary as a user would: keygen, audit a
// finished run record offline (--run-file; TestUpTrainAudit audits through
// the broker), verify, tamper, verify again.
func TestAuditE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := auditFixture(t)
	gp := func(env []string, args ...string) (stdout, stderr string, code int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=e2e-pw")
		cmd.Env = append(cmd.Env, env...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}

	if out, errOut, code := gp(nil, "audit", "keygen", "--out-prefix", "release"); code != 0 {
		t.Fatalf("keygen: exit %d\n%s%s", code, out, errOut)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "release.key"))
	if err != nil {
		t.Fatal(err)
	}

	// The key comes from a variable through env://, the flag from GPUPASS_KEY.
	out, errOut, code := gp([]string{"GPUPASS_KEY=env://RELEASE_KEY", "RELEASE_KEY=" + string(keyPEM)},
		"audit", "alloc-7f3a", "--run-file", "run.json", "--out", "audit-report.zip", "--attest")
	if code != 0 {
		t.Fatalf("audit: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "SIMULATED") || !strings.Contains(errOut, "SIMULATED") {
		t.Errorf("a simulated run must be flagged loudly on stdout and stderr:\n%s\n%s", out, errOut)
	}
	if strings.Contains(out+errOut, "BEGIN") || strings.Contains(out+errOut, "e2e-pw") {
		t.Errorf("output leaks key material or the password:\n%s%s", out, errOut)
	}

	out, errOut, code = gp(nil, "audit", "verify", "audit-report.zip", "--key", "release.pub", "--agent-key", "agent.pub", "--output", "json")
	if code != 0 {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errOut)
	}
	var res audit.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("verify --output json printed non-JSON: %v\n%s", err, out)
	}
	if !res.OK || len(res.Layers) != 7 { // every layer of audit.Verify, the log one included
		t.Errorf("verify: %+v", res)
	}

	// A wrong key: exit 1, the signature layer named.
	if out, _, code := gp(nil, "audit", "keygen", "--out-prefix", "other"); code != 0 {
		t.Fatal(out)
	}
	out, _, code = gp(nil, "audit", "verify", "audit-report.zip", "--key", "other.pub", "-o", "json")
	if code != ExitFindings || !strings.Contains(out, `"failed_layer": "signature"`) {
		t.Errorf("wrong key: exit %d\n%s", code, out)
	}

	// A tampered file: exit 1, text output names the file and the check.
	bad := testutil.RewriteZip(t, filepath.Join(dir, "audit-report.zip"), audit.FileHardware, func(b []byte) []byte {
		return bytes.Replace(b, []byte("1650123456780"), []byte("1650123456789"), 1)
	})
	if err := os.WriteFile(filepath.Join(dir, "bad.zip"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, code = gp(nil, "audit", "verify", "bad.zip", "--key", "release.pub")
	if code != ExitFindings || !strings.Contains(out, "hardware-inventory.json [sha256]") || !strings.Contains(out, "failed at layer manifest") {
		t.Errorf("tampered: exit %d\n%s", code, out)
	}
}

// TestAuditVerifyE2EUnpinnedAndSkipped drives `gpupass audit verify` on a
// real audit zip as an auditor would. Without --agent-key the conformance
// report is checked only against the key inside it, which whoever built the
// report chose: the layer warns "unpinned" and names the flag that pins
// (exit 0), --require-pinned makes it a failure. A report whose conformance
// report, signature and key were swapped for ones the attacker made fails
// the manifest check, and the layers that read those files are skipped,
// naming the file, where they used to print ok.
func TestAuditVerifyE2EUnpinnedAndSkipped(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := auditFixture(t)
	gp := func(args ...string) (stdout string, code int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=e2e-pw")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String() + e.String(), code
	}
	if out, code := gp("audit", "keygen", "--out-prefix", "release"); code != 0 {
		t.Fatalf("keygen: exit %d\n%s", code, out)
	}
	if out, code := gp("audit", "alloc-7f3a", "--run-file", "run.json", "--key", "release.key", "--out", "audit-report.zip", "--attest"); code != 0 {
		t.Fatalf("audit: exit %d\n%s", code, out)
	}

	// The attacker's conformance report: another GPU serial, signed by a
	// key of their own, which they put in the zip beside it.
	zipPath := filepath.Join(dir, "audit-report.zip")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var forged []byte
	swapped := testutil.RewriteZip(t, zipPath, audit.FileConformanceReport, func(b []byte) []byte {
		forged = bytes.Replace(b, []byte("1650123456780"), []byte("1650123456789"), 1)
		return forged
	})
	sig, err := conformance.Sign(key, forged)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := conformance.PublicKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{audit.FileConformanceSig: []byte(sig), audit.FileAgentKey: pub} {
		p := filepath.Join(dir, "swapped.zip")
		if err := os.WriteFile(p, swapped, 0o644); err != nil {
			t.Fatal(err)
		}
		swapped = testutil.RewriteZip(t, p, name, func([]byte) []byte { return content })
	}
	if err := os.WriteFile(filepath.Join(dir, "swapped.zip"), swapped, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		// status of each layer named; want/notWant in the text output.
		status  map[string]string
		want    []string
		notWant []string
	}{
		{
			name: "unpinned warns and names the flag", args: []string{"audit-report.zip", "--key", "release.pub"}, wantCode: 0,
			status: map[string]string{audit.LayerAgent: "warn", audit.LayerFingerprint: "ok"},
			want: []string{"warn agent-signature  unpinned:", "--agent-key agent.pub",
				"verified audit-report.zip (allocation alloc-7f3a) with warnings: unpinned"},
			notWant: []string{"ok   agent-signature"},
		},
		{
			name: "--require-pinned fails an unpinned report", args: []string{"audit-report.zip", "--key", "release.pub", "--require-pinned"}, wantCode: ExitFindings,
			status: map[string]string{audit.LayerAgent: "fail"},
			want:   []string{"FAIL agent-signature", "pinning is required: pass --agent-key", "failed at layer agent-signature"},
		},
		{
			name: "pinned is ok", args: []string{"audit-report.zip", "--key", "release.pub", "--agent-key", "agent.pub", "--require-pinned"}, wantCode: 0,
			status:  map[string]string{audit.LayerAgent: "ok"},
			want:    []string{"ok   agent-signature  conformance report signed by a pinned agent key", "verified audit-report.zip (allocation alloc-7f3a)\n"},
			notWant: []string{"warn", "unpinned"},
		},
		{
			name: "a swapped conformance report: its layers are skipped, not ok", args: []string{"swapped.zip", "--key", "release.pub"}, wantCode: ExitFindings,
			status: map[string]string{audit.LayerManifest: "fail", audit.LayerAgent: "skipped",
				audit.LayerFingerprint: "skipped", audit.LayerLog: "ok"},
			want: []string{"conformance-report.json [sha256]", "agent.pub [sha256]",
				"skip agent-signature  not checked: it reads conformance-report.json, which failed the manifest check",
				"skip fingerprint      not checked: it reads conformance-report.json", "failed at layer manifest"},
			notWant: []string{"ok   agent-signature", "ok   fingerprint "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := gp(append([]string{"audit", "verify"}, tc.args...)...)
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d\n%s", code, tc.wantCode, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
			js, _ := gp(append([]string{"audit", "verify", "-o", "json"}, tc.args...)...)
			var res audit.Result
			if err := json.Unmarshal([]byte(js), &res); err != nil {
				t.Fatalf("-o json printed non-JSON: %v\n%s", err, js)
			}
			got := map[string]string{}
			for _, l := range res.Layers {
				if _, ok := tc.status[l.Name]; ok {
					got[l.Name] = l.Status
				}
			}
			if d := cmp.Diff(tc.status, got); d != "" {
				t.Errorf("layer statuses (-want +got):\n%s\n%s", d, js)
			}
			if res.OK != (tc.wantCode == 0) {
				t.Errorf("ok %v with exit %d", res.OK, code)
			}
		})
	}
}
