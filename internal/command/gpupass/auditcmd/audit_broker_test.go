package auditcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
)

// TestAuditFromBroker audits a run from the broker alone: an API-level
// agent signs its run report under the lease, the audit of the running
// run is refused through the broker, and once the run is over the zip is
// built from GetRunEvidence + GetMetrics with a read token and verifies
// on every layer, the fingerprint one included.
func TestAuditFromBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, getenv := auditFixture(t)
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	l := brokertest.StartRun(t, b, "us-west-2")
	run, ag := l.Run, l.Agent
	var recs []*gpupassv1.Record
	for step := 1; step <= 20; step++ {
		recs = append(recs, brokertest.MetricRecord(uint64(step), step, fmt.Sprintf(`"loss":%g`, 4.0/float64(step))))
	}
	if _, err := l.Upload(recs...); err != nil {
		t.Fatal(err)
	}

	zipPath := filepath.Join(dir, "broker-audit.zip")
	reader := gpupass.BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2")}
	opts := AuditOptions{AllocationID: run.Id, Out: zipPath, Key: filepath.Join(dir, "cosign.key"), Broker: reader, Getenv: getenv, Output: "json"}
	var out bytes.Buffer
	err := RunAudit(ctx, opts, &out)
	if gpupass.ExitCode(err) != gpupass.ExitFindings || !strings.Contains(fmt.Sprint(err), "still in progress") || !strings.Contains(fmt.Sprint(err), "running") ||
		!strings.Contains(fmt.Sprint(err), "(gpupass logs "+run.Id+" --follow waits for it)") {
		t.Fatalf("audit of a running run: exit %d, %v; want exit 1 saying it is still in progress and how to wait for it", gpupass.ExitCode(err), err)
	}
	if _, err := os.Stat(zipPath); err == nil {
		t.Fatal("an audit zip was written for a run in progress")
	}

	l.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 20)
	if err := RunAudit(ctx, opts, &out); err != nil {
		t.Fatalf("audit from the broker: %v", err)
	}
	var res AuditResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("audit --output json: %v\n%s", err, out.String())
	}
	if !res.Match || !res.Simulated || res.AllocationID != run.Id {
		t.Errorf("audit result = %+v, want a simulated run whose fingerprints match", res)
	}

	pubPEM, err := conformance.PublicKeyPEM(ag.Key)
	if err != nil {
		t.Fatal(err)
	}
	agentPub := filepath.Join(dir, "node.pub")
	if err := os.WriteFile(agentPub, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var vout bytes.Buffer
	if err := RunAuditVerify(ctx, AuditVerifyOptions{Path: zipPath, Key: filepath.Join(dir, "cosign.pub"), AgentKeys: []string{agentPub},
		Extract: filepath.Join(dir, "x"), Getenv: getenv}, &vout); err != nil {
		t.Fatalf("verify: %v\n%s", err, vout.String())
	}
	for _, want := range []string{"ok   agent-signature  conformance report signed by a pinned agent key", "ok   fingerprint", "(recomputed from the declared spec)", "ok   log"} {
		if !strings.Contains(vout.String(), want) {
			t.Errorf("verify output lacks %q:\n%s", want, vout.String())
		}
	}
	var sum audit.RunSummary
	if err := json.Unmarshal(mustReadFile(t, filepath.Join(dir, "x", audit.FileRunSummary)), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.State != "succeeded" || len(sum.Metrics) != 1 || sum.Metrics[0].Count != 20 || sum.Metrics[0].Last != 0.2 {
		t.Errorf("run summary = %+v", sum)
	}
	var env audit.Environment
	if err := json.Unmarshal(mustReadFile(t, filepath.Join(dir, "x", audit.FileEnvironment)), &env); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(l.SpecYAML), env.Declared.Source); diff != "" {
		t.Errorf("declared spec is not the one submitted (-want +got):\n%s", diff)
	}
	var hw audit.Hardware
	if err := json.Unmarshal(mustReadFile(t, filepath.Join(dir, "x", audit.FileHardware)), &hw); err != nil {
		t.Fatal(err)
	}
	if len(hw.GPUs) != 8 || hw.NodeID != ag.ID || hw.Node.Provider != "lambda" || hw.Node.Region != "us-west-2" {
		t.Errorf("hardware inventory = %d GPUs, node %q %+v", len(hw.GPUs), hw.NodeID, hw.Node)
	}

	// A read token for another region is refused: 403, as for every scope.
	opts.Broker = gpupass.BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "eu-*")}
	if err := RunAudit(ctx, opts, &bytes.Buffer{}); gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(fmt.Sprint(err), "403 permission_denied") {
		t.Errorf("audit with a token for eu-*: exit %d, %v; want exit 2, 403", gpupass.ExitCode(err), err)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The broker's copy of a spec submitted as JSON is read as the agent reads
// it (spec.Decode): a key this audit does not know is refused, not
// dropped, so the audit never vouches for a spec it read only in part.
func TestEvidenceSpecJSONReadAsTheAgentReads(t *testing.T) {
	t.Parallel()
	const wire = `{"name":"x","runtime":{"cuda":"12.1"}}`
	sp, err := spec.Decode([]byte(wire))
	if err != nil {
		t.Fatal(err)
	}
	fp, err := spec.Fingerprint(sp)
	if err != nil {
		t.Fatal(err)
	}
	ev := &gpupassv1.GetRunEvidenceResponse{Run: &gpupassv1.Run{Id: "alloc-1", SpecFingerprint: fp},
		SpecJson: []byte(`{"name":"x","runtime":{"cuda":"12.1"},"security":{"sandbox":"strict"}}`)}
	_, err = evidenceRun(ev, nil)
	if err == nil || !strings.Contains(err.Error(), "the broker's copy of the spec") || !strings.Contains(err.Error(), `unknown field "sandbox"`) {
		t.Fatalf("evidence whose spec has a key this audit does not know: %v, want it refused naming the key", err)
	}
}
