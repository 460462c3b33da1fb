package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
)

// brokerSource is the WorkSource over the broker's AgentWorkService.
type brokerSource struct {
	c       gpupassv1connect.AgentWorkServiceClient
	agentID func() string
	// wait is the long poll's length; each call's deadline is a little
	// longer, so a silent broker (a partition) is noticed.
	wait time.Duration
	call time.Duration
	log  *slog.Logger
}

// NewBrokerSource returns the WorkSource of the broker at baseURL; it
// dials the AgentWorkService with o: the token, the agent's trust for an
// https URL (TLSConfig: --tls-ca; nil: the system roots) and its plain
// HTTP consent, the same as enrollment and heartbeats use, and the creds
// that prove the node's identity on every call (Agent: a broker refuses
// calls without). It sets the protocol and user agent itself. The HTTP
// client has no overall timeout (the long poll would trip it); each call
// carries its own deadline instead. log hears what the broker says about
// the records sent (nil: discarded).
func NewBrokerSource(baseURL string, o client.Options, agentID func() string, log *slog.Logger) (WorkSource, error) {
	o.GRPC, o.NoGzip, o.UserAgent = true, true, buildinfo.UserAgent("gpupass-agent")
	c, err := client.DialRuns(baseURL, o)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &brokerSource{c: c.Work, agentID: agentID, wait: 20 * time.Second, call: 30 * time.Second, log: log}, nil
}

func (b *brokerSource) PollWork(ctx context.Context, agentID string) (*Assignment, error) {
	ctx, cancel := context.WithTimeout(ctx, b.wait+10*time.Second)
	defer cancel()
	resp, err := b.c.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: agentID, WaitSeconds: int32(b.wait / time.Second)}))
	if err != nil {
		return nil, fmt.Errorf("polling for work: %w", brokerErr(err))
	}
	m := resp.Msg.GetAssignment()
	if m == nil {
		return nil, nil
	}
	var gang *rendezvous.Gang
	if g := m.GetGang(); g != nil {
		gang = &rendezvous.Gang{NodeRank: int(g.NodeRank), Nodes: int(g.Nodes), LocalRanks: int(g.LocalRanks), MasterAddr: g.MasterAddr, MasterPort: int(g.MasterPort)}
	}
	return &Assignment{
		Gang: gang, GangRun: m.GetGang().GetRunId(), RequireBandwidth: m.GetGang().GetRequireBandwidth(),
		AllocID: m.AllocId, FencingToken: m.FencingToken, Spec: m.SpecJson, SpecFingerprint: m.SpecFingerprint, Command: m.Command,
		Workdir: m.WorkdirArchive, Region: m.Region, MaxRestarts: int(m.MaxRestarts),
		Grace: time.Duration(m.GraceSeconds) * time.Second, TimeLimit: time.Duration(min(max(m.TimeLimitSeconds, 0), int64(spec.MaxTimeLimit/time.Second))) * time.Second,
		ResumeAfterSeq:       m.ResumeAfterSeq,
		ResumeCheckpointName: m.ResumeCheckpointName, ResumeCheckpoint: m.ResumeCheckpoint,
		KeepCheckpoints: m.KeepCheckpoints,
	}, nil
}

var protoStates = map[AllocState]gpupassv1.AllocState{
	StateStarting:  gpupassv1.AllocState_ALLOC_STATE_STARTING,
	StateRunning:   gpupassv1.AllocState_ALLOC_STATE_RUNNING,
	StateSucceeded: gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED,
	StateFailed:    gpupassv1.AllocState_ALLOC_STATE_FAILED,
	StateCancelled: gpupassv1.AllocState_ALLOC_STATE_CANCELLED,
}

var protoNodeFaults = map[executor.NodeFault]gpupassv1.NodeFault{
	executor.NodeLost: gpupassv1.NodeFault_NODE_FAULT_LOST, executor.LaunchFailed: gpupassv1.NodeFault_NODE_FAULT_LAUNCH,
}

func (b *brokerSource) UpdateAllocation(ctx context.Context, u AllocUpdate) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.call)
	defer cancel()
	req := &gpupassv1.UpdateAllocationRequest{
		AgentId: b.agentID(), AllocId: u.AllocID, FencingToken: u.FencingToken, State: protoStates[u.State],
		Reason: u.Reason, ExitCode: int32(u.ExitCode), Attempts: int32(u.Attempts), Restarts: int32(u.Restarts), LastSeq: u.LastSeq,
		NodeFault: protoNodeFaults[u.NodeFault],
	}
	if p := u.Slurm; p != nil {
		req.Slurm = &gpupassv1.SlurmPlacement{Cluster: p.Cluster, JobId: p.JobID, Node: p.Node, Partition: p.Partition}
	}
	resp, err := b.c.UpdateAllocation(ctx, connect.NewRequest(req))
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition, connect.CodeNotFound:
			// Moved to another lease, or gone from the broker: either
			// way no update from this node will be taken.
			return false, fmt.Errorf("%w: %s", ErrStaleLease, api.Describe(err))
		}
		return false, fmt.Errorf("updating %s to %s: %s", u.AllocID, u.State, api.Describe(err))
	}
	return resp.Msg.CancelRequested, nil
}

func (b *brokerSource) Sink(a *Assignment) uploader.Sink {
	return &recordSink{b: b, token: a.FencingToken, offset: a.ResumeAfterSeq}
}

// recordSink uploads one run's records under its lease. offset shifts
// the spool's seqs past what the broker held from the run's earlier node.
type recordSink struct {
	b      *brokerSource
	token  uint64
	offset uint64
}

func (s *recordSink) Upload(ctx context.Context, allocID string, recs []spool.Record) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.call)
	defer cancel()
	req := &gpupassv1.UploadRecordsRequest{AgentId: s.b.agentID(), AllocId: allocID, FencingToken: s.token, Records: make([]*gpupassv1.Record, len(recs))}
	for i, r := range recs {
		req.Records[i] = &gpupassv1.Record{Seq: r.Seq + s.offset, Kind: gpupassv1.RecordKind(r.Kind), Data: r.Data}
	}
	resp, err := s.b.c.UploadRecords(ctx, connect.NewRequest(req))
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition:
			// The run belongs to another lease now: its records never will
			// be taken from this one.
			return 0, fmt.Errorf("uploading records of %s: %w: %w: %s", allocID, uploader.ErrRefused, ErrStaleLease, api.Describe(err))
		case connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodeResourceExhausted:
			// Gone from the broker, or a batch it will never take (the
			// same records would be refused on every retry; over the
			// run's quota, the broker failed the run).
			return 0, fmt.Errorf("uploading records of %s: %w: %s", allocID, uploader.ErrRefused, api.Describe(err))
		}
		return 0, fmt.Errorf("uploading records of %s: %s", allocID, api.Describe(err))
	}
	if d := resp.Msg.DisputedSeqs; len(d) > 0 {
		// The broker already stores other content at these seqs (this
		// agent's spool was lost or rewritten, or another process sent
		// records under this lease). It kept the first of each and marks
		// the run's log disputed: say so where the node's operator looks.
		// The list is bounded: a batch can hold thousands of records.
		const show = 16
		s.b.log.Error("the broker refused records: it holds other content at their seqs, and marks the run's log disputed (not proof of what the run printed)",
			"alloc", allocID, "disputed", len(d), "first_seqs", d[:min(len(d), show)])
	}
	if resp.Msg.HeldThrough < s.offset {
		return 0, nil
	}
	return resp.Msg.HeldThrough - s.offset, nil
}
