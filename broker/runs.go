package broker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/spec"
)

func init() {
	for _, p := range []string{
		gpupassv1connect.AgentWorkServicePollWorkProcedure,
		gpupassv1connect.AgentWorkServiceUpdateAllocationProcedure,
		gpupassv1connect.AgentWorkServiceUploadRecordsProcedure,
	} {
		AllowRoles(p, store.RoleAgent, store.RoleAdmin)
	}
	AllowRoles(gpupassv1connect.RunServiceSubmitProcedure, store.RoleSubmit, store.RoleAdmin)
	AllowRoles(gpupassv1connect.RunServiceCancelProcedure, store.RoleSubmit, store.RoleAdmin)
	for _, p := range []string{
		gpupassv1connect.RunServiceGetRunProcedure,
		gpupassv1connect.RunServiceListRunsProcedure,
		gpupassv1connect.RunServiceGetLogsProcedure,
		gpupassv1connect.RunServiceGetMetricsProcedure,
	} {
		AllowRoles(p, store.RoleRead, store.RoleSubmit, store.RoleAdmin)
	}
}

// runsState is the broker's in-memory side of runs: wake-ups only. All
// run state lives in the store, so a restarted broker (or a second one
// on the same PostgreSQL) carries on. Waiters wait on a key: a node's
// work polls on nodeKey (work may be there for it), a run's log
// followers on runKey (it changed: records, state). They also re-read
// the store periodically, for a wake-up lost between replicas.
type runsState struct {
	mu    sync.Mutex
	waits map[string]*waiter
	// relay, when replicas share the store, passes this replica's
	// wake-ups on to the others (signal.go); nil otherwise.
	relay *relay
}

// waiter is the channel the waiters on one key share, closed at its next
// wake-up, and how many wait on it (its entry goes when the last stops
// waiting, so that a run nobody follows holds no memory).
type waiter struct {
	ch chan struct{}
	n  int
}

func newRunsState() *runsState {
	return &runsState{waits: map[string]*waiter{}}
}

func nodeKey(id string) string { return "n:" + id }
func runKey(id string) string  { return "r:" + id }

// wait returns a channel closed at key's next wake-up, and release, to be
// called (once or more) when the caller stops waiting on it.
func (r *runsState) wait(key string) (<-chan struct{}, func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.waits[key]
	if !ok {
		w = &waiter{ch: make(chan struct{})}
		r.waits[key] = w
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			r.mu.Lock()
			if w.n--; w.n == 0 && r.waits[key] == w {
				delete(r.waits, key)
			}
			r.mu.Unlock()
		})
	}
}

// waiting is how many keys have waiters (tests).
func (r *runsState) waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waits)
}

// wakeNode wakes the work polls waiting for node id, here and, through
// the relay, on the other replicas.
func (r *runsState) wakeNode(id string) { r.wake(nodeKey(id)) }

// wakeRun wakes the followers of run id, here and on the other replicas.
func (r *runsState) wakeRun(id string) { r.wake(runKey(id)) }

func (r *runsState) wake(key string) {
	r.wakeHere(key)
	r.relay.add(key)
}

func (r *runsState) wakeHere(key string) {
	r.mu.Lock()
	if w, ok := r.waits[key]; ok {
		close(w.ch)
		delete(r.waits, key)
	}
	r.mu.Unlock()
}

// wakeAllHere wakes everyone waiting here (a signal naming more keys than
// one payload holds; signals missed while not listening).
func (r *runsState) wakeAllHere() {
	r.mu.Lock()
	for key, w := range r.waits {
		close(w.ch)
		delete(r.waits, key)
	}
	r.mu.Unlock()
}

func (b *Broker) runStore() (store.Runs, error) {
	rs, ok := b.store.(store.Runs)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this broker's store does not support runs"))
	}
	return rs, nil
}

// newFence draws the fencing token of a new lease: random, so that no
// node can work out another lease's token from its own (they used to
// count 1, 2, 3…); 63 bits, because PostgreSQL's BIGINT is signed; never
// 0 (no lease) and never old, so a node holding the previous lease is
// always stale.
func newFence(old uint64) uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (it panics instead)
		if f := binary.BigEndian.Uint64(b[:]) >> 1; f != 0 && f != old {
			return f
		}
	}
}

// randomID is prefix and n random bytes in hex: the broker's ids of
// runs, groups, webhooks and deliveries.
func randomID(prefix string, n int) string {
	id := make([]byte, n)
	_, _ = rand.Read(id) // crypto/rand.Read does not fail (it panics instead)
	return prefix + hex.EncodeToString(id)
}

func newAllocID() string { return randomID("alloc-", 4) }

// newGroupID draws a run group id: 8 random bytes, so a group cannot be
// guessed from another (joining one is for its token alone anyway).
func newGroupID() string { return randomID(api.GroupIDPrefix, 8) }

// maxGroupRuns bounds the runs of one group: one per region of a
// submission, so a few; the bound keeps GroupAllocs one small read.
const maxGroupRuns = 64

// storeErr maps a store failure to a wire error, logging the detail.
func (b *Broker) storeErr(what string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: not found", what))
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	b.log.Error("run store", "what", what, "err", err)
	b.metrics.StoreError("runs")
	if storeFull(err) {
		b.noteStoreWrite(err)
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: broker store full", what))
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: run store unavailable", what))
}

var stateProto = map[store.AllocState]gpupassv1.AllocState{
	store.AllocPending: gpupassv1.AllocState_ALLOC_STATE_PENDING, store.AllocMatched: gpupassv1.AllocState_ALLOC_STATE_MATCHED,
	store.AllocStarting: gpupassv1.AllocState_ALLOC_STATE_STARTING, store.AllocRunning: gpupassv1.AllocState_ALLOC_STATE_RUNNING,
	store.AllocSucceeded: gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, store.AllocFailed: gpupassv1.AllocState_ALLOC_STATE_FAILED,
	store.AllocCancelled: gpupassv1.AllocState_ALLOC_STATE_CANCELLED,
}

// stateRank orders the lifecycle; an agent may only move an allocation
// forward (terminal states share the last rank).
var stateRank = map[store.AllocState]int{
	store.AllocPending: 0, store.AllocMatched: 1, store.AllocStarting: 2, store.AllocRunning: 3,
	store.AllocSucceeded: 4, store.AllocFailed: 4, store.AllocCancelled: 4,
}

func runProto(a store.Alloc) *gpupassv1.Run {
	r := &gpupassv1.Run{
		Id: a.ID, Name: a.Name, Region: a.Region, Group: a.Group, State: stateProto[a.State], Reason: a.Reason, NodeId: a.NodeID,
		PricePerHour: a.PricePerHour, SpecFingerprint: a.SpecFingerprint, Command: a.Command, ExitCode: int32(a.ExitCode),
		// FencingToken stays 0: the lease's token is for the node that
		// holds it (PollWork), not for whoever may read the run.
		Attempts: int32(a.Attempts), Restarts: int32(a.Restarts), HeldThrough: a.HeldThrough,
		CancelRequested: a.CancelRequested, Simulated: a.Simulated, MaxPrice: a.MaxPrice, ResumeElsewhere: a.ResumeElsewhere,
		ReplacedNodes: a.Replaced, LastSeq: a.LastSeq, TimeLimitSeconds: a.TimeLimitSeconds,
		LogDisputed: a.DisputedRecords > 0, DisputedRecords: a.DisputedRecords, FirstDisputedSeq: a.FirstDisputedSeq,
		LogComplete:     a.State.Terminal() && a.LogComplete(),
		CreatedUnixNano: nsOf(a.CreatedAt), UpdatedUnixNano: nsOf(a.UpdatedAt), StartedUnixNano: nsOf(a.StartedAt), FinishedUnixNano: nsOf(a.FinishedAt),
		Slurm:               slurmPlacementProto(a.Slurm),
		QueuedUnixNano:      nsOf(a.QueuedAt),
		QueueNodes:          int32(a.QueueNodeCount),
		QueueTimeoutSeconds: a.QueueTimeoutSeconds,
	}
	if a.GangSize > 1 {
		r.GangNodes, r.GangRank = int32(a.GangSize), int32(a.Rank)
	}
	if len(a.ScoreJSON) > 0 {
		var s health.Score
		if json.Unmarshal(a.ScoreJSON, &s) == nil {
			r.Score = s.ToProto()
		}
	}
	return r
}

// runView is runProto for a client: with the run's dashboard page at the
// broker's public address, where it has one.
func (b *Broker) runView(a store.Alloc) *gpupassv1.Run {
	r := runProto(a)
	r.DashboardUrl = b.runPage(a.ID)
	return r
}

// runPage is the run's dashboard page at the address users reach the
// broker (serve --public-url); empty without one.
func (b *Broker) runPage(id string) string {
	pub := strings.TrimRight(b.cfg.Webhooks.PublicURL, "/")
	if pub == "" {
		return ""
	}
	return pub + "/ui/runs/" + url.PathEscape(id)
}

func nsOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// nodeOnline reports whether a node beat (or polled) within OfflineAfter.
func (b *Broker) nodeOnline(snap *snapshot, id string, now time.Time) bool {
	var seen time.Time
	if i, ok := snap.pos[id]; ok {
		seen = snap.nodes[i].LastSeen
	}
	if hb, ok := b.beat(id); ok && hb.At.After(seen) {
		seen = hb.At
	}
	return !seen.IsZero() && now.Sub(seen) <= b.cfg.OfflineAfter
}

func (b *Broker) superviseRuns(ctx context.Context) error {
	rs, ok := b.store.(store.Runs)
	if !ok {
		return nil
	}
	active, err := rs.ActiveAllocs(ctx)
	if err != nil {
		return err
	}
	if len(active) == 0 {
		return nil
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, a := range active {
		switch a.State {
		case store.AllocPending:
			if _, err := b.place(ctx, rs, a.ID); err != nil {
				b.log.Error("placing run", "alloc", a.ID, "err", err)
			}
		case store.AllocMatched, store.AllocStarting:
			switch {
			case !b.nodeOnline(snap, a.NodeID, now):
				b.nodeLost(ctx, rs, a, false, "")
			case now.Sub(maxTime(a.UpdatedAt, b.started)) > b.cfg.StartTimeout:
				b.startTimedOut(ctx, rs, a)
			}
		case store.AllocRunning:
			if !b.nodeOnline(snap, a.NodeID, now) {
				b.nodeLost(ctx, rs, a, true, "")
			}
		}
	}
	return nil
}

// nodeLost handles the node of a run going offline: before start the run
// is placed on the next candidate (and the node's launch counts as
// failed); mid-run it fails with "node lost" unless it may resume
// elsewhere. fault, when set, is the node's own word that it lost the run
// (a Slurm job ended NODE_FAIL or PREEMPTED): the launch counts as failed
// then too.
func (b *Broker) nodeLost(ctx context.Context, rs store.Runs, seen store.Alloc, started bool, fault string) {
	var replace bool
	a, err := rs.UpdateAlloc(ctx, seen.ID, func(a *store.Alloc) error {
		if a.State != seen.State || a.Fence != seen.Fence {
			return errMoved
		}
		lost := a.NodeID
		why := lost + " stopped sending heartbeats"
		if fault != "" {
			why = lost + " says: " + fault
		}
		if a.GangSize > 1 && (!started || gangMayRestart(a, "", true)) {
			// A gang's rank is not re-placed alone: the whole gang
			// restarts (restartGang), away from the lost node.
			a.Replaced = append(a.Replaced, lost)
			requeueRank(a, fmt.Sprintf("rank %d: node lost: %s", a.Rank, why))
			return nil
		}
		if (started && !a.ResumeElsewhere) || a.GangSize > 1 {
			// A gang without --resume-elsewhere ends (settleGang).
			if !started {
				a.State, a.Reason, a.FinishedAt, a.ExitCode = store.AllocFailed, "node lost: "+why+" before start", time.Now().UTC(), -1
				return nil
			}
			a.State, a.Reason, a.FinishedAt = store.AllocFailed, "node lost: "+why+" mid-run", time.Now().UTC()
			a.ExitCode = -1
			return nil
		}
		replace = true
		a.Replaced = append(a.Replaced, lost)
		a.State, a.NodeID, a.ScoreJSON = store.AllocPending, "", nil
		if started {
			a.ResumeAfterSeq = a.HeldThrough
			a.Reason = "node " + lost + " lost mid-run; resuming elsewhere"
			if fault != "" {
				a.Reason += " (" + fault + ")"
			}
		} else {
			a.Reason = "node " + lost + " lost before start; re-placing"
		}
		return nil
	})
	if errors.Is(err, errMoved) {
		return
	}
	if err != nil {
		b.log.Error("handling lost node", "alloc", seen.ID, "err", err)
		return
	}
	b.log.Warn("node lost under run", "alloc", a.ID, "node", seen.NodeID, "started", started, "state", a.State)
	switch {
	case fault != "":
		b.recordLaunch(ctx, store.Launch{NodeID: seen.NodeID, At: time.Now().UTC(), Failed: true, Reason: "node lost: " + fault, AllocID: a.ID})
	case !started:
		b.recordLaunch(ctx, store.Launch{NodeID: seen.NodeID, At: time.Now().UTC(), Failed: true, Reason: "node lost before start", AllocID: a.ID})
	}
	b.runs.wakeRun(a.ID)
	if replace {
		if _, err := b.place(ctx, rs, a.ID); err != nil {
			b.log.Error("re-placing run", "alloc", a.ID, "err", err)
		}
	}
	b.settleGang(ctx, rs, a)
}

var errMoved = errors.New("allocation changed meanwhile")

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// startTimedOut ends a run whose node is alive but silent about it: in
// matched the node never took it (it is placed on the next candidate, as
// for a node lost before start); in starting the node took the lease and
// then said nothing (an agent restarted under it, a hung runtime-init),
// and the run fails. The agent's watcher updates every second through
// runtime-init, so a slow but live start never gets here. Either way the
// node's launch counts as failed in its 24 h rate.
func (b *Broker) startTimedOut(ctx context.Context, rs store.Runs, seen store.Alloc) {
	node, limit := seen.NodeID, b.cfg.StartTimeout
	a, err := rs.UpdateAlloc(ctx, seen.ID, func(a *store.Alloc) error {
		if a.State != seen.State || a.Fence != seen.Fence {
			return errMoved
		}
		if a.State == store.AllocMatched && a.GangSize < 2 {
			a.Replaced = append(a.Replaced, node)
			a.State, a.NodeID, a.ScoreJSON = store.AllocPending, "", nil
			a.Reason = fmt.Sprintf("node %s did not take the run within %s; re-placing", node, limit)
			return nil
		}
		a.State, a.FinishedAt, a.ExitCode = store.AllocFailed, time.Now().UTC(), -1
		a.Reason = fmt.Sprintf("start timed out: node %s took the run but reported nothing for %s (its agent restarted, or runtime-init hung)", node, limit)
		return nil
	})
	if errors.Is(err, errMoved) {
		return
	}
	if err != nil {
		b.log.Error("timing out run start", "alloc", seen.ID, "err", err)
		return
	}
	b.log.Warn("run start timed out", "alloc", a.ID, "node", node, "was", seen.State, "now", a.State)
	b.recordLaunch(ctx, store.Launch{NodeID: node, At: time.Now().UTC(), Failed: true, Reason: "start timed out in " + string(seen.State), AllocID: a.ID})
	b.runs.wakeRun(a.ID)
	if a.State == store.AllocPending {
		if _, err := b.place(ctx, rs, a.ID); err != nil {
			b.log.Error("re-placing run", "alloc", a.ID, "err", err)
		}
	}
	b.settleGang(ctx, rs, a)
}

func (b *Broker) recordLaunch(ctx context.Context, l store.Launch) {
	if err := b.store.RecordLaunch(ctx, l); err != nil {
		b.log.Error("recording launch", "node", l.NodeID, "alloc", l.AllocID, "err", err)
		return
	}
	b.invalidate()
}

// place matches a pending run and leases it to the best idle candidate
// (DryRun's order), skipping nodes it was lost on. With candidates that
// are all busy it stays pending; with none it fails with the reasons.
func (b *Broker) place(ctx context.Context, rs store.Runs, id string) (store.Alloc, error) {
	placeStart := time.Now()
	a, err := rs.Alloc(ctx, id)
	if err != nil {
		return a, err
	}
	if a.State != store.AllocPending || a.Gang != "" || a.GangRestart != "" {
		// A gang's ranks 1.. are placed with rank 0, never alone; a
		// restarting gang once every rank has stopped (restartGang).
		return a, nil
	}
	sp, err := spec.Decode(a.SpecJSON)
	if err != nil {
		return b.finish(ctx, rs, a, store.AllocFailed, "stored spec is unreadable: "+err.Error())
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		return a, err
	}
	active, err := rs.ActiveAllocs(ctx)
	if err != nil {
		return a, err
	}
	busy := map[string]bool{}
	for _, x := range active {
		if x.ID != a.ID && x.NodeID != "" {
			busy[x.NodeID] = true
		}
	}
	skip := map[string]bool{}
	for _, n := range a.Replaced {
		skip[n] = true
	}
	// First come first placed: a node a run ahead in the queue waits
	// for is as good as busy to this one.
	claimed := queueClaims(a, active)
	if a.GangSize > 1 {
		return b.placeGang(ctx, rs, a, sp, snap, active, claimed, skip, placeStart)
	}
	// A run new enough that another replica may know of a node this one
	// has not read yet (newsDelay) is matched again on a fresh read of
	// the store before it is found unplaceable.
	news := b.awaitsNews(a)
	var out match.Output
	waiting := false
	var waitFor []string // the busy nodes that could take it
	for fresh := false; ; fresh = true {
		waitFor = waitFor[:0]
		out = match.Run(match.Input{Spec: sp, Nodes: snap.nodes, Launches: snap.launches, Beat: b.beat, Scope: []string{a.Region},
			Regions: []string{a.Region}, MinScore: a.MinScore, MaxPrice: a.MaxPrice, Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter, Held: snap.held})
		for _, c := range out.Candidates {
			switch {
			case skip[c.Node.ID]:
				continue
			case busy[c.Node.ID], claimed[c.Node.ID]:
				waiting = true
				waitFor = append(waitFor, c.Node.ID)
				continue
			}
			placed, err := b.lease(ctx, rs, a.ID, c)
			switch {
			case errors.Is(err, store.ErrNodeBusy):
				// Another placement took the node since ActiveAllocs was
				// read; the store refused the second lease.
				waiting = true
				waitFor = append(waitFor, c.Node.ID)
				continue
			case errors.Is(err, errMoved):
				return rs.Alloc(ctx, id)
			case err != nil:
				return a, err
			}
			b.log.Info("run placed", "alloc", placed.ID, "node", placed.NodeID, "score", c.Score.Score)
			b.metrics.Placed(time.Since(placeStart), time.Since(placed.CreatedAt))
			b.runs.wakeNode(placed.NodeID)
			b.runs.wakeRun(placed.ID)
			return placed, nil
		}
		if waiting || !news || fresh {
			break
		}
		// The other replicas write what they heard every FlushInterval:
		// a read begun a fifth of that ago holds nearly all a new one
		// would, so runs placed together (a burst of submissions,
		// superviseRuns' pass over them) share one.
		if snap, err = b.refresh(ctx, time.Now().Add(-b.cfg.FlushInterval/5)); err != nil {
			return a, err
		}
	}
	if !waiting && news {
		return b.waitForNews(ctx, rs, a, "no candidate node yet")
	}
	if waiting {
		return b.wait(ctx, rs, a, active, waitFor)
	}
	return b.finish(ctx, rs, a, store.AllocFailed, noCandidate(a, out))
}

// waitForNews keeps a run that found no node (none for a gang: what)
// pending, when another replica may know of one this replica has not
// read yet (awaitsNews): the node may be in another replica's heartbeat
// buffer. The run stays pending until newsDelay has passed since it was
// submitted, then fails as usual. This replica looks again once that
// buffer is written (superviseRuns, on whichever replica does once-only
// work, would within a second).
func (b *Broker) waitForNews(ctx context.Context, rs store.Runs, a store.Alloc, what string) (store.Alloc, error) {
	why := what + "; waiting for news from the other brokers"
	if a.Reason == why {
		return a, nil
	}
	out, err := rs.UpdateAlloc(ctx, a.ID, func(x *store.Alloc) error {
		if x.State != store.AllocPending {
			return errMoved
		}
		x.Reason = why
		return nil
	})
	switch {
	case errors.Is(err, errMoved):
		return rs.Alloc(ctx, a.ID)
	case err == nil:
		// Once per run: a later pass finds the reason set.
		b.placeLater(rs, a.ID, 2*b.cfg.FlushInterval)
	}
	return out, err
}

// awaitsNews reports whether a run that finds no candidate here should
// wait before failing: brokers share the store, and it was submitted less
// than newsDelay ago, as a CI job does right after its node came up
// through another replica.
func (b *Broker) awaitsNews(a store.Alloc) bool {
	_, shared := b.leases()
	return shared && len(a.Replaced) == 0 && time.Since(a.CreatedAt) < b.newsDelay()
}

// placeLater places a pending run again after d, unless the broker stops
// first.
func (b *Broker) placeLater(rs store.Runs, id string, d time.Duration) {
	go func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.place(ctx, rs, id); err != nil {
			b.log.Error("placing run", "alloc", id, "err", err)
		}
	}()
}

// newsDelay bounds how long what another replica took (an enrollment, a
// report, the heartbeats it buffers) takes to reach this one: that
// replica's heartbeat write every FlushInterval (replicas share a
// configuration), twice over for a write that misses its commit, and this
// replica's read of the store every SnapshotTTL. 1 s with the defaults.
func (b *Broker) newsDelay() time.Duration {
	return 2*b.cfg.FlushInterval + b.cfg.SnapshotTTL
}

// lease moves a pending run onto the candidate's node with a new fence
// (errMoved if it is no longer pending, store.ErrNodeBusy if the node took
// another run meanwhile).
func (b *Broker) lease(ctx context.Context, rs store.Runs, id string, pick *match.Result) (store.Alloc, error) {
	score, _ := json.Marshal(pick.Score)
	return rs.UpdateAlloc(ctx, id, func(x *store.Alloc) error {
		if x.State != store.AllocPending {
			return errMoved
		}
		x.State, x.NodeID, x.Fence, x.ScoreJSON = store.AllocMatched, pick.Node.ID, newFence(x.Fence), score
		x.PricePerHour, x.Simulated, x.Reason = match.Price(&pick.Node), pick.Node.Index.Simulated, ""
		// Out of the queue: if it is re-placed it queues again.
		x.QueuedAt, x.QueueNodes, x.QueueNodeCount = time.Time{}, nil, 0
		return nil
	})
}

// Bounds on the reason of a run no node can take: the exclusions are
// what the nodes' reports say (a Slurm admin's drain reason among them),
// and the reason is stored with the run and shown in every listing.
const (
	maxNoCandidateReasons = 8
	maxNoCandidateBytes   = 2000
	maxNoCandidatePart    = 400
)

// noCandidate explains an empty match with every distinct exclusion of
// the region's nodes, as dry-run names them: each reason once, with how
// many nodes it excludes and the first few of them, the most common
// first (then the nearest misses'). A node excluded for three reasons
// shows all three. Past maxNoCandidateReasons or maxNoCandidateBytes it
// says how many more there are and where to see them.
func noCandidate(a store.Alloc, out match.Output) string {
	type group struct {
		msg, last string
		nodes     []string
		n         int
	}
	var groups []*group
	byMsg := map[string]*group{}
	excluded := 0
	for _, x := range out.Excluded {
		if x.OutOfScope || len(x.Reasons) == 0 || match.Region(&x.Node) != a.Region {
			continue
		}
		excluded++
		for _, r := range x.Reasons {
			g := byMsg[r.Message]
			if g == nil {
				g = &group{msg: r.Message}
				byMsg[r.Message] = g
				groups = append(groups, g)
			}
			// A node with the same message twice is counted once.
			if g.n > 0 && g.last == x.Node.ID {
				continue
			}
			g.n, g.last = g.n+1, x.Node.ID
			if len(g.nodes) < maxReasonExamples {
				g.nodes = append(g.nodes, x.Node.ID)
			}
		}
	}
	prefix := ""
	if len(a.Replaced) > 0 {
		prefix = "lost on " + strings.Join(a.Replaced, ", ") + "; "
	}
	if excluded == 0 {
		return prefix + "no candidate node: no certified node in region " + a.Region
	}
	slices.SortStableFunc(groups, func(x, y *group) int { return y.n - x.n })
	head := fmt.Sprintf("no candidate node in %s (%d node(s) excluded): ", a.Region, excluded)
	var b strings.Builder
	b.WriteString(prefix + head)
	for i, g := range groups {
		who := "node " + g.nodes[0]
		if g.n > 1 {
			who = fmt.Sprintf("%d nodes: %s", g.n, strings.Join(g.nodes, ", "))
			if g.n > len(g.nodes) {
				who += ", …"
			}
		}
		part := clipBytes(g.msg, maxNoCandidatePart) + " (" + who + ")"
		if i > 0 {
			part = "; " + part
		}
		// The last reason always fits: the note on what was left out is
		// only for reasons that were.
		left := len(groups) - i
		if i == maxNoCandidateReasons || (left > 1 && b.Len()+len(part) > maxNoCandidateBytes-120) || b.Len()+len(part) > maxNoCandidateBytes {
			fmt.Fprintf(&b, "; and %d more reason(s), which a dry run of the spec in %s counts", left, a.Region)
			break
		}
		b.WriteString(part)
	}
	return b.String()
}

// finish moves a non-terminal run to a terminal state with a reason.
// A gang's rank ends with the rest of its gang settled in the same
// transaction (finishRank), so that no reader, and no broker that stops
// in between, ever has rank 0 failed and its ranks still waiting.
func (b *Broker) finish(ctx context.Context, rs store.Runs, a store.Alloc, st store.AllocState, reason string) (store.Alloc, error) {
	var out store.Alloc
	var err error
	if a.GangSize < 2 {
		out, err = rs.UpdateAlloc(ctx, a.ID, func(x *store.Alloc) error {
			if x.State.Terminal() {
				return errMoved
			}
			x.State, x.Reason, x.FinishedAt = st, reason, time.Now().UTC()
			return nil
		})
	} else {
		out, err = b.finishRank(ctx, rs, a, st, reason)
	}
	if errors.Is(err, errMoved) {
		return rs.Alloc(ctx, a.ID)
	}
	if err == nil {
		b.log.Info("run finished", "alloc", a.ID, "state", st, "reason", reason)
		b.runs.wakeRun(a.ID)
	}
	return out, err
}
