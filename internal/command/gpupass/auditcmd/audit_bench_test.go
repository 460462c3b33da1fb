package auditcmd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkAuditFromBroker measures the whole audit of a finished run
// with 100,000 metric points (25,000 steps × 4 series) as `gpupass audit`
// does it, minus the key decryption: GetRunEvidence + GetMetrics from a
// real broker on SQLite, build, sign, then verify every layer.
func BenchmarkAuditFromBroker(b *testing.B) {
	ctx := context.Background()
	br := brokertest.Start(b, brokertest.NewDB(b, "sqlite"), brokertest.Fast())
	agentTok := br.Token(b, store.RoleAgent, "*")
	ag := brokertest.Register(b, br.URL, agentTok, brokertest.H100("us-west-2", 20))
	work, err := client.DialRuns(br.URL, client.Options{Token: agentTok, GRPC: true, Agent: ag.Creds})
	if err != nil {
		b.Fatal(err)
	}
	sub, err := client.DialRuns(br.URL, client.Options{Token: br.Token(b, store.RoleSubmit, "*")})
	if err != nil {
		b.Fatal(err)
	}
	specYAML, err := os.ReadFile(filepath.Join(testutil.RepoRoot(b), "broker", "testdata", "h100.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		Spec: &gpupassv1.SubmitRequest_SpecYaml{SpecYaml: specYAML}, Region: "us-west-2", Command: []string{"train"}}))
	if err != nil {
		b.Fatal(err)
	}
	run := resp.Msg.Run
	pw, err := work.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: ag.ID, WaitSeconds: 5}))
	if err != nil || pw.Msg.Assignment == nil {
		b.Fatalf("PollWork: %v", err)
	}
	as := pw.Msg.Assignment
	update := func(st gpupassv1.AllocState, last uint64) {
		if _, err := work.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: ag.ID, AllocId: as.AllocId,
			FencingToken: as.FencingToken, State: st, Attempts: 1, LastSeq: last})); err != nil {
			b.Fatal(err)
		}
	}
	update(gpupassv1.AllocState_ALLOC_STATE_STARTING, 0)
	rep := ag.Report()
	rep.AllocationID, rep.SpecFingerprint, rep.RuntimeFingerprint = run.Id, run.SpecFingerprint, run.SpecFingerprint
	rb, sig, err := brokertest.Sign(ag.Key, rep)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := work.Work.SubmitRunReport(ctx, connect.NewRequest(&gpupassv1.SubmitRunReportRequest{AgentId: ag.ID, AllocId: as.AllocId,
		FencingToken: as.FencingToken, Report: rb, Signature: sig})); err != nil {
		b.Fatal(err)
	}
	update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, 0)
	const steps = 25_000
	for from := 1; from <= steps; from += 5000 {
		var recs []*gpupassv1.Record
		for s := from; s < from+5000; s++ {
			recs = append(recs, &gpupassv1.Record{Seq: uint64(s), Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC, Data: fmt.Appendf(nil,
				`{"step":%d,"ts":"2026-11-29T12:00:00Z","attempt":1,"values":{"loss":%g,"lr":0.001,"grad_norm":%g,"tokens_per_s":41000}}`, s, 1/float64(s), 2/float64(s))})
		}
		if _, err := work.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: ag.ID, AllocId: as.AllocId,
			FencingToken: as.FencingToken, Records: recs})); err != nil {
			b.Fatal(err)
		}
	}
	update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, steps)

	kb, err := os.ReadFile(filepath.Join(testutil.RepoRoot(b), "internal", "audit", "testdata", "cosign.key"))
	if err != nil {
		b.Fatal(err)
	}
	key, err := audit.LoadPrivateKey(audit.KeyRef("env://K"), []byte("gpupass-test"), func(string) string { return string(kb) }, nil)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := audit.NewKeySigner(key, "")
	if err != nil {
		b.Fatal(err)
	}
	pub, _, err := audit.LoadPublicKey(audit.KeyRef(filepath.Join(testutil.RepoRoot(b), "internal", "audit", "testdata", "cosign.pub")), os.Getenv)
	if err != nil {
		b.Fatal(err)
	}
	src := &BrokerRuns{Broker: &gpupass.BrokerFlags{URL: br.URL, Token: br.Token(b, store.RoleRead, "us-west-2")}}
	for b.Loop() {
		r, err := src.Run(ctx, run.Id)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Metrics) != 4*steps {
			b.Fatalf("%d metric points, want %d", len(r.Metrics), 4*steps)
		}
		out, err := audit.Build(ctx, r, audit.BuildOptions{Signer: signer, Version: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		if res := audit.Verify(ctx, out.Zip, audit.VerifyOptions{Key: pub, Fingerprint: declaredFingerprint}); !res.OK {
			b.Fatalf("verify failed at %s: %+v", res.FailedLayer, res.Layers)
		}
	}
}
