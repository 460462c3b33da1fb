package broker_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestGangEvidence (issue #34): a run across two nodes is certified only
// when every rank's signed run report is there and measured the spec's
// fingerprint on rank 0's accelerator. A rank whose node reports another
// runtime, another accelerator, or no report at all leaves the run
// uncertified, with a reason naming the rank; GetRunEvidence serves every
// rank's signed report for the audit.
func TestGangEvidence(t *testing.T) {
	t.Parallel()
	gang := bytes.Replace(specYAML(t), []byte("count: 8"), []byte("count: 16\n  nodes: 2"), 1)
	for _, tc := range []struct {
		name string
		// rank1 changes rank 1's report; nil: it sends none.
		rank1 func(r *conformance.Report)
		// want is in the reason; "" wants the run certified.
		want string
	}{
		{"every rank matches", func(*conformance.Report) {}, ""},
		{"rank 1 runs another PyTorch", func(r *conformance.Report) {
			r.Runtime.PyTorch, r.RuntimeFingerprint = "2.2.0+cu121", "sha256:"+strings.Repeat("1", 64)
		}, "rank 1 on AGENT1: measured runtime fingerprint sha256:1111"},
		{"rank 1 has another accelerator", func(r *conformance.Report) {
			for i := range r.GPUs {
				r.GPUs[i].Class = "a100-80gb"
			}
		}, "rank 1 on AGENT1: measured accelerator 8 × a100-80gb, rank 0 measured 8 × h100-sxm5"},
		{"rank 1 sends no report", nil, "rank 1 on AGENT1 (RUN-r1): sent no signed run report"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
			agentTok := b.Token(t, store.RoleAgent, "*")
			var ws []*worker
			for i := range 2 {
				n := brokertest.H100("us-west-2", float64(20+i))
				n.JobAddress, n.JobPortMin, n.JobPortMax = "127.0.0.1", int32(29500+100*i), int32(29599+100*i)
				w := newWorker(t, b, agentTok, n)
				w.keepAlive(t)
				ws = append(ws, w)
			}
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
			run := submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) { r.SpecYaml = gang })
			byRank := map[string]*gpupassv1.Assignment{}
			owner := map[string]*worker{}
			for _, w := range ws {
				as := w.poll(t, 5)
				if as == nil {
					t.Fatalf("%s got no rank of the gang", w.ID)
				}
				byRank[as.AllocId], owner[as.AllocId] = as, w
			}
			r0, r1 := byRank[run.Id], byRank[run.Id+"-r1"]
			if r0 == nil || r1 == nil {
				t.Fatalf("assignments %v: want %s and %s-r1", byRank, run.Id, run.Id)
			}
			for _, as := range []*gpupassv1.Assignment{r0, r1} {
				w := owner[as.AllocId]
				if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); err != nil {
					t.Fatal(err)
				}
				var mod func(*conformance.Report)
				if as == r1 {
					if tc.rank1 == nil {
						continue
					}
					mod = tc.rank1
				}
				rep, sig := w.runReport(t, as, run.SpecFingerprint, mod)
				if _, err := w.submitReport(as, rep, sig); err != nil {
					t.Fatalf("rank report of %s: %v", as.AllocId, err)
				}
			}
			for _, as := range []*gpupassv1.Assignment{r1, r0} {
				if _, err := owner[as.AllocId].update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 0); err != nil {
					t.Fatal(err)
				}
			}
			waitRun(t, c, run.Id, "succeeded", func(r *gpupassv1.Run) bool { return r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED })
			resp, err := dialRuns(t, b, b.Token(t, store.RoleRead, "us-west-2")).Run.GetRunEvidence(ctx,
				connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run.Id}))
			if err != nil {
				t.Fatalf("GetRunEvidence: %v", err)
			}
			ev := resp.Msg
			want := strings.NewReplacer("AGENT1", owner[r1.AllocId].ID, "RUN", run.Id).Replace(tc.want)
			t.Logf("certified %v: %s", ev.Certified, ev.UncertifiedReason)
			if tc.want == "" {
				if !ev.Certified || ev.UncertifiedReason != "" {
					t.Errorf("certified %v (%s), want certified", ev.Certified, ev.UncertifiedReason)
				}
			} else if ev.Certified || !strings.Contains(ev.UncertifiedReason, want) {
				t.Errorf("certified %v (%s), want uncertified: %s", ev.Certified, ev.UncertifiedReason, want)
			}
			if tc.rank1 == nil {
				if len(ev.Ranks) != 0 {
					t.Errorf("%d rank reports served, want none", len(ev.Ranks))
				}
				return
			}
			if len(ev.Ranks) != 1 || ev.Ranks[0].Rank != 1 || ev.Ranks[0].AllocId != r1.AllocId || ev.Ranks[0].NodeId != owner[r1.AllocId].ID {
				t.Fatalf("rank reports %v, want rank 1's", ev.Ranks)
			}
			if err := conformance.Verify(ev.Ranks[0].AgentPublicKeyPem, ev.Ranks[0].Report, ev.Ranks[0].Signature); err != nil {
				t.Errorf("rank 1's served report does not verify against its served key: %v", err)
			}
		})
	}
}

// TestRequireBandwidthOneNode: --require-bandwidth asks for the link
// between a gang's nodes to be measured; a spec on one node has none, so
// the broker refuses the request rather than let the flag promise a
// check that never runs.
func TestRequireBandwidthOneNode(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
	_, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2",
		Command: []string{"python3", "train.py"}, RequireBandwidth: true}))
	if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "this spec runs on one node, which has no link between nodes to measure") {
		t.Errorf("submit of a one-node spec with require_bandwidth: %v, want invalid_argument saying there is no link to measure", err)
	}
}
