package agent

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestCosignVerifiesReport: the real cosign CLI verifies the signature
// the agent writes next to its report, and refuses it after one byte of
// the report changes.
func TestCosignVerifiesReport(t *testing.T) {
	t.Parallel()
	cosign := testutil.Tool(t, "cosign")
	o := simOptions(t, "h100-sxm5-8x")
	a, err := New(o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	// The report files are written once the agent has an id, as after
	// enrollment.
	a.agentID = "agt-cosign-test"
	if _, err := a.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := o.StateDir
	pub, report, sig := filepath.Join(dir, PublicKeyFile), filepath.Join(dir, ReportFile), filepath.Join(dir, SigFile)
	verify := func(blob string) ([]byte, error) {
		cmd := exec.Command(cosign, "verify-blob", "--key", pub, "--signature", sig, "--insecure-ignore-tlog", blob)
		// An empty TUF root: cosign must not reach for the network.
		cmd.Env = append(os.Environ(), "TUF_ROOT="+t.TempDir(), "SIGSTORE_NO_CACHE=true")
		return cmd.CombinedOutput()
	}
	if out, err := verify(report); err != nil {
		t.Fatalf("cosign verify-blob of the agent's report failed: %v\n%s", err, out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, len(b) / 2, len(b) - 1} {
		changed := bytes.Clone(b)
		changed[i] ^= 0x01
		p := filepath.Join(t.TempDir(), "report.json")
		if err := os.WriteFile(p, changed, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := verify(p); err == nil {
			t.Errorf("cosign verified the report with byte %d changed:\n%s", i, out)
		}
	}
}
