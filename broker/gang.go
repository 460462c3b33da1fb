package broker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/spec"
)

// A run across several nodes (resources.nodes > 1) is a gang: rank 0's
// allocation is the run users see, ranks 1.. are allocations of their
// own (store.Alloc.Gang), each with its own lease, fence, log and
// report. The gang is placed whole or not at all (one store transaction),
// waits in the queue as a run does while its nodes are busy (holding
// none), and ends together: any rank that fails, is cancelled or loses
// its node stops the others, and the run succeeds only when every rank
// did.

// gangRanks are the allocations of a's gang, rank 0 first, and their ids.
func gangRanks(ctx context.Context, rs store.Runs, a store.Alloc) ([]store.Alloc, []string, error) {
	g := a.GangID()
	head := a
	if a.Gang != "" {
		var err error
		if head, err = rs.Alloc(ctx, g); err != nil {
			return nil, nil, err
		}
	}
	rest, err := rs.GangAllocs(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	all := append([]store.Alloc{head}, rest...)
	ids := make([]string, len(all))
	for i, x := range all {
		ids[i] = x.ID
	}
	return all, ids, nil
}

// gangTimeLeft is the time limit (seconds) of a's attempt: the run's
// whole limit on a first attempt, what is left of it since the gang
// first started on a restarted one (at least a second, so that the agent
// ends the attempt as timed out rather than running it unbounded).
func gangTimeLeft(a store.Alloc, now time.Time) int64 {
	if a.GangSize < 2 || a.Restarts == 0 || a.TimeLimitSeconds <= 0 || a.StartedAt.IsZero() {
		return a.TimeLimitSeconds
	}
	return max(a.TimeLimitSeconds-int64(now.Sub(a.StartedAt)/time.Second), 1)
}

// gangMayRestart says whether a rank's own end of its attempt (failed
// with reason, lost says its node was lost) restarts the whole gang:
// a failure or NaN while restarts remain (--max-restarts), a lost node
// with --resume-elsewhere. A time limit or a cancel ends the run.
func gangMayRestart(x *store.Alloc, reason string, lost bool) bool {
	if x.GangSize < 2 || x.EndedBy != "" || x.CancelRequested {
		return false
	}
	if lost {
		return x.ResumeElsewhere
	}
	return x.Restarts < x.MaxRestarts && !strings.HasPrefix(reason, "TIMEOUT")
}

// requeueRank ends x's part in its gang's attempt: it waits pending on no
// node for the gang's next attempt, which goes on from the records the
// broker holds (no record lost or sent twice across the restart).
func requeueRank(x *store.Alloc, why string) {
	x.State, x.NodeID, x.ScoreJSON = store.AllocPending, "", nil
	x.CancelRequested, x.EndedBy, x.RankDone = false, "", false
	x.MasterAddr, x.MasterPort = "", 0
	x.ResumeAfterSeq = x.HeldThrough
	x.GangRestart, x.Reason = why, "restarting the gang: "+why
}

// restartGang carries a gang's restart on once a rank asked for one
// (GangRestart on it): every rank still running is stopped, every rank
// whose attempt ended waits pending, and once all do, the gang is
// queued again (queued) for placement, all or nothing, avoiding lost
// nodes. under is false when no restart is under way.
func restartGang(as []*store.Alloc, changed *[]string) (under, queued bool) {
	if as[0].State.Terminal() {
		return false, false
	}
	why := ""
	for _, x := range as {
		if x.GangRestart != "" {
			why = x.GangRestart
			break
		}
	}
	if why == "" {
		return false, false
	}
	stopped := true
	for i, x := range as {
		switch {
		case x.State == store.AllocPending:
			if x.GangRestart == "" {
				x.GangRestart, x.Reason = why, "restarting the gang: "+why
				*changed = append(*changed, x.ID)
			}
		case x.State == store.AllocMatched || x.State.Terminal() || (i == 0 && x.RankDone):
			requeueRank(x, why)
			*changed = append(*changed, x.ID)
		default:
			stopped = false
			if !x.CancelRequested {
				x.CancelRequested, x.EndedBy, x.GangRestart = true, "restarting the gang: "+why, why
				*changed = append(*changed, x.ID)
			}
		}
	}
	if !stopped {
		return true, false
	}
	restarts := as[0].Restarts + 1
	var replaced []string
	for _, x := range as {
		for _, n := range x.Replaced {
			if !slices.Contains(replaced, n) {
				replaced = append(replaced, n)
			}
		}
	}
	for _, x := range as {
		x.GangRestart = ""
		x.Restarts, x.Attempts = restarts, max(x.Attempts, restarts+1)
		x.Replaced = replaced
		x.Reason = fmt.Sprintf("gang restart %d (attempt %d) from the last checkpoint: %s", restarts, restarts+1, why)
	}
	*changed = append(*changed, as[0].ID)
	return true, true
}

// gangAllocs are the ranks 1..nodes-1 stored with rank 0 a.
func gangAllocs(a store.Alloc, nodes int) []store.Alloc {
	out := []store.Alloc{a}
	for r := 1; r < nodes; r++ {
		x := a
		x.ID, x.Gang, x.Rank, x.Name = fmt.Sprintf("%s-r%d", a.ID, r), a.ID, r, fmt.Sprintf("%s/%d", a.Name, r)
		// A rank is no member of the submission's group: the group's
		// runs are rank 0s, one per region.
		x.Group, x.GroupSize = "", 0
		out = append(out, x)
	}
	return out
}

// placeGang is place for rank 0 of a gang: the matcher picks k nodes of
// one accelerator and runtime in the run's region that advertise a
// rendezvous, and the store leases every rank in one transaction. With a
// gang whose nodes are busy the run waits (holding nothing); with none
// it fails with the matcher's reason, and so do its ranks.
func (b *Broker) placeGang(ctx context.Context, rs store.Runs, a store.Alloc, sp *spec.Spec, snap *snapshot, active []store.Alloc, claimed, skip map[string]bool, placeStart time.Time) (store.Alloc, error) {
	k := sp.Resources.Nodes
	ranks, ids, err := gangRanks(ctx, rs, a)
	if err != nil {
		return a, err
	}
	if len(ranks) != k {
		return b.finish(ctx, rs, a, store.AllocFailed, fmt.Sprintf("the run has %d rank(s) stored, its spec %d nodes", len(ranks), k))
	}
	busy := map[string]bool{}
	for _, x := range active {
		if x.GangID() != a.ID && x.NodeID != "" {
			busy[x.NodeID] = true
		}
	}
	q := match.Query{Spec: sp, Scope: []string{a.Region}, Regions: []string{a.Region}, MinScore: a.MinScore, MaxPrice: a.MaxPrice,
		Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter}
	// As for a one-node run (place): a gang new enough that another
	// replica may know of nodes this one has not read yet is matched
	// again on a fresh read, then waits for that news before it fails.
	news := b.awaitsNews(a)
	var pick match.GangPick
	for fresh := false; ; fresh = true {
		q.Now = time.Now()
		b.live(snap, &q, func() {
			pick = snap.index.PlaceGang(q, k, func(id string) bool { return skip[id] }, func(id string) bool { return !busy[id] && !claimed[id] })
		})
		if pick.Nodes != nil || len(pick.Busy) > 0 || !news || fresh {
			break
		}
		if snap, err = b.refresh(ctx, time.Now().Add(-b.cfg.FlushInterval/5)); err != nil {
			return a, err
		}
	}
	if pick.Nodes == nil {
		if len(pick.Busy) > 0 {
			return b.wait(ctx, rs, a, active, pick.Busy)
		}
		if news {
			return b.waitForNews(ctx, rs, a, "no gang yet")
		}
		prefix := ""
		if len(a.Replaced) > 0 {
			prefix = "lost on " + strings.Join(a.Replaced, ", ") + "; "
		}
		return b.finish(ctx, rs, a, store.AllocFailed, fmt.Sprintf("%sno gang of %d nodes in %s: %s", prefix, k, a.Region, pick.Miss))
	}
	head := pick.Nodes[0].Node.Labels
	port, err := drawPort(head.JobPortMin, head.JobPortMax)
	if err != nil {
		return a, err
	}
	leased, err := rs.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
		for i, x := range as {
			if x.State != store.AllocPending {
				return errMoved
			}
			c := pick.Nodes[i]
			score, _ := json.Marshal(c.Score)
			x.State, x.NodeID, x.Fence, x.ScoreJSON = store.AllocMatched, c.Node.ID, newFence(x.Fence), score
			x.PricePerHour, x.Simulated, x.Reason = match.Price(&c.Node), c.Node.Index.Simulated, ""
			x.QueuedAt, x.QueueNodes, x.QueueNodeCount = time.Time{}, nil, 0
			x.MasterAddr, x.MasterPort = head.JobAddress, port
		}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNodeBusy):
		// A node was taken since ActiveAllocs was read: nothing was
		// leased; wait as for a busy gang.
		var nodes []string
		for _, c := range pick.Nodes {
			nodes = append(nodes, c.Node.ID)
		}
		return b.wait(ctx, rs, a, active, nodes)
	case errors.Is(err, errMoved):
		return rs.Alloc(ctx, a.ID)
	case err != nil:
		return a, err
	}
	for _, x := range leased {
		b.runs.wakeNode(x.NodeID)
	}
	b.log.Info("gang placed", "alloc", a.ID, "nodes", len(leased), "master", leased[0].NodeID, "port", port)
	b.metrics.Placed(time.Since(placeStart), time.Since(leased[0].CreatedAt))
	b.runs.wakeRun(a.ID)
	return leased[0], nil
}

// drawPort draws the rendezvous port of a gang attempt from rank 0's job
// port range: a fresh one each attempt, so a port a dead attempt's
// process still holds is not reused at once.
func drawPort(lo, hi int) (int, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(int64(hi-lo+1)))
	if err != nil {
		return 0, fmt.Errorf("drawing a rendezvous port: %w", err)
	}
	return lo + int(n.Int64()), nil
}

// rankWhy is why a gang ended, naming the rank: "rank 1 on agt-…:
// exited with code 3".
func rankWhy(x *store.Alloc) string {
	on := ""
	if x.NodeID != "" {
		on = " on " + x.NodeID
	}
	own := x.Reason
	if x.RankReason != "" {
		own = x.RankReason
	}
	return fmt.Sprintf("rank %d%s: %s", x.Rank, on, own)
}

// maxGangReasons bounds the ranks a gang's reason names.
const maxGangReasons = 3

// gangWhy is why a gang ended: each rank that failed or was cancelled on
// its own (not stopped by the broker for another), the first to be
// reported first. When a rank dies its peers usually fail too, within
// the same second and in no useful order, so all of them are named.
func gangWhy(as []*store.Alloc) string {
	var ended []*store.Alloc
	for _, x := range as {
		if (x.State == store.AllocFailed || x.State == store.AllocCancelled) && x.EndedBy == "" {
			ended = append(ended, x)
		}
	}
	slices.SortStableFunc(ended, func(x, y *store.Alloc) int { return x.FinishedAt.Compare(y.FinishedAt) })
	var parts []string
	for i, x := range ended {
		if i == maxGangReasons {
			parts = append(parts, fmt.Sprintf("and %d more rank(s)", len(ended)-i))
			break
		}
		parts = append(parts, rankWhy(x))
	}
	return strings.Join(parts, "; ")
}

// settleRanks is settleGang's change to the gang's ranks as (rank 0
// first), within the store's transaction: it appends the ranks it
// changed and says whether the gang was queued again to restart.
func settleRanks(as []*store.Alloc, now time.Time, changed *[]string) (queued bool) {
	under, queued := restartGang(as, changed)
	if under {
		return queued
	}
	why := gangWhy(as)
	if why == "" {
		for i, x := range as {
			if !(x.State == store.AllocSucceeded || (i == 0 && x.RankDone)) {
				return queued // still running, and nothing failed
			}
		}
		if !as[0].State.Terminal() {
			as[0].State, as[0].FinishedAt, as[0].Reason = store.AllocSucceeded, now, "every rank succeeded"
			*changed = append(*changed, as[0].ID)
		}
		return queued
	}
	if head := as[0]; head.State == store.AllocFailed && head.EndedBy == "" && why != rankWhy(head) && head.Reason != why {
		// Rank 0 ended on its own, but not alone: the run's reason
		// names every rank that did.
		if head.RankReason == "" {
			head.RankReason = head.Reason
		}
		head.Reason = why
		*changed = append(*changed, head.ID)
	}
	for i, x := range as {
		switch {
		case x.State.Terminal():
		case x.State == store.AllocPending || x.State == store.AllocMatched:
			x.State, x.FinishedAt, x.EndedBy, x.Reason = store.AllocCancelled, now, why, why
			if i == 0 {
				x.State = store.AllocFailed
			}
			*changed = append(*changed, x.ID)
		case i == 0 && x.RankDone:
			x.State, x.FinishedAt, x.Reason = store.AllocFailed, now, why
			*changed = append(*changed, x.ID)
		case !x.CancelRequested:
			x.CancelRequested, x.EndedBy, x.Reason = true, why, why
			*changed = append(*changed, x.ID)
		}
	}
	return queued
}

// finishRank is finish for a rank of a gang: a's state and reason, and
// settleRanks on the gang, in one transaction of the store (no
// settleGang after it: nothing would be left to change, and finish is
// called only for a rank 0 being placed, whose gang is never queued to
// restart by this).
func (b *Broker) finishRank(ctx context.Context, rs store.Runs, a store.Alloc, st store.AllocState, reason string) (store.Alloc, error) {
	_, ids, err := gangRanks(ctx, rs, a)
	if err != nil {
		return a, err
	}
	now := time.Now().UTC()
	var changed []string
	outs, err := rs.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
		changed = changed[:0]
		for _, x := range as {
			if x.ID != a.ID {
				continue
			}
			if x.State.Terminal() {
				return errMoved
			}
			x.State, x.Reason, x.FinishedAt = st, reason, now
		}
		settleRanks(as, now, &changed)
		return nil
	})
	if err != nil {
		return a, err
	}
	for _, x := range outs {
		if slices.Contains(changed, x.ID) {
			b.runs.wakeRun(x.ID)
			b.runs.wakeNode(x.NodeID)
		}
	}
	for _, x := range outs {
		if x.ID == a.ID {
			return x, nil
		}
	}
	return a, fmt.Errorf("gang %s: rank %s not among its ranks", a.GangID(), a.ID)
}

// settleGang ends a's gang together after one of its ranks changed:
// when a rank failed or was cancelled (by its own node or the user, not
// by this), the others are stopped (cancelled before they started,
// asked to cancel once they have) and rank 0, the run, fails naming the
// rank; when every rank has succeeded, rank 0 succeeds.
func (b *Broker) settleGang(ctx context.Context, rs store.Runs, a store.Alloc) {
	if a.GangSize < 2 {
		return
	}
	_, ids, err := gangRanks(ctx, rs, a)
	if err != nil {
		b.log.Error("reading gang", "alloc", a.ID, "err", err)
		return
	}
	now := time.Now().UTC()
	var changed []string
	queued := false
	out, err := rs.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
		changed = changed[:0]
		queued = settleRanks(as, now, &changed)
		return nil
	})
	if err != nil {
		b.log.Error("ending gang together", "alloc", a.ID, "err", err)
		return
	}
	for _, x := range out {
		if len(changed) > 0 {
			b.runs.wakeRun(x.ID)
			b.runs.wakeNode(x.NodeID)
		}
	}
	if len(changed) > 0 {
		b.log.Info("gang settled", "run", ids[0], "changed", changed, "state", out[0].State, "reason", out[0].Reason)
	}
	if queued {
		if _, err := b.place(ctx, rs, ids[0]); err != nil {
			b.log.Error("placing restarted gang", "run", ids[0], "err", err)
		}
	}
}

// gangProto is the rank's place in its gang for its agent; nil for a
// one-node run.
func gangProto(a store.Alloc) *gpupassv1.GangRank {
	if a.GangSize < 2 {
		return nil
	}
	return &gpupassv1.GangRank{RunId: a.GangID(), NodeRank: int32(a.Rank), Nodes: int32(a.GangSize), LocalRanks: 1,
		MasterAddr: a.MasterAddr, MasterPort: int32(a.MasterPort), RequireBandwidth: a.RequireBandwidth}
}
