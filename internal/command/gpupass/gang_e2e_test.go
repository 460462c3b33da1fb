//go:build e2e

package gpupass_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2EGangDryRun (#34) drives the built binaries as a user would:
// `gpupass up` with one simulated 4-GPU a100 agent per region, one more
// agent in us-west-2 and a slower one (10 Gbit/s) in eu-central-1. A
// spec of 8 GPUs on 2 nodes at 25 Gbit/s: `validate --dry-run` shows the
// us-west-2 gang and says why eu-central-1 has none, and `train` is
// refused with what to do, leaving no run.
func TestE2EGangDryRun(t *testing.T) {
	t.Parallel()
	s := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2", "eu-central-1"}})
	s.StartAgent(t, "usw-extra", "us-west-2")
	s.StartAgent(t, "euc-slow", "eu-central-1", "--bandwidth-gbps", "10")

	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "  count: 1\n") {
		t.Fatal("examples/train/gpupass.yaml has no `count: 1` line")
	}
	spec := filepath.Join(t.TempDir(), "gpupass.yaml")
	if err := os.WriteFile(spec, []byte(strings.Replace(string(b), "  count: 1\n", "  count: 8\n  nodes: 2\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The extra agents certify within seconds of starting.
	wantGang := "2 × "
	wantMiss := "no gang in eu-central-1: 2 certified a100-80gb nodes, but only 1 has ≥ 25 Gbit/s (a gang needs 2)"
	var out string
	for {
		o, err := s.Command(ctx, "validate", "--spec", spec, "--dry-run").CombinedOutput()
		out = string(o)
		if err == nil && strings.Contains(out, wantGang) && strings.Contains(out, " in us-west-2 (4 × a100-80gb each)") && strings.Contains(out, wantMiss) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("validate --dry-run never showed the us-west-2 gang and %q (%v):\n%s", wantMiss, err, out)
		}
		time.Sleep(time.Second)
	}
	t.Logf("dry-run:\n%s", out)

	o, err := s.Command(ctx, "train", "--spec", spec, "--region", "us-west-2", "--no-workdir", "--", "true").CombinedOutput()
	if err == nil {
		t.Fatalf("train of a 2-node spec succeeded:\n%s", o)
	}
	for _, want := range []string{"resources.nodes is 2", "runs across several nodes are not placed yet", "gpupass validate --dry-run"} {
		if !strings.Contains(string(o), want) {
			t.Errorf("train's refusal lacks %q:\n%s", want, o)
		}
	}
	o, err = s.Command(ctx, "runs").CombinedOutput()
	if err != nil || strings.Contains(string(o), "us-west-2") {
		t.Errorf("runs after the refusal (%v), want none:\n%s", err, o)
	}
}
