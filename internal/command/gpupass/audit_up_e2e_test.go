//go:build e2e

package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/auditrun"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestUpTrainAudit is the auditor's path end to end: `gpupass up`, the
// PyTorch example trained on a simulated node, `gpupass audit ALLOC`
// refused while the run is in progress and built from the broker alone
// once it is over, `gpupass audit verify` passing every layer (the
// fingerprint one too: the agent signed a report for this run against its
// spec), each file tampered in turn named with its layer, and the stock
// cosign CLI verifying both signatures.
func TestUpTrainAudit(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// gp returns stdout (what --output json must keep pure) and the
	// whole output, stderr included.
	gp2 := func(args ...string) (stdout, all string, code int) {
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(cmd.Env, "COSIGN_PASSWORD=e2e-audit")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("gpupass %v: %v", args, err)
		}
		return o.String(), o.String() + e.String(), code
	}
	gp := func(args ...string) (string, int) {
		_, all, code := gp2(args...)
		return all, code
	}

	var trainOut upstack.Buffer
	train := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2",
		"--workdir", "examples/train", "--name", "audit-e2e", "--follow", "--", py, "train.py", "--steps", "40", "--sleep", "0.1")
	train.Stdout, train.Stderr = &trainOut, &trainOut
	if err := train.Start(); err != nil {
		t.Fatal(err)
	}
	var run *gpupassv1.Run
	upstack.WaitFor(t, ctx, "the run in the broker", func() bool {
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil || len(resp.Msg.Runs) == 0 {
			return false
		}
		run = resp.Msg.Runs[0]
		return true
	})
	if out, code := gp("audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign")); code != 0 {
		t.Fatalf("keygen: exit %d\n%s", code, out)
	}
	zipPath := filepath.Join(dir, "audit-report.zip")
	// 40 steps at 0.1 s: the run is still going.
	out, code := gp("audit", run.Id, "--key", filepath.Join(dir, "cosign.key"), "--out", zipPath)
	if code != ExitFindings || !strings.Contains(out, "still in progress") {
		t.Errorf("audit of a run in progress: exit %d, want 1 saying so:\n%s", code, out)
	}
	if err := train.Wait(); err != nil {
		t.Fatalf("train: %v\n%s", err, upstack.Tail(trainOut.String(), 4000))
	}

	out, all, code := gp2("audit", run.Id, "--key", filepath.Join(dir, "cosign.key"), "--out", zipPath, "-o", "json")
	if code != 0 {
		t.Fatalf("audit: exit %d\n%s", code, all)
	}
	if !strings.Contains(all, "SIMULATED") {
		t.Errorf("the audit of a simulated run does not say so loudly:\n%s", all)
	}
	var res auditrun.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("audit -o json printed non-JSON: %v\n%s", err, out)
	}
	if !res.Match || !res.Simulated || res.AllocationID != run.Id {
		t.Errorf("audit = %+v, want the run's fingerprints to match on the matching simulated node", res)
	}
	// The agent key to pin comes from the broker's registry, like the rest.
	ev, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run.Id}))
	if err != nil {
		t.Fatal(err)
	}
	agentPub := filepath.Join(dir, "agent.pub")
	if err := os.WriteFile(agentPub, ev.Msg.AgentPublicKeyPem, 0o644); err != nil {
		t.Fatal(err)
	}
	extract := filepath.Join(dir, "x")
	out, code = gp("audit", "verify", zipPath, "--key", filepath.Join(dir, "cosign.pub"), "--agent-key", agentPub, "--extract", extract)
	if code != 0 {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	for _, want := range []string{"ok   signature", "ok   manifest", "ok   agent-signature", "ok   fingerprint", "recomputed from the declared spec", "ok   log", "verified " + zipPath} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	// train sends the spec's canonical JSON as the spec; the audit still
	// holds the file as the user wrote it, comments and all.
	written, err := os.ReadFile(filepath.Join(stack.Root, "examples/train/gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var env audit.Environment
	if b, err := os.ReadFile(filepath.Join(extract, audit.FileEnvironment)); err != nil || json.Unmarshal(b, &env) != nil {
		t.Fatalf("environment: %v", err)
	}
	if env.Declared.File != "gpupass.yaml" || env.Declared.Source != string(written) || env.Declared.Fingerprint != run.SpecFingerprint {
		t.Errorf("the audit's declared spec is %s (fingerprint %s, run's %s):\n%s\nwant the file as written:\n%s",
			env.Declared.File, env.Declared.Fingerprint, run.SpecFingerprint, env.Declared.Source, written)
	}
	var sum audit.RunSummary
	if b, err := os.ReadFile(filepath.Join(extract, audit.FileRunSummary)); err != nil || json.Unmarshal(b, &sum) != nil {
		t.Fatalf("run summary: %v", err)
	}
	if sum.State != "succeeded" || len(sum.Metrics) == 0 {
		t.Errorf("run summary = %+v", sum)
	}

	// Each file changed in turn: verify fails and names the file and layer.
	tamper := []struct{ file, layer string }{
		{audit.FileEnvironment, audit.LayerManifest},
		{audit.FileConformanceReport, audit.LayerManifest},
		{audit.FileConformanceSig, audit.LayerManifest},
		{audit.FileAgentKey, audit.LayerManifest},
		{audit.FileConformanceLog, audit.LayerManifest},
		{audit.FileHardware, audit.LayerManifest},
		{audit.FileRunSummary, audit.LayerManifest},
		{audit.FileManifest, audit.LayerSignature},
		{audit.FileManifestBundle, audit.LayerSignature},
	}
	for _, tc := range tamper {
		bad := testutil.RewriteZip(t, zipPath, tc.file, func(b []byte) []byte {
			c := bytes.Clone(b)
			c[len(c)/2] ^= 0x01
			return c
		})
		p := filepath.Join(dir, "tampered-"+tc.file+".zip")
		if err := os.WriteFile(p, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		out, _, code := gp2("audit", "verify", p, "--key", filepath.Join(dir, "cosign.pub"), "--agent-key", agentPub, "-o", "json")
		var vr audit.Result
		if err := json.Unmarshal([]byte(out), &vr); err != nil {
			t.Fatalf("%s: verify -o json printed non-JSON: %v\n%s", tc.file, err, out)
		}
		named := false
		for _, l := range vr.Layers {
			for _, pr := range l.Problems {
				named = named || (l.Name == tc.layer && (pr.File == tc.file || strings.Contains(pr.Message, tc.file)))
			}
		}
		if code != ExitFindings || vr.OK || vr.FailedLayer != tc.layer || !named {
			t.Errorf("%s changed: exit %d, failed layer %q (want %q), file named %v\n%s", tc.file, code, vr.FailedLayer, tc.layer, named, out)
		}
	}

	// The stock cosign CLI verifies the manifest bundle and the agent's
	// signature over the run's report.
	cosign := testutil.Tool(t, "cosign")
	if err := os.WriteFile(filepath.Join(extract, "trusted-root.json"), []byte(audit.MinimalTrustedRoot), 0o644); err != nil {
		t.Fatal(err)
	}
	cosignRun := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cosign, args...)
		cmd.Dir = extract
		cmd.Env = append(os.Environ(), "TUF_ROOT="+filepath.Join(dir, "tuf"), "HOME="+dir, "SIGSTORE_NO_CACHE=true")
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	if out, err := cosignRun("verify-blob", "--key", filepath.Join(dir, "cosign.pub"), "--bundle", audit.FileManifestBundle,
		"--trusted-root", "trusted-root.json", "--insecure-ignore-tlog", audit.FileManifest); err != nil || !strings.Contains(out, "Verified OK") {
		t.Errorf("cosign verify-blob of the manifest: %v\n%s", err, out)
	}
	if out, err := cosignRun("verify-blob", "--key", agentPub, "--signature", audit.FileConformanceSig,
		"--insecure-ignore-tlog", audit.FileConformanceReport); err != nil || !strings.Contains(out, "Verified OK") {
		t.Errorf("cosign verify-blob of the run's signed report: %v\n%s", err, out)
	}
}
