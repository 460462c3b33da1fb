//go:build e2e

package gpupass

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
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
