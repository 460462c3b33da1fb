package agent

import (
	"context"
	"crypto/ecdsa"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
)

// linkStepNode is a cluster node whose runner takes the link step, as
// Slurm's does.
type linkStepNode struct{ Node }

func (linkStepNode) Runner() executor.Runner { return linkStepRunner{} }

type linkStepRunner struct{ executor.Runner }

func (linkStepRunner) RunsLinkStep() bool { return true }

// reportSink keeps the run reports sent to the broker.
type reportSink struct {
	WorkSource
	mu   sync.Mutex
	sent [][2]string
}

func (s *reportSink) SubmitRunReport(_ context.Context, _ *Assignment, report []byte, signature string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, [2]string{string(report), signature})
	return nil
}

func linkStepAgent(t *testing.T) *Agent {
	t.Helper()
	key, err := conformance.LoadOrCreateKey(filepath.Join(t.TempDir(), "agent.key"))
	if err != nil {
		t.Fatal(err)
	}
	return keyedAgent(t, key)
}

func keyedAgent(t *testing.T, key *ecdsa.PrivateKey) *Agent {
	t.Helper()
	pub, err := conformance.PublicKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	o := &Options{}
	o.StandFor(linkStepNode{})
	return &Agent{o: o, log: slog.New(slog.DiscardHandler), key: key, pubPEM: pub}
}

// TestFollowedRankAmendsLink (issue #34): a Slurm gang's rank whose agent
// restarted before its job's link step had a result is followed on from
// the ledger, and the step's figure still reaches the broker in the
// rank's run report, signed again, not left "not measured yet". The
// ledger keeps the report runtime-init signed; a report there under
// another key, or one whose link is measured already, is not signed
// again.
func TestFollowedRankAmendsLink(t *testing.T) {
	t.Parallel()
	ag := linkStepAgent(t)
	g := &rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.7", MasterPort: 29507}
	sp := &spec.Spec{}
	sp.Resources.Network.BandwidthGbps = 25
	pending := pendingLink(g, sp, false)
	sign := func(a *Agent, l *conformance.Link) *SignedReport {
		t.Helper()
		rep := conformance.Report{SchemaVersion: 1, AgentID: "agt-1", AllocationID: "alloc-0000ab12-r1", Simulated: true, Link: l,
			Checks: []conformance.Check{linkCheckOf(l)}}
		b, err := rep.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		sig, err := conformance.Sign(a.key, b)
		if err != nil {
			t.Fatal(err)
		}
		return &SignedReport{Report: &rep, Bytes: b, Signature: sig}
	}

	// Runtime-init signed the report, the ledger recorded the job, and
	// the agent died.
	l := &RunLoop{StateDir: t.TempDir(), JobPortMin: 29500, JobPortMax: 29599}
	a := &Assignment{AllocID: "alloc-0000ab12-r1", FencingToken: 3, Command: []string{"python3", "train_ddp.py"}, Gang: g, GangRun: "alloc-0000ab12"}
	a.linkReport = sign(ag, pending)
	e, b, _ := recordedJob(t, l, a)
	if e.Job == nil || len(e.Job.LinkReport) == 0 {
		t.Fatalf("the ledger of a cluster rank keeps no run report to amend with its link: %s", b)
	}

	// The restarted agent follows the rank on and the job's step result
	// arrives.
	sink := &reportSink{}
	again := e.assignment()
	step, err := ag.followLink(sink)(again, e.Job.LinkReport, e.Job.LinkSignature)
	if err != nil || step == nil {
		t.Fatalf("following the rank on: step %v, err %v; want the link step that amends its report", step, err)
	}
	// The job writes its result as it likes: a claim that the agent
	// measured it changes nothing.
	note, failed := step.Measured([]byte(`{"backend":"gloo","ranks":2,"seconds":0.01,"algbw_gbps":3.2,"busbw_gbps":3.2,"measured_by":"agent"}`+"\n"), nil)
	if failed != nil || !strings.Contains(note, "replaced the one sent at runtime-init") {
		t.Errorf("the step's result: %q, %v", note, failed)
	}
	if len(sink.sent) != 1 {
		t.Fatalf("%d run reports sent, want the amended one", len(sink.sent))
	}
	if err := conformance.Verify(ag.pubPEM, []byte(sink.sent[0][0]), sink.sent[0][1]); err != nil {
		t.Errorf("the amended report does not verify under the agent's key: %v", err)
	}
	got, err := conformance.Parse([]byte(sink.sent[0][0]))
	if err != nil {
		t.Fatal(err)
	}
	if got.Link == nil || got.Link.Error != "" || got.Link.BusBWGbps != 3.2 || got.Link.DeclaredGbps != 25 || !got.Link.Shortfall ||
		got.AllocationID != a.AllocID || !got.Simulated {
		t.Errorf("the amended report: link %+v, alloc %q, simulated %v; want 3.2 Gbit/s measured beside the declared 25, a shortfall, for %s, simulated",
			got.Link, got.AllocationID, got.Simulated, a.AllocID)
	}
	if c := got.Checks[0]; got.Link.MeasuredBy != conformance.LinkByJob || !strings.Contains(c.Actual, "the figure the job wrote") {
		t.Errorf("the amended report says measured_by %q, check %q; want %q, the check saying the job wrote the figure", got.Link.MeasuredBy, c.Actual, conformance.LinkByJob)
	}

	// What the ledger holds is signed again only under this agent's key,
	// and only while its link is pending.
	other := linkStepAgent(t)
	forged := sign(other, pending)
	if step, err := ag.followLink(sink)(again, forged.Bytes, forged.Signature); step != nil || err == nil {
		t.Errorf("a report signed by another key: step %v, err %v; want it refused", step, err)
	}
	tampered := strings.Replace(string(e.Job.LinkReport), `"simulated":true`, `"simulated":false`, 1)
	if step, err := ag.followLink(sink)(again, []byte(tampered), e.Job.LinkSignature); step != nil || err == nil {
		t.Errorf("a report changed in the ledger: step %v, err %v; want it refused", step, err)
	}
	done := sign(ag, &conformance.Link{Ranks: 2, Backend: "gloo", BusBWGbps: 3.2, Seconds: 0.01})
	if step, err := ag.followLink(sink)(again, done.Bytes, done.Signature); step != nil || err != nil {
		t.Errorf("a report whose link is measured: step %v, err %v; want no step", step, err)
	}
}
