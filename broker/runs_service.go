package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/workdir"
)

func (b *Broker) handleRuns(mux *http.ServeMux) {
	auth := connect.WithInterceptors(b.metrics.Interceptor(), b.authInterceptor(), streamAuth{b})
	p, h := gpupassv1connect.NewAgentWorkServiceHandler(&workService{b}, auth, connect.WithReadMaxBytes(api.MaxRecordsBytes))
	mux.Handle(p, b.agentCalls(h))
	p, h = gpupassv1connect.NewRunServiceHandler(&runService{b}, auth, connect.WithReadMaxBytes(api.MaxSubmitBytes))
	mux.Handle(p, h)
}

// streamAuth authenticates streaming calls (GetLogs) the way
// authInterceptor does unary ones, which it does not see.
type streamAuth struct{ b *Broker }

func (streamAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (streamAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a streamAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		proc := conn.Spec().Procedure
		t, ok := TokenFrom(ctx) // the guard authenticated it before the body
		if !ok {
			var err error
			if t, err = a.b.authenticate(ctx, conn.RequestHeader().Get(api.AuthHeader)); err != nil {
				return err
			}
		}
		for _, r := range roles[proc] {
			if r == t.Role {
				return next(context.WithValue(ctx, tokenKey{}, t), conn)
			}
		}
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("token %s has role %s, which may not call %s", t.ID, t.Role, proc))
	}
}

type workService struct{ b *Broker }

// touch counts an agent's run call as a sign of life, like a heartbeat
// without an RTT.
func (b *Broker) touch(id string) {
	b.beatsMu.Lock()
	hb := store.Heartbeat{AgentID: id, At: time.Now(), RTTMS: -1}
	if prev, ok := b.seen.get(id); ok {
		hb.RTTMS = prev.RTTMS
	}
	b.seen.set(hb)
	b.dirty[id] = struct{}{}
	b.beatsMu.Unlock()
}

func (s *workService) PollWork(ctx context.Context, req *connect.Request[gpupassv1.PollWorkRequest]) (*connect.Response[gpupassv1.PollWorkResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	id := req.Msg.AgentId
	if _, err := b.callerAgent(ctx, id); err != nil {
		return nil, err
	}
	wait := time.Duration(req.Msg.WaitSeconds) * time.Second
	if wait <= 0 {
		wait = 20 * time.Second
	}
	wait = min(wait, 60*time.Second)
	deadline := time.Now().Add(wait)
	release := func() {}
	defer func() { release() }()
	for {
		b.touch(id)
		release()
		var wake <-chan struct{}
		wake, release = b.runs.wait(nodeKey(id))
		active, err := rs.ActiveAllocs(ctx)
		if err != nil {
			return nil, b.storeErr("polling work", err)
		}
		for _, a := range active {
			if a.NodeID != id || a.State != store.AllocMatched {
				continue
			}
			w, err := rs.Workdir(ctx, a.ID)
			if err != nil {
				return nil, b.storeErr("reading work dir of "+a.ID, err)
			}
			as := assignment(a, w)
			if err := b.attachCheckpoint(ctx, rs, a, as); err != nil {
				return nil, err
			}
			return connect.NewResponse(&gpupassv1.PollWorkResponse{Assignment: as}), nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return connect.NewResponse(&gpupassv1.PollWorkResponse{}), nil
		}
		// Re-read at least every second: another replica's wake-up
		// (signal.go) may have been lost with its connection.
		t := time.NewTimer(min(left, time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-b.stop:
			t.Stop()
			return connect.NewResponse(&gpupassv1.PollWorkResponse{}), nil
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func assignment(a store.Alloc, workdir []byte) *gpupassv1.Assignment {
	restarts, keep := a.MaxRestarts, !a.ResumeElsewhere
	if a.GangSize > 1 {
		// A gang restarts whole, from here (restartGang): a rank's NaN
		// ends its attempt, and rank 0 ships the checkpoints every
		// rank of the next attempt starts from.
		restarts = 0
		keep = a.Rank > 0 || (a.MaxRestarts == 0 && !a.ResumeElsewhere)
	}
	as := &gpupassv1.Assignment{AllocId: a.ID, FencingToken: a.Fence, Name: a.Name, Region: a.Region, SpecJson: a.SpecJSON,
		SpecFingerprint: a.SpecFingerprint, Command: a.Command, WorkdirArchive: workdir, MaxRestarts: int32(restarts), GraceSeconds: int32(a.GraceSeconds),
		TimeLimitSeconds: gangTimeLeft(a, time.Now()), ResumeAfterSeq: a.ResumeAfterSeq, KeepCheckpoints: keep, Gang: gangProto(a)}
	if len(workdir) > 0 {
		as.WorkdirDigest = digest(workdir)
	}
	return as
}

var stateFromProto = map[gpupassv1.AllocState]store.AllocState{
	gpupassv1.AllocState_ALLOC_STATE_STARTING: store.AllocStarting, gpupassv1.AllocState_ALLOC_STATE_RUNNING: store.AllocRunning,
	gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED: store.AllocSucceeded, gpupassv1.AllocState_ALLOC_STATE_FAILED: store.AllocFailed,
	gpupassv1.AllocState_ALLOC_STATE_CANCELLED: store.AllocCancelled,
}

// staleFence names neither token: the caller's may be a guess, and the
// current one is the lease holder's alone.
func staleFence(a store.Alloc, agent string) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
		"allocation %s is no longer leased to %s with this fencing token (now node %q, state %s): stop the run",
		a.ID, agent, a.NodeID, a.State))
}

func (s *workService) UpdateAllocation(ctx context.Context, req *connect.Request[gpupassv1.UpdateAllocationRequest]) (*connect.Response[gpupassv1.UpdateAllocationResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if _, err := b.callerAgent(ctx, m.AgentId); err != nil {
		return nil, err
	}
	b.touch(m.AgentId)
	target, ok := stateFromProto[m.State]
	if !ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("state %s: an agent reports STARTING, RUNNING, SUCCEEDED, FAILED or CANCELLED", m.State))
	}
	if (target == store.AllocFailed || target == store.AllocCancelled) && strings.TrimSpace(m.Reason) == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("reason is required for state %s", target))
	}
	placed, err := slurmPlacement(m.Slurm)
	if err != nil {
		return nil, err
	}
	if m.NodeFault == gpupassv1.NodeFault_NODE_FAULT_LOST && target == store.AllocFailed {
		return s.nodeLost(ctx, rs, m)
	}
	var launch *store.Launch
	now := time.Now().UTC()
	settle := false
	a, err := rs.UpdateAlloc(ctx, m.AllocId, func(a *store.Alloc) error {
		target := target
		if a.NodeID != m.AgentId || a.Fence != m.FencingToken {
			return staleFence(*a, m.AgentId)
		}
		if placed != nil {
			a.Slurm = placed
		}
		a.Attempts, a.Restarts = max(a.Attempts, int(m.Attempts)), max(a.Restarts, int(m.Restarts))
		a.LastSeq = max(a.LastSeq, m.LastSeq)
		if a.State == target {
			return nil // a retried update
		}
		if a.State.Terminal() || stateRank[target] < stateRank[a.State] {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("allocation %s is %s (%s): cannot move it to %s", a.ID, a.State, a.Reason, target))
		}
		if a.GangSize > 1 && target.Terminal() {
			why := a.GangRestart
			if why == "" && target == store.AllocFailed && gangMayRestart(a, m.Reason, false) {
				why = fmt.Sprintf("rank %d on %s: %s", a.Rank, a.NodeID, m.Reason)
			}
			if why != "" {
				// This rank's attempt ended and the gang restarts: it
				// waits for the next attempt, holding no node.
				a.ExitCode = int(m.ExitCode)
				requeueRank(a, why)
				settle = true
				return nil
			}
		}
		if a.GangSize > 1 && a.Gang == "" {
			switch {
			case target == store.AllocSucceeded:
				// Rank 0's own process: the run succeeds once every
				// rank has (settleGang), and holds its node till then.
				if a.RankDone {
					return nil
				}
				a.RankDone, a.ExitCode = true, int(m.ExitCode)
				if a.State != store.AllocRunning {
					a.State, a.StartedAt = store.AllocRunning, now
				}
				settle = true
				return nil
			case target == store.AllocCancelled && a.EndedBy != "":
				// Stopped because another rank ended: the run failed.
				target = store.AllocFailed
			}
		}
		switch {
		case target == store.AllocRunning:
			if a.GangSize < 2 || a.StartedAt.IsZero() {
				// A restarted gang keeps its first start: its time
				// limit is the run's, every attempt draws on it.
				a.StartedAt = now
			}
			launch = &store.Launch{NodeID: a.NodeID, At: now, AllocID: a.ID}
		case target == store.AllocFailed && (a.State != store.AllocRunning || m.NodeFault == gpupassv1.NodeFault_NODE_FAULT_LAUNCH):
			// A launch the node could not make (a scheduler that
			// refused the job) counts as failed even once the run
			// was running: it is the node's failure, not the run's.
			launch = &store.Launch{NodeID: a.NodeID, At: now, AllocID: a.ID, Failed: true, Reason: m.Reason}
		}
		a.State = target
		if target.Terminal() {
			cancelReason := a.Reason
			a.FinishedAt, a.ExitCode, a.Reason = now, int(m.ExitCode), m.Reason
			if a.EndedBy != "" {
				// Stopped because another rank of its gang ended:
				// that rank is the reason.
				a.Reason = a.EndedBy
			} else if target == store.AllocCancelled && a.CancelRequested && cancelReason != "" {
				// The agent only knows the broker asked; the user's
				// reason is the one to keep.
				a.Reason = cancelReason
			}
			if a.Reason == "" {
				a.Reason = fmt.Sprintf("exited with code %d", m.ExitCode)
			}
		}
		return nil
	})
	if err != nil {
		return nil, b.storeErr("updating allocation "+m.AllocId, err)
	}
	if launch != nil {
		b.recordLaunch(ctx, *launch)
	}
	b.runs.wakeRun(m.AllocId)
	if settle || (a.GangSize > 1 && a.State.Terminal()) {
		b.settleGang(ctx, rs, a)
	}
	return connect.NewResponse(&gpupassv1.UpdateAllocationResponse{CancelRequested: a.CancelRequested}), nil
}

// nodeLost takes the node's word that it lost the run (a Slurm job ended
// NODE_FAIL or PREEMPTED) and handles it as for a node that stopped
// sending heartbeats: placed again when it may resume elsewhere, else
// failed, and the node's launch counts as failed.
func (s *workService) nodeLost(ctx context.Context, rs store.Runs, m *gpupassv1.UpdateAllocationRequest) (*connect.Response[gpupassv1.UpdateAllocationResponse], error) {
	b := s.b
	a, err := rs.Alloc(ctx, m.AllocId)
	if err != nil {
		return nil, b.storeErr("allocation "+m.AllocId, err)
	}
	if a.NodeID != m.AgentId || a.Fence != m.FencingToken {
		return nil, staleFence(a, m.AgentId)
	}
	if a.State.Terminal() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("allocation %s is %s (%s): cannot move it to %s", a.ID, a.State, a.Reason, store.AllocFailed))
	}
	b.nodeLost(ctx, rs, a, a.State == store.AllocRunning, m.Reason)
	return connect.NewResponse(&gpupassv1.UpdateAllocationResponse{}), nil
}

func (s *workService) UploadRecords(ctx context.Context, req *connect.Request[gpupassv1.UploadRecordsRequest]) (*connect.Response[gpupassv1.UploadRecordsResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if _, err := b.callerAgent(ctx, m.AgentId); err != nil {
		return nil, err
	}
	b.touch(m.AgentId)
	a, err := rs.Alloc(ctx, m.AllocId)
	if err != nil {
		return nil, b.storeErr("allocation "+m.AllocId, err)
	}
	if a.NodeID != m.AgentId || a.Fence != m.FencingToken {
		return nil, staleFence(a, m.AgentId)
	}
	recs := make([]store.RunRecord, len(m.Records))
	for i, r := range m.Records {
		if r.Seq == 0 || (r.Kind != gpupassv1.RecordKind_RECORD_KIND_EVENT && r.Kind != gpupassv1.RecordKind_RECORD_KIND_METRIC && r.Kind != gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("records[%d]: seq must be >= 1 and kind EVENT, METRIC or CHECKPOINT (got seq %d, kind %s)", i, r.Seq, r.Kind))
		}
		if len(r.Data) == 0 {
			// Every kind carries JSON (a checkpoint chunk, its header
			// line): an empty record is a broken agent, not a log line.
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("records[%d] (seq %d, kind %s): data is empty; every record kind carries JSON", i, r.Seq, r.Kind))
		}
		recs[i] = store.RunRecord{Seq: r.Seq, Kind: store.RecordKind(r.Kind), Data: r.Data}
	}
	if err := b.admitRecords(ctx, rs, a, recs); err != nil {
		return nil, err
	}
	res, err := rs.AppendRecords(ctx, m.AllocId, m.FencingToken, recs)
	if errors.Is(err, store.ErrStaleFence) {
		a, _ = rs.Alloc(ctx, m.AllocId)
		return nil, staleFence(a, m.AgentId)
	}
	if err != nil {
		return nil, b.storeErr("storing records of "+m.AllocId, err)
	}
	if len(res.Disputed) > 0 {
		// Refused, not an error: the rest of the batch is stored, so a
		// sender retrying it is not wedged, and the seqs come back in
		// the reply. The run's log is marked disputed for good.
		b.log.Warn("records refused: their seq is already stored with different content; the run's log is disputed",
			"alloc", m.AllocId, "agent", m.AgentId, "peer", req.Peer().Addr, "first_seq", res.Disputed[0], "records", len(res.Disputed))
	}
	if len(recs) > 0 {
		b.runs.wakeRun(m.AllocId)
		b.noteIngested(a, a.HeldThrough, recs, res.Disputed)
	}
	return connect.NewResponse(&gpupassv1.UploadRecordsResponse{HeldThrough: res.HeldThrough, CancelRequested: a.CancelRequested,
		DisputedSeqs: res.Disputed}), nil
}

type runService struct{ b *Broker }

func (s *runService) Submit(ctx context.Context, req *connect.Request[gpupassv1.SubmitRequest]) (*connect.Response[gpupassv1.SubmitResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	tok, _ := TokenFrom(ctx)
	m := req.Msg
	region := strings.TrimSpace(m.Region)
	if err := api.CheckRegion(region); err != nil {
		// One run per region: a list or a pattern would be stored as a
		// region of its own that no node is in.
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%w; name exactly one region per run, not a list or a pattern", err))
	}
	if err := checkRegion(tok, region); err != nil {
		return nil, err
	}
	sp, specJSON, fp, err := submitSpec(m)
	if err != nil {
		return nil, err
	}
	gang := match.NeedsGang(sp)
	if !gang && m.RequireBandwidth {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(
			"require_bandwidth is for a run across several nodes (resources.nodes above 1): this spec runs on one node, which has no link between nodes to measure"))
	}
	if len(m.Command) == 0 || strings.TrimSpace(m.Command[0]) == "" {
		return nil, api.FieldError(connect.CodeInvalidArgument, &fielderr.Error{Field: api.FieldSubmitCommand, Problem: "is required: the program and arguments the node runs"})
	}
	restarts := int32(3)
	if gang {
		restarts = 0
	}
	if m.MaxRestarts != nil {
		restarts = m.GetMaxRestarts()
	}
	grace := m.GraceSeconds
	if grace == 0 {
		grace = 10
	}
	if restarts < 0 || restarts > 100 || grace < 0 || grace > 3600 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("max_restarts must be 0..100 and grace_seconds 0..3600"))
	}
	limit, err := b.timeLimit(m.TimeLimitSeconds, sp)
	if err != nil {
		return nil, err
	}
	queueTimeout, err := queueTimeout(m.QueueTimeoutSeconds, sp)
	if err != nil {
		return nil, err
	}
	minScore := match.DefaultMinScore
	if m.MinHealthScore != nil {
		minScore = m.GetMinHealthScore()
	}
	if err := checkLimits(minScore, m.MaxPrice); err != nil {
		return nil, err
	}
	name := strings.TrimSpace(m.Name)
	if name == "" {
		name = sp.Name
	}
	if name == "" {
		name = "run"
	}
	if err := api.CheckRunName(name); err != nil {
		if strings.TrimSpace(m.Name) == "" {
			return nil, api.FieldError(connect.CodeInvalidArgument, fielderr.New("the spec's name", "", "%w; or give the run a {"+api.FieldSubmitName+"}", err))
		}
		return nil, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitName, "", "%w", err))
	}
	if len(m.WorkdirArchive) > 0 {
		// Read to the end under the limits before it is stored: the
		// agent would refuse it anyway, after the run was placed.
		if _, _, err := workdir.Check(bytes.NewReader(m.WorkdirArchive), b.cfg.Workdir); err != nil {
			return nil, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitWorkdir, "",
				"refused: %w (this broker takes at most %s: gpupass-broker serve --workdir-max-*)", err, b.cfg.Workdir.WithDefaults()))
		}
	}
	if !strings.HasSuffix(name, "-"+region) {
		name += "-" + region
	}
	ciJSON, err := groupCIJSON(m)
	if err != nil {
		return nil, err
	}
	group, size, err := b.joinGroup(ctx, rs, tok, strings.TrimSpace(m.Group), m.GroupSize)
	if err != nil {
		return nil, err
	}
	if ciJSON != nil {
		// Before the run: a group's webhook event must not go out
		// without the context its first run was submitted with.
		if err := rs.SetGroupCI(ctx, group, tok.ID, ciJSON); err != nil {
			return nil, b.storeErr("storing the CI context of group "+group, err)
		}
	}
	a := store.Alloc{ID: newAllocID(), Name: name, Region: region, Group: group, GroupSize: size, State: store.AllocPending, SpecJSON: specJSON, SpecYAML: m.GetSpecYaml(), SpecFingerprint: fp,
		Command: m.Command, Workdir: m.WorkdirArchive, MaxPrice: m.MaxPrice, MinScore: minScore, MaxRestarts: int(restarts),
		GraceSeconds: int(grace), TimeLimitSeconds: int64(limit / time.Second), ResumeElsewhere: m.ResumeElsewhere, TokenID: tok.ID, CreatedAt: time.Now().UTC(),
		QueueTimeoutSeconds: int64(queueTimeout / time.Second), RequireBandwidth: m.RequireBandwidth}
	if gang {
		// Every rank at once: no rank exists without the others.
		a.GangSize = sp.Resources.Nodes
		if err := rs.CreateAllocs(ctx, gangAllocs(a, a.GangSize)); err != nil {
			return nil, b.storeErr("storing run", err)
		}
	} else if err := rs.CreateAlloc(ctx, a); err != nil {
		return nil, b.storeErr("storing run", err)
	}
	b.log.Info("run submitted", "alloc", a.ID, "name", a.Name, "region", region, "token", tok.ID)
	placed, err := b.place(ctx, rs, a.ID)
	if err != nil {
		// Stored as pending: the run loop places it when the registry
		// or store is back.
		b.log.Error("placing run", "alloc", a.ID, "err", err)
		placed = a
	}
	return connect.NewResponse(&gpupassv1.SubmitResponse{Run: b.runProtoQ(ctx, rs, placed)}), nil
}

// groupCIJSON checks the CI context of a Submit and returns it as stored
// and sent in the group's webhook event; nil when there is none. Only
// the request that starts a group gives one: the group is its token's,
// and a context once stored is never replaced, so what a receiver reads
// is what the submission that started the group said.
func groupCIJSON(m *gpupassv1.SubmitRequest) ([]byte, error) {
	c := m.GetCi()
	if c == nil {
		return nil, nil
	}
	if strings.TrimSpace(m.Group) != "" {
		return nil, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitCI, "",
			"is given by the submission that starts a run group: leave it out when joining group %s", strings.TrimSpace(m.Group)))
	}
	if err := api.CheckCIContext(c); err != nil {
		return nil, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitCI, "", "%w", err))
	}
	return json.Marshal(GroupCI{Forge: c.Forge, Repository: c.Repository, PullRequest: c.PullRequest, SHA: c.Sha, RunURL: c.RunUrl, ProjectID: c.ProjectId})
}

// joinGroup is the group a submitted run goes into: a new one when the
// request names none, else the named group when every run in it was
// submitted by tok. A submit token must not put its runs into another
// token's group (whose webhook and listing would then carry them, in
// regions the other token may not see): one answer for an unknown group
// and another token's, so the refusal tells nothing about others' groups.
//
// It returns the group and its size: the request's for a new group (the
// runs it will hold; 0 is 1), the group's for one joined.
func (b *Broker) joinGroup(ctx context.Context, rs store.Runs, tok store.Token, group string, size int32) (string, int, error) {
	if group == "" {
		if size < 0 || size > maxGroupRuns {
			return "", 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitGroupSize, "", "is %d: a group holds 1 to %d runs", size, maxGroupRuns))
		}
		return newGroupID(), max(int(size), 1), nil
	}
	if err := api.CheckGroupID(group); err != nil {
		return "", 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitGroup, "", "%w", err))
	}
	runs, err := rs.GroupAllocs(ctx, group, maxGroupRuns)
	if err != nil {
		return "", 0, b.storeErr("group "+group, err)
	}
	if len(runs) == 0 || slices.ContainsFunc(runs, func(a store.Alloc) bool { return a.TokenID != tok.ID }) {
		return "", 0, api.FieldError(connect.CodePermissionDenied, fielderr.New(api.FieldSubmitGroup, "",
			"run group %s was not started by token %s: leave the group empty to start a new one", group, tok.ID))
	}
	if len(runs) >= maxGroupRuns {
		return "", 0, api.FieldError(connect.CodeResourceExhausted, fielderr.New(api.FieldSubmitGroup, "",
			"run group %s already holds %d runs, the most one group may: start a new group", group, maxGroupRuns))
	}
	return group, runs[0].GroupSize, nil
}

// timeLimit is the run's wall-clock limit: the request's (train
// --time-limit) over the spec's resources.time-limit, at most the
// broker's MaxTimeLimit; 0 when neither sets one.
func (b *Broker) timeLimit(seconds int64, sp *spec.Spec) (time.Duration, error) {
	field, d := api.FieldSubmitTimeLimit, time.Duration(0)
	switch {
	case seconds < 0:
		return 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(field, "", "is %d: give a positive number of seconds, or 0 for the spec's limit", seconds))
	case seconds > int64(spec.MaxTimeLimit/time.Second):
		// Compared in seconds first: a huge value would overflow a Duration.
		d = spec.MaxTimeLimit + time.Second
	case seconds > 0:
		d = time.Duration(seconds) * time.Second
	default:
		field = "the spec's resources.time-limit"
		var err error
		if d, err = sp.Resources.TimeLimitDuration(); err != nil {
			return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("spec: %w", err))
		}
	}
	if d > b.cfg.MaxTimeLimit {
		return 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(field, "", "%s is longer than this broker allows (%s: gpupass-broker serve --max-time-limit)",
			spec.FormatTimeLimit(d), spec.FormatTimeLimit(b.cfg.MaxTimeLimit)))
	}
	return d, nil
}

// queueTimeout is how long the run may wait in its region's queue: the
// request's (train --queue-timeout) over the spec's
// resources.queue-timeout, at most spec.MaxQueueTimeout; 0 when neither
// sets one (it waits until a node frees).
func queueTimeout(seconds int64, sp *spec.Spec) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitQueueTimeout, "", "is %d: give a positive number of seconds, or 0 for the spec's", seconds))
	case seconds > int64(spec.MaxQueueTimeout/time.Second):
		// Compared in seconds: a huge value would overflow a Duration.
		return 0, api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitQueueTimeout, "", "is %ds, longer than %s, the most a run may wait in the queue",
			seconds, spec.FormatTimeLimit(spec.MaxQueueTimeout)))
	case seconds > 0:
		return time.Duration(seconds) * time.Second, nil
	}
	d, err := sp.Resources.QueueTimeoutDuration()
	if err != nil {
		return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("spec: %w", err))
	}
	return d, nil
}

// visibleRun reads a run the caller's token may see. A run outside the
// token's regions is refused with 403, as docs/operating-the-broker.md and SECURITY.md promise
// for scope: a 404 sent users looking for a mistyped id when their token
// was the problem. The answer does not name the run's region, and run ids
// are random, so it tells no more than that the id exists.
func (b *Broker) visibleRun(ctx context.Context, rs store.Runs, id string) (store.Alloc, error) {
	tok, _ := TokenFrom(ctx)
	a, err := rs.Alloc(ctx, id)
	if err == nil && !match.MatchRegion(tok.Regions, a.Region) {
		return store.Alloc{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("run %s is outside the scope of token %s (%s): use a token whose regions cover the run's", id, tok.ID, strings.Join(tok.Regions, ",")))
	}
	if err != nil {
		return a, b.storeErr("run "+id, err)
	}
	return a, nil
}

func (s *runService) GetRun(ctx context.Context, req *connect.Request[gpupassv1.GetRunRequest]) (*connect.Response[gpupassv1.GetRunResponse], error) {
	rs, err := s.b.runStore()
	if err != nil {
		return nil, err
	}
	a, err := s.b.visibleRun(ctx, rs, req.Msg.AllocId)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&gpupassv1.GetRunResponse{Run: s.b.runProtoQ(ctx, rs, a)}), nil
}

func (s *runService) ListRuns(ctx context.Context, req *connect.Request[gpupassv1.ListRunsRequest]) (*connect.Response[gpupassv1.ListRunsResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	tok, _ := TokenFrom(ctx)
	if err := checkFilter(tok, req.Msg.Regions); err != nil {
		return nil, err
	}
	limit := int(req.Msg.Limit)
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	// The store applies the scope before the limit: a token that sees
	// few regions still gets its newest runs, however many others exist.
	inScope := func(region string) bool {
		return match.MatchRegion(tok.Regions, region) && (len(req.Msg.Regions) == 0 || match.MatchRegion(req.Msg.Regions, region))
	}
	if g := strings.TrimSpace(req.Msg.Group); g != "" {
		return b.listGroup(ctx, rs, g, limit, inScope)
	}
	if len(req.Msg.Regions) == 0 && slices.Contains(tok.Regions, "*") {
		inScope = nil // every region: no need to list the regions first
	}
	return b.listRunsPage(ctx, rs, tok, req.Msg, limit, inScope)
}

func (s *runService) Cancel(ctx context.Context, req *connect.Request[gpupassv1.CancelRequest]) (*connect.Response[gpupassv1.CancelResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	seen, err := b.visibleRun(ctx, rs, req.Msg.AllocId)
	if err != nil {
		return nil, err
	}
	reason := strings.TrimSpace(req.Msg.Reason)
	if reason == "" {
		reason = "cancelled by user"
	}
	cancel := func(a *store.Alloc) error {
		// A cancel ends a gang's restart too.
		a.GangRestart = ""
		switch a.State {
		case store.AllocPending, store.AllocMatched:
			// Not started: nothing to stop. An agent that already took
			// the assignment is refused on its first update.
			a.State, a.Reason, a.FinishedAt = store.AllocCancelled, reason, time.Now().UTC()
		case store.AllocStarting, store.AllocRunning:
			// The reason waits for the agent's CANCELLED, which keeps it.
			a.CancelRequested, a.Reason = true, reason
			if a.RankDone {
				// Rank 0's own process ended; the others are asked.
				a.State, a.FinishedAt = store.AllocCancelled, time.Now().UTC()
			}
		}
		return nil
	}
	var a store.Alloc
	if seen.GangSize > 1 {
		// A gang is cancelled whole: every rank is asked at once.
		var ids []string
		if _, ids, err = gangRanks(ctx, rs, seen); err == nil {
			var as []store.Alloc
			if as, err = rs.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
				for _, x := range as {
					_ = cancel(x)
				}
				return nil
			}); err == nil {
				a = as[0]
				for _, x := range as[1:] {
					b.runs.wakeRun(x.ID)
				}
			}
		}
	} else {
		a, err = rs.UpdateAlloc(ctx, req.Msg.AllocId, cancel)
	}
	if err != nil {
		return nil, b.storeErr("cancelling run "+req.Msg.AllocId, err)
	}
	b.log.Info("run cancel requested", "alloc", a.ID, "state", a.State)
	b.runs.wakeRun(a.ID)
	return connect.NewResponse(&gpupassv1.CancelResponse{Run: b.runView(a)}), nil
}

// followGrace bounds how long a follower waits, after a run ended, for
// records the agent said it spooled but has not uploaded yet.
const followGrace = 30 * time.Second

func (s *runService) GetLogs(ctx context.Context, req *connect.Request[gpupassv1.GetLogsRequest], stream *connect.ServerStream[gpupassv1.GetLogsResponse]) error {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return err
	}
	m := req.Msg
	a, err := b.visibleRun(ctx, rs, m.AllocId)
	if err != nil {
		return err
	}
	kind := store.RecordEvent
	if m.IncludeMetrics {
		kind = 0
	}
	after := m.AfterSeq
	release, key := func() {}, runKey(a.ID)
	defer func() { release() }()
	for {
		release()
		var wake <-chan struct{}
		wake, release = b.runs.wait(key)
		// Following, read the run before its records and send only up to
		// its gap-free mark: records past a gap are sent once the gap is
		// filled, so a follower sees every seq once and in order.
		limit := uint64(math.MaxUint64)
		if m.Follow {
			if a, err = rs.Alloc(ctx, m.AllocId); err != nil {
				return b.storeErr("run "+m.AllocId, err)
			}
			limit = a.HeldThrough
		}
	page:
		for after < limit {
			// LogRecords: a checkpoint chunk comes as its header line
			// only (the file's bytes are for a resuming node, not a log;
			// read whole, a page could hold a GiB), and the seqs a
			// follower sees still run without a gap.
			recs, err := rs.LogRecords(ctx, m.AllocId, after, kind, 1000)
			if err != nil {
				return b.storeErr("reading logs of "+m.AllocId, err)
			}
			resp := &gpupassv1.GetLogsResponse{}
			read := after
			for _, r := range recs {
				if r.Seq > limit {
					break
				}
				read = r.Seq
				resp.Records = append(resp.Records, &gpupassv1.Record{Seq: r.Seq, Kind: gpupassv1.RecordKind(r.Kind), Data: r.Data})
			}
			if read == after {
				break page
			}
			if len(resp.Records) > 0 {
				if err := stream.Send(resp); err != nil {
					return err
				}
			}
			after = read
		}
		if !m.Follow {
			return nil
		}
		after = max(after, limit) // the rest up to the mark are of another kind
		if a.State.Terminal() && (a.HeldThrough >= a.LastSeq || time.Since(a.FinishedAt) > followGrace) {
			return stream.Send(&gpupassv1.GetLogsResponse{Run: b.runView(a)})
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-b.stop:
			t.Stop()
			return connect.NewError(connect.CodeUnavailable, errors.New("broker shutting down: follow again"))
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func (s *runService) GetMetrics(ctx context.Context, req *connect.Request[gpupassv1.GetMetricsRequest]) (*connect.Response[gpupassv1.GetMetricsResponse], error) {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return nil, err
	}
	a, err := b.visibleRun(ctx, rs, req.Msg.AllocId)
	if err != nil {
		return nil, err
	}
	var points []events.Metric
	var after uint64
	for {
		recs, err := rs.Records(ctx, a.ID, after, store.RecordMetric, 5000)
		if err != nil {
			return nil, b.storeErr("reading metrics of "+a.ID, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			var p events.Metric
			if err := json.Unmarshal(r.Data, &p); err != nil {
				b.log.Warn("skipping unreadable metric record", "alloc", a.ID, "seq", r.Seq, "err", err)
				continue
			}
			p.Seq = r.Seq
			points = append(points, p)
		}
		after = recs[len(recs)-1].Seq
	}
	resp := &gpupassv1.GetMetricsResponse{Run: b.runView(a)}
	for _, p := range events.Continuous(points) {
		resp.Points = append(resp.Points, &gpupassv1.MetricPoint{Seq: p.Seq, Step: p.Step, TimeUnixNano: nsOf(p.Time),
			Attempt: int32(p.Attempt), Values: p.Values, Source: p.Source})
	}
	return connect.NewResponse(resp), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
