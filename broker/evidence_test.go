package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
)

// runReport is the worker's signed report for a run, bound to it.
func (w *worker) runReport(t *testing.T, as *gpupassv1.Assignment, specFP string, mod func(*conformance.Report)) ([]byte, string) {
	t.Helper()
	r := w.Report()
	r.AllocationID, r.SpecFingerprint, r.RuntimeFingerprint = as.AllocId, specFP, specFP
	if mod != nil {
		mod(r)
	}
	b, sig, err := brokertest.Sign(w.Key, r)
	if err != nil {
		t.Fatal(err)
	}
	return b, sig
}

func (w *worker) submitReport(as *gpupassv1.Assignment, report []byte, sig string) (*gpupassv1.SubmitRunReportResponse, error) {
	resp, err := w.runs.Work.SubmitRunReport(context.Background(), connect.NewRequest(&gpupassv1.SubmitRunReportRequest{
		AgentId: w.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, Report: report, Signature: sig}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// TestRunEvidence: the broker takes a run's signed report only from the
// run's node under its lease, verified against the enrolled key and bound
// to the run, and serves it to a read token of the run's region once the
// run is over; a run in progress cannot be audited.
func TestRunEvidence(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			agentTok := b.Token(t, store.RoleAgent, "*")
			w := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
			w.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
			reader := dialRuns(t, b, b.Token(t, store.RoleRead, "us-west-2"))
			elsewhere := dialRuns(t, b, b.Token(t, store.RoleRead, "eu-*"))

			run := submit(t, c, "us-west-2", nil)
			as := w.poll(t, 5)
			if as == nil || as.AllocId != run.Id {
				t.Fatalf("assignment = %v", as)
			}
			if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); err != nil {
				t.Fatal(err)
			}
			evidence := func(c2 interface {
				GetRunEvidence(context.Context, *connect.Request[gpupassv1.GetRunEvidenceRequest]) (*connect.Response[gpupassv1.GetRunEvidenceResponse], error)
			}) (*gpupassv1.GetRunEvidenceResponse, error) {
				resp, err := c2.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run.Id}))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			}
			if _, err := evidence(reader.Run); brokertest.Code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "still in progress cannot be audited") ||
				strings.Contains(err.Error(), "gpupass logs") {
				t.Errorf("evidence of a starting run: err = %v, want failed_precondition saying it is in progress, naming no client's command (the CLI adds its own)", err)
			}

			otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			good, goodSig := w.runReport(t, as, run.SpecFingerprint, nil)
			refusals := []struct {
				name   string
				report func() ([]byte, string, *gpupassv1.Assignment)
				code   connect.Code
			}{
				{"signed by another key", func() ([]byte, string, *gpupassv1.Assignment) {
					sig, _ := conformance.Sign(otherKey, good)
					return good, sig, as
				}, connect.CodePermissionDenied},
				{"a changed byte", func() ([]byte, string, *gpupassv1.Assignment) {
					return []byte(strings.Replace(string(good), `"us-west-2"`, `"us-west-3"`, 1)), goodSig, as
				}, connect.CodePermissionDenied},
				{"bound to another run", func() ([]byte, string, *gpupassv1.Assignment) {
					r, s := w.runReport(t, as, run.SpecFingerprint, func(r *conformance.Report) { r.AllocationID = "alloc-00000000" })
					return r, s, as
				}, connect.CodePermissionDenied},
				{"the node's periodic report", func() ([]byte, string, *gpupassv1.Assignment) {
					r, s := w.runReport(t, as, run.SpecFingerprint, func(r *conformance.Report) { r.AllocationID, r.SpecFingerprint = "", "" })
					return r, s, as
				}, connect.CodePermissionDenied},
				{"measured against another spec", func() ([]byte, string, *gpupassv1.Assignment) {
					r, s := w.runReport(t, as, "sha256:"+strings.Repeat("0", 64), nil)
					return r, s, as
				}, connect.CodePermissionDenied},
				{"a stale fencing token", func() ([]byte, string, *gpupassv1.Assignment) {
					old := proto.Clone(as).(*gpupassv1.Assignment)
					old.FencingToken--
					return good, goodSig, old
				}, connect.CodeFailedPrecondition},
			}
			for _, r := range refusals {
				rep, sig, a := r.report()
				if _, err := w.submitReport(a, rep, sig); brokertest.Code(err) != r.code {
					t.Errorf("report %s: err = %v, want %v", r.name, err, r.code)
				}
			}
			resp, err := w.submitReport(as, good, goodSig)
			if err != nil || !resp.Passed || !resp.Match || resp.RuntimeFingerprint != run.SpecFingerprint {
				t.Fatalf("SubmitRunReport = %v, %v; want accepted, passed, matching", resp, err)
			}
			if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
				t.Fatal(err)
			}
			digest := "sha256:" + strings.Repeat("ab", 32)
			recs := []*gpupassv1.Record{
				{Seq: 1, Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT, Data: fmt.Appendf(nil,
					`{"ts":"2026-11-29T12:00:00Z","level":"INFO","component":"stdout","msg":"spoof","fields":{"bundle_digest":"sha256:%s"}}`, strings.Repeat("cd", 32))},
				{Seq: 2, Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT, Data: fmt.Appendf(nil,
					`{"ts":"2026-11-29T12:00:00Z","level":"INFO","component":"runtime.bundle","msg":"bundle pulled and verified","fields":{"digest":%q,"reference":"reg/repo@%s"}}`, digest, digest)},
			}
			if _, err := w.upload(as, recs); err != nil {
				t.Fatal(err)
			}
			if _, err := evidence(reader.Run); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("evidence of a running run: err = %v, want failed_precondition", err)
			}
			if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 2); err != nil {
				t.Fatal(err)
			}
			if _, err := w.submitReport(as, good, goodSig); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("report after the run ended: err = %v, want failed_precondition", err)
			}

			ev, err := evidence(reader.Run)
			if err != nil {
				t.Fatalf("GetRunEvidence with a read token: %v", err)
			}
			if string(ev.Report) != string(good) || ev.Signature != goodSig || ev.Run.GetId() != run.Id ||
				ev.Run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || string(ev.SpecYaml) != string(specYAML(t)) || len(ev.SpecJson) == 0 {
				t.Errorf("evidence = run %v, report equal %v, sig equal %v, spec yaml %d bytes", ev.Run, string(ev.Report) == string(good), ev.Signature == goodSig, len(ev.SpecYaml))
			}
			if err := conformance.Verify(ev.AgentPublicKeyPem, ev.Report, ev.Signature); err != nil {
				t.Errorf("the served key does not verify the served report: %v", err)
			}
			if ev.NodeLabels.GetRegion() != "us-west-2" || ev.ReportReceivedUnixNano == 0 {
				t.Errorf("node labels = %v, received %d", ev.NodeLabels, ev.ReportReceivedUnixNano)
			}
			if ev.BundleDigest != digest {
				t.Errorf("bundle digest = %q, want %q (from the agent's event, not the job's output)", ev.BundleDigest, digest)
			}
			if _, err := evidence(elsewhere.Run); brokertest.Code(err) != connect.CodePermissionDenied {
				t.Errorf("evidence with a token for eu-*: err = %v, want permission_denied (403, as README says for scope)", err)
			}

			// A run that ended before runtime-init has nothing to audit.
			run2 := submit(t, c, "us-west-2", nil)
			as2 := w.poll(t, 5)
			if as2 == nil || as2.AllocId != run2.Id {
				t.Fatalf("second assignment = %v", as2)
			}
			if _, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_FAILED, "work dir could not be created", 0); err != nil {
				t.Fatal(err)
			}
			_, err = c.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run2.Id}))
			if brokertest.Code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "failed before it started (work dir could not be created): it never ran, so there is nothing to audit") {
				t.Errorf("evidence of a run that never started: err = %v, want failed_precondition saying it never ran", err)
			}
			// A server's answer speaks the API's terms: the CLI adds
			// its command (gpupass audit's TestAuditNeverStartedE2E).
			if err != nil && strings.Contains(err.Error(), "gpupass ") {
				t.Errorf("evidence of a run that never started names a client command: %v", err)
			}
		})
	}
}
