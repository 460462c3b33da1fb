package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/events"
)

// A run's audit evidence: the agent's own signed conformance report for
// the run (measured at runtime-init against the run's spec), verified
// here against the node's enrolled key and kept with the run, so that
// `gpupass audit` can build its report from the broker alone.

func init() {
	AllowRoles(gpupassv1connect.AgentWorkServiceSubmitRunReportProcedure, store.RoleAgent, store.RoleAdmin)
	AllowRoles(gpupassv1connect.RunServiceGetRunEvidenceProcedure, store.RoleRead, store.RoleSubmit, store.RoleAdmin)
}

func (b *Broker) evidenceStore() (store.Evidence, error) {
	es, ok := b.store.(store.Evidence)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this broker's store does not keep run reports"))
	}
	return es, nil
}

func (s *workService) SubmitRunReport(ctx context.Context, req *connect.Request[gpupassv1.SubmitRunReportRequest]) (*connect.Response[gpupassv1.SubmitRunReportResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	es, err := b.evidenceStore()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	e, err := b.callerAgent(ctx, m.AgentId)
	if err != nil {
		return nil, err
	}
	ag, _ := b.identity(e)
	b.touch(m.AgentId)
	a, err := rs.Alloc(ctx, m.AllocId)
	if err != nil {
		return nil, b.storeErr("allocation "+m.AllocId, err)
	}
	if a.NodeID != m.AgentId || a.Fence != m.FencingToken || a.State.Terminal() {
		return nil, staleFence(a, m.AgentId)
	}
	reject := func(code connect.Code, err error) error {
		b.log.Warn("rejected run report", "alloc", m.AllocId, "agent", m.AgentId, "peer", req.Peer().Addr, "reason", err.Error())
		return connect.NewError(code, fmt.Errorf("run report rejected: %w", err))
	}
	if err := conformance.Verify(ag.PublicKeyPEM, m.Report, m.Signature); err != nil {
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("signature does not verify against the key enrolled for %s: %v", m.AgentId, err))
	}
	rep, err := conformance.Parse(m.Report)
	if err != nil {
		return nil, reject(connect.CodeInvalidArgument, err)
	}
	switch {
	case rep.AgentID != m.AgentId:
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("it names agent %q but was sent by %s", rep.AgentID, m.AgentId))
	case rep.AllocationID != a.ID:
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("it names allocation %q, not %s", rep.AllocationID, a.ID))
	case rep.SpecFingerprint != a.SpecFingerprint:
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("it was measured against spec %s, the run declares %s", rep.SpecFingerprint, a.SpecFingerprint))
	case rep.Node.Region != a.Region:
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("it names region %q, the run is in %s", rep.Node.Region, a.Region))
	}
	if _, err := time.Parse(time.RFC3339Nano, rep.GeneratedAt); err != nil {
		return nil, reject(connect.CodeInvalidArgument, fmt.Errorf("generated_at %q: want RFC 3339 UTC", rep.GeneratedAt))
	}
	err = es.PutRunEvidence(ctx, store.RunEvidence{AllocID: a.ID, AgentID: m.AgentId, Report: m.Report, Signature: m.Signature,
		AgentPublicKeyPEM: ag.PublicKeyPEM, ReceivedAt: time.Now().UTC()}, m.FencingToken)
	if errors.Is(err, store.ErrStaleFence) {
		a, _ = rs.Alloc(ctx, m.AllocId)
		return nil, staleFence(a, m.AgentId)
	}
	if err != nil {
		return nil, b.storeErr("storing the run report of "+a.ID, err)
	}
	match := rep.RuntimeFingerprint != "" && rep.RuntimeFingerprint == a.SpecFingerprint
	b.log.Info("run report accepted", "alloc", a.ID, "agent", m.AgentId, "passed", rep.Passed(), "match", match, "simulated", rep.Simulated)
	return connect.NewResponse(&gpupassv1.SubmitRunReportResponse{Passed: rep.Passed(), RuntimeFingerprint: rep.RuntimeFingerprint, Match: match}), nil
}

func (s *runService) GetRunEvidence(ctx context.Context, req *connect.Request[gpupassv1.GetRunEvidenceRequest]) (*connect.Response[gpupassv1.GetRunEvidenceResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	es, err := b.evidenceStore()
	if err != nil {
		return nil, err
	}
	a, err := b.visibleRun(ctx, rs, req.Msg.AllocId)
	if err != nil {
		return nil, err
	}
	if !a.State.Terminal() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"run %s is %s: a run still in progress cannot be audited; audit it after it finishes", a.ID, a.State))
	}
	ev, err := es.RunEvidence(ctx, a.ID)
	if errors.Is(err, store.ErrNotFound) && a.StartedAt.IsZero() {
		// Cancelled while pending or matched, or failed on the way in:
		// nothing ran, so there is nothing to prove or disprove.
		how := "was " + string(a.State)
		if a.State != store.AllocCancelled {
			how = string(a.State)
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"run %s %s before it started (%s): it never ran, so there is nothing to audit; audit a run that ran", a.ID, how, a.Reason))
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"run %s (%s: %s) has no signed run report: its agent sent none (the run ended before runtime-init, or the agent predates run reports), so it cannot be audited", a.ID, a.State, a.Reason))
	}
	if err != nil {
		return nil, b.storeErr("reading the run report of "+a.ID, err)
	}
	resp := &gpupassv1.GetRunEvidenceResponse{
		Run: b.runView(a), SpecYaml: a.SpecYAML, SpecJson: a.SpecJSON, Report: ev.Report, Signature: ev.Signature,
		AgentPublicKeyPem: ev.AgentPublicKeyPEM, ReportReceivedUnixNano: nsOf(ev.ReceivedAt),
	}
	if ag, err := b.store.Agent(ctx, ev.AgentID); err == nil {
		l := ag.Labels
		resp.NodeLabels = &gpupassv1.NodeLabels{Provider: l.Provider, Region: l.Region, Zone: l.Zone, PricePerHour: l.PricePerHour,
			StorageClass: l.StorageClass, BandwidthGbps: l.BandwidthGbps, Hostname: l.Hostname}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, b.storeErr("reading node "+ev.AgentID, err)
	}
	if resp.BundleDigest, err = b.bundleDigest(ctx, rs, a.ID); err != nil {
		return nil, err
	}
	if err := b.rankEvidence(ctx, rs, es, a, resp); err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// rankEvidence adds a gang's ranks 1.. to rank 0's evidence and decides
// whether the run is certified: every rank's signed report present and
// measuring the spec's fingerprint on rank 0's accelerator
// (conformance.RankProblem). A rank that sent no report, or a
// different one, leaves the run uncertified, named.
func (b *Broker) rankEvidence(ctx context.Context, rs store.Runs, es store.Evidence, a store.Alloc, resp *gpupassv1.GetRunEvidenceResponse) error {
	head, err := conformance.Parse(resp.Report)
	if err != nil {
		return b.storeErr("reading the run report of "+a.ID, err)
	}
	var problems []string
	if p := conformance.RankProblem(0, nil, head, a.SpecFingerprint); p != "" {
		problems = append(problems, p)
	}
	if a.GangSize >= 2 {
		ranks, _, err := gangRanks(ctx, rs, a)
		if err != nil {
			return b.storeErr("reading the ranks of "+a.ID, err)
		}
		for _, x := range ranks[1:] {
			ev, err := es.RunEvidence(ctx, x.ID)
			if errors.Is(err, store.ErrNotFound) {
				on := ""
				if x.NodeID != "" {
					on = " on " + x.NodeID
				}
				problems = append(problems, fmt.Sprintf("rank %d%s (%s): sent no signed run report", x.Rank, on, x.ID))
				continue
			}
			if err != nil {
				return b.storeErr("reading the run report of "+x.ID, err)
			}
			resp.Ranks = append(resp.Ranks, &gpupassv1.RankEvidence{Rank: int32(x.Rank), AllocId: x.ID, NodeId: ev.AgentID,
				Report: ev.Report, Signature: ev.Signature, AgentPublicKeyPem: ev.AgentPublicKeyPEM, ReportReceivedUnixNano: nsOf(ev.ReceivedAt)})
			rep, err := conformance.Parse(ev.Report)
			if err != nil {
				problems = append(problems, fmt.Sprintf("rank %d on %s: its run report does not parse: %v", x.Rank, ev.AgentID, err))
				continue
			}
			if p := conformance.RankProblem(x.Rank, head, rep, a.SpecFingerprint); p != "" {
				problems = append(problems, p)
			}
		}
	}
	resp.Certified = len(problems) == 0
	if !resp.Certified {
		resp.UncertifiedReason = strings.Join(problems, "; ")
	}
	return nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// bundleComponent is the component of the agent's bundle-install events
// at runtime-init (events.RuntimeBundle); their "digest" field names the
// bundle pulled and installed.
const bundleComponent = "runtime.bundle"

// bundleDigest finds the wheel bundle a run installed: the first event
// the agent wrote (not a line of the job's output, which comes after
// runtime-init anyway) with a bundle digest: "digest" on a runtime.bundle
// event, or "bundle_digest" on any.
func (b *Broker) bundleDigest(ctx context.Context, rs store.Runs, allocID string) (string, error) {
	var after uint64
	for {
		recs, err := rs.Records(ctx, allocID, after, store.RecordEvent, 1000)
		if err != nil {
			return "", b.storeErr("reading events of "+allocID, err)
		}
		if len(recs) == 0 {
			return "", nil
		}
		for _, r := range recs {
			var ev events.Event
			if json.Unmarshal(r.Data, &ev) != nil || ev.Component == events.StdoutComponent || ev.Component == events.StderrComponent {
				continue
			}
			if d := ev.Fields["bundle_digest"]; digestRE.MatchString(d) {
				return d, nil
			}
			if d := ev.Fields["digest"]; ev.Component == bundleComponent && digestRE.MatchString(d) {
				return d, nil
			}
		}
		after = recs[len(recs)-1].Seq
	}
}
