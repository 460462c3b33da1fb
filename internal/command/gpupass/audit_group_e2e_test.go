//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #35, "audit accepts a group id", on the built binaries against
// `gpupass up`: a detached two-region train; `gpupass audit GROUP` while
// the runs go on writes nothing and names gpupass wait GROUP; after
// `gpupass wait GROUP` it writes one signed zip per run, named by region,
// into --out DIR (audit-GROUP/ without --out); `gpupass audit verify DIR`
// with the agents' keys pinned verifies both, each zip verifies alone,
// and a zip tampered with in DIR fails the directory, named.
func TestE2EAuditGroup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Env: []string{"PATH=" + upstack.BuildAll(t) + ":" + os.Getenv("PATH"), "COSIGN_PASSWORD=e2e-audit-group"}})
	dir := t.TempDir()
	key, pub := filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
	if _, errOut, code := gp(t, ctx, stack, "audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign")); code != 0 {
		t.Fatalf("keygen: exit %d\n%s", code, errOut)
	}

	job := `i=1; while [ $i -le 12 ]; do echo "step $i loss 0.$((100-i))"; i=$((i+1)); sleep 1; done`
	stdout, stderr, code := gp(t, ctx, stack, "train", "--detach", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2,eu-central-1", "--name", "auditgroup", "--", "sh", "-c", job)
	m := regexp.MustCompile(`(?m)with: gpupass wait (group-[0-9a-f]{16})$`).FindStringSubmatch(stderr)
	if code != 0 || m == nil {
		t.Fatalf("train --detach: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	group := m[1]
	out := filepath.Join(dir, "reports")

	// The runs still run: refused, nothing written, the wait named.
	stdout, stderr, code = gp(t, ctx, stack, "audit", group, "--key", key, "--out", out)
	if code != gpupass.ExitFindings || !strings.Contains(stderr, "have not ended") || !strings.Contains(stderr, "gpupass wait "+group) {
		t.Fatalf("audit of a running group: exit %d, want 1 naming gpupass wait %s\nstdout:\n%s\nstderr:\n%s", code, group, stdout, stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("audit of a running group created its directory")
	}
	if stdout, stderr, code := gp(t, ctx, stack, "wait", group); code != 0 {
		t.Fatalf("wait %s: exit %d\n%s\n%s", group, code, stdout, stderr)
	}

	stdout, stderr, code = gp(t, ctx, stack, "audit", group, "--key", key, "--out", out, "-o", "json")
	var zips []struct {
		Path, Region   string
		AllocationID   string `json:"allocation_id"`
		ManifestSHA256 string `json:"manifest_sha256"`
	}
	if err := json.Unmarshal([]byte(stdout), &zips); code != 0 || err != nil || len(zips) != 2 {
		t.Fatalf("audit %s --out %s -o json: exit %d, %v\nstdout:\n%s\nstderr:\n%s", group, out, code, err, stdout, stderr)
	}
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	verify := []string{"audit", "verify", out, "--key", pub, "--require-pinned"}
	for _, z := range zips {
		if z.Path != filepath.Join(out, "audit-"+z.Region+".zip") || len(z.ManifestSHA256) != 64 {
			t.Errorf("zip %+v, want %s/audit-%s.zip with its digest", z, out, z.Region)
		}
		// The node's key to pin, from the broker's registry.
		ev, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: z.AllocationID}))
		if err != nil {
			t.Fatal(err)
		}
		agentPub := filepath.Join(dir, z.Region+".pub")
		if err := os.WriteFile(agentPub, ev.Msg.AgentPublicKeyPem, 0o644); err != nil {
			t.Fatal(err)
		}
		verify = append(verify, "--agent-key", agentPub)
	}
	stdout, stderr, code = gp(t, ctx, stack, verify...)
	if code != 0 || !strings.HasSuffix(stdout, "\nverified all 2 audit reports\nrun group "+group+": every audited run has its report here (2 of 2 runs)\n") {
		t.Fatalf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", verify, code, stdout, stderr)
	}
	for _, z := range zips {
		// Each alone, as a per-run audit's zip verifies.
		one := append([]string{"audit", "verify", z.Path}, verify[3:]...)
		stdout, stderr, code := gp(t, ctx, stack, one...)
		if code != 0 || !strings.Contains(stdout, "verified "+z.Path+" (allocation "+z.AllocationID+")\none of the 2 runs of run group "+group+": ") {
			t.Errorf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", one, code, stdout, stderr)
		}
	}

	// A zip in the directory tampered with: the directory fails, naming it.
	bad := zips[1].Path
	if err := os.WriteFile(bad, testutil.RewriteZip(t, bad, audit.FileRunSummary, func(b []byte) []byte {
		c := bytes.Clone(b)
		c[len(c)/2] ^= 0x01
		return c
	}), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = gp(t, ctx, stack, verify...)
	if code != gpupass.ExitFindings || !strings.Contains(stdout+stderr, "1 of 2 audit reports failed: "+bad+" (layer manifest)") ||
		!strings.Contains(stdout, "verified "+zips[0].Path+" (allocation ") {
		t.Errorf("verify of %s with %s tampered: exit %d, want 1 naming it\nstdout:\n%s\nstderr:\n%s", out, bad, code, stdout, stderr)
	}

	// Without --out: audit-GROUP/ where it runs; text names each zip, its
	// run, region and digest.
	cmd := stack.Command(ctx, "audit", group, "--key", key)
	cmd.Dir = t.TempDir()
	stdout, stderr, code = testutil.Run(t, cmd)
	for _, z := range zips {
		line := "wrote audit-" + group + "/audit-" + z.Region + ".zip: run " + z.AllocationID + " in " + z.Region + ", "
		if code != 0 || !strings.Contains(stdout, line) {
			t.Errorf("audit %s without --out: exit %d, want %q\nstdout:\n%s\nstderr:\n%s", group, code, line, stdout, stderr)
		}
		if _, err := os.Stat(filepath.Join(cmd.Dir, "audit-"+group, "audit-"+z.Region+".zip")); err != nil {
			t.Error(err)
		}
	}
}
