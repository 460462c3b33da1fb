package auditcmd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/spec"
)

// BrokerRuns is the audit's Source over the broker: the run, its declared
// spec and the agent's signed run report (GetRunEvidence) and its metric
// series (GetMetrics). Nothing is read from any agent's disk, so a read
// token for the run's region is all an auditor needs.
type BrokerRuns struct {
	Broker *gpupass.BrokerFlags
}

// Run implements audit.Source.
func (s *BrokerRuns) Run(ctx context.Context, allocID string) (*audit.Run, error) {
	c, err := s.Broker.DialRuns()
	if err != nil {
		return nil, err
	}
	er, err := c.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: allocID}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// Still in progress, or no run report: the run itself is
			// the problem (a finding), not how the command was called.
			gr, gerr := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: allocID}))
			if gerr == nil && !runview.Terminal(gr.Msg.Run.GetState()) {
				return nil, fmt.Errorf("allocation %s: %w (state %s): audit it after it finishes (gpupass logs %s --follow waits for it)", allocID, audit.ErrInProgress, runview.State(gr.Msg.Run.GetState()), allocID)
			}
			if gerr == nil && gr.Msg.Run.GetStartedUnixNano() == 0 {
				// Ended before it started: nothing ran, so no proof is
				// missing; auditing it is the wrong request (exit 2).
				// The CLI names its command that lists runs to audit.
				return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%w; gpupass runs lists the runs", gpupass.RPCError("auditing "+allocID, s.Broker.URL, err))}
			}
			return nil, gpupass.Findings(gpupass.RPCError("auditing "+allocID, s.Broker.URL, err))
		}
		return nil, gpupass.RPCError("reading the evidence of "+allocID, s.Broker.URL, err)
	}
	ev := er.Msg
	mr, err := c.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if err != nil {
		return nil, gpupass.RPCError("reading metrics of "+allocID, s.Broker.URL, err)
	}
	return evidenceRun(ev, mr.Msg.Points)
}

// evidenceRun turns the broker's evidence into the audit's run record.
func evidenceRun(ev *gpupassv1.GetRunEvidenceResponse, points []*gpupassv1.MetricPoint) (*audit.Run, error) {
	run := ev.GetRun()
	var (
		sp        *spec.Spec
		file, src string
	)
	switch {
	case len(ev.SpecYaml) > 0:
		file, src = "gpupass.yaml", string(ev.SpecYaml)
		doc, _ := spec.Parse(file, ev.SpecYaml)
		if doc == nil {
			return nil, fmt.Errorf("allocation %s: the broker's copy of the spec does not parse", run.GetId())
		}
		sp = &doc.Spec
	default:
		// The spec's wire form, read as the agent that ran it read it.
		file, src = "spec.json", string(ev.SpecJson)
		var err error
		if sp, err = spec.Decode(ev.SpecJson); err != nil {
			return nil, fmt.Errorf("allocation %s: the broker's copy of the spec: %w", run.GetId(), err)
		}
	}
	fp, err := spec.Fingerprint(sp)
	if err != nil {
		return nil, fmt.Errorf("allocation %s: fingerprint of the declared spec: %w", run.GetId(), err)
	}
	if fp != run.GetSpecFingerprint() {
		return nil, fmt.Errorf("allocation %s: the declared spec's fingerprint is %s but the broker recorded %s: the run record is inconsistent", run.GetId(), fp, run.GetSpecFingerprint())
	}
	rep, err := conformance.Parse(ev.Report)
	if err != nil {
		return nil, fmt.Errorf("allocation %s: %w", run.GetId(), err)
	}
	// The inventory is the signed report's (GPUs as measured, node as the
	// agent declared it); the broker's enrolled labels fill what it left out.
	hw := &audit.Hardware{GPUs: rep.GPUs, Node: rep.Node, NodeID: run.GetNodeId()}
	if l := ev.GetNodeLabels(); l != nil {
		if hw.Node.Provider == "" {
			hw.Node.Provider = l.Provider
		}
		if hw.Node.Zone == "" {
			hw.Node.Zone = l.Zone
		}
		if hw.Node.Hostname == "" {
			hw.Node.Hostname = l.Hostname
		}
	}
	var pts []audit.MetricPoint
	for _, p := range points {
		keys := make([]string, 0, len(p.Values))
		for k := range p.Values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			pts = append(pts, audit.MetricPoint{Name: k, Step: p.Step, Value: p.Values[k], Time: time.Unix(0, p.TimeUnixNano).UTC()})
		}
	}
	state := runview.State(run.GetState())
	// A run that failed at runtime-init never started its command; its
	// span is from submission to the end.
	started := run.GetStartedUnixNano()
	if started == 0 {
		started = run.GetCreatedUnixNano()
	}
	var ranks []audit.RankEvidence
	for _, x := range ev.GetRanks() {
		ranks = append(ranks, audit.RankEvidence{Rank: int(x.Rank), AllocationID: x.AllocId, NodeID: x.NodeId,
			Evidence: audit.Evidence{Report: x.Report, Signature: x.Signature, AgentPublicKeyPEM: string(x.AgentPublicKeyPem)}})
	}
	return &audit.Run{
		Ranks:        ranks,
		AllocationID: run.GetId(), State: state, Result: state, Restarts: int(run.GetRestarts()),
		StartedAt: time.Unix(0, started).UTC(), FinishedAt: time.Unix(0, run.GetFinishedUnixNano()).UTC(),
		BundleDigest: ev.BundleDigest,
		SpecFile:     file, SpecBytes: src, Spec: *sp, DeclaredFingerprint: fp,
		Conformance: audit.Evidence{Report: ev.Report, Signature: ev.Signature, AgentPublicKeyPEM: string(ev.AgentPublicKeyPem)},
		Hardware:    hw, Metrics: pts, Simulated: run.GetSimulated() || rep.Simulated,
		Log: &audit.Log{LastSeq: run.GetLastSeq(), HeldThrough: run.GetHeldThrough(),
			DisputedRecords: run.GetDisputedRecords(), FirstDisputedSeq: run.GetFirstDisputedSeq()},
		Slurm: runview.SlurmOf(run),
	}, nil
}

// declaredFingerprint recomputes the fingerprint of the spec an audit
// report declares, so verify catches a spec paired with another's
// fingerprint even when the manifest was re-signed.
func declaredFingerprint(file string, source []byte) (string, error) {
	doc, fs := spec.Parse(file, source)
	if doc == nil {
		if len(fs) > 0 {
			return "", errors.New(fs[0].Message)
		}
		return "", errors.New("not a spec")
	}
	return spec.Fingerprint(&doc.Spec)
}
