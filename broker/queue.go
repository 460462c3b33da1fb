package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// The queue (issue #35). A pending run whose region has certified nodes
// that could take it, all busy, waits in its region's queue: the region's
// waiting runs in the order they began waiting (Alloc.QueuedAt, then id),
// as the store holds them, so every replica sees one queue. Each waiting
// run records the busy nodes that could take it (QueueNodes). Placement
// is first come first placed: a run may take a free node only when no run
// ahead of it in the queue could take that node (a new submission is
// behind every waiting run). Runs that wait for other nodes (another
// accelerator class) do not hold each other up. A run's queue position
// is 1 plus the runs ahead of it that wait for one of its nodes.

// maxQueueRead bounds one read of a region's queue for positions.
const maxQueueRead = 1000

// queuedBefore reports whether y is ahead of x in the queue: x is not
// waiting yet (a new run goes to the back) or y began waiting first.
func queuedBefore(y, x store.Alloc) bool {
	if y.ID == x.ID || y.QueuedAt.IsZero() {
		return false
	}
	if x.QueuedAt.IsZero() {
		return true
	}
	if !y.QueuedAt.Equal(x.QueuedAt) {
		return y.QueuedAt.Before(x.QueuedAt)
	}
	return y.ID < x.ID
}

// queueClaims are the nodes the runs ahead of a in its region's queue
// wait for: a may not take one of them when it frees. active is every
// non-terminal run (the store's ActiveAllocs).
func queueClaims(a store.Alloc, active []store.Alloc) map[string]bool {
	claimed := map[string]bool{}
	for _, y := range active {
		if y.State == store.AllocPending && y.Region == a.Region && queuedBefore(y, a) {
			for _, n := range y.QueueNodes {
				claimed[n] = true
			}
		}
	}
	return claimed
}

// queuePosition is a's place in its region's queue (runs holds it, or
// at least the runs ahead of it): 1 plus the runs ahead of it that wait
// for one of its nodes; 0 when a is not waiting.
func queuePosition(a store.Alloc, runs []store.Alloc) int {
	if a.State != store.AllocPending || a.QueuedAt.IsZero() {
		return 0
	}
	pos := 1
	for _, y := range runs {
		if y.State == store.AllocPending && y.Region == a.Region && queuedBefore(y, a) &&
			slices.ContainsFunc(y.QueueNodes, func(n string) bool { return slices.Contains(a.QueueNodes, n) }) {
			pos++
		}
	}
	return pos
}

// queueNodes is the sorted, bounded list of nodes a waiting run records.
func queueNodes(ids []string) ([]string, int) {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	n := len(ids)
	if n > store.MaxQueueNodes {
		ids = ids[:store.MaxQueueNodes]
	}
	return ids, n
}

// queueTimedOut reports whether a waiting run has waited its queue
// timeout out at now.
func queueTimedOut(a store.Alloc, now time.Time) bool {
	return a.QueueTimeoutSeconds > 0 && !a.QueuedAt.IsZero() &&
		now.Sub(a.QueuedAt) >= time.Duration(a.QueueTimeoutSeconds)*time.Second
}

// queueTimeoutReason is why a run that waited its queue timeout out
// failed: how long, where it stood, for how many busy nodes, and the fix.
func queueTimeoutReason(a store.Alloc, pos int) string {
	nodes := "nodes"
	if a.QueueNodeCount == 1 {
		nodes = "node"
	}
	return fmt.Sprintf("waited %s in the queue at position %d for %d busy certified %s in %s: raise --queue-timeout or add nodes",
		time.Duration(a.QueueTimeoutSeconds)*time.Second, pos, a.QueueNodeCount, nodes, a.Region)
}

// runsProto is runProto for runs a client reads, with the queue position
// of each waiting one, from its region's queue as the store holds it
// (one read per region among them).
func (b *Broker) runsProto(ctx context.Context, rs store.Runs, as []store.Alloc) []*gpupassv1.Run {
	queues := map[string][]store.Alloc{}
	out := make([]*gpupassv1.Run, 0, len(as))
	for _, a := range as {
		r := b.runView(a)
		if a.State == store.AllocPending && !a.QueuedAt.IsZero() {
			q, ok := queues[a.Region]
			if !ok {
				var err error
				if q, err = rs.QueuedAllocs(ctx, a.Region, maxQueueRead); err != nil {
					// The run is shown without its position rather
					// than not at all.
					b.log.Error("reading the queue", "region", a.Region, "err", err)
				}
				queues[a.Region] = q
			}
			r.QueuePosition = int32(queuePosition(a, q))
		}
		out = append(out, r)
	}
	return out
}

// runProtoQ is runsProto of one run.
func (b *Broker) runProtoQ(ctx context.Context, rs store.Runs, a store.Alloc) *gpupassv1.Run {
	return b.runsProto(ctx, rs, []store.Alloc{a})[0]
}

// wait keeps a run whose candidates are all busy (or waited for by runs
// ahead of it) in its region's queue: it joins at the back the first
// time, its nodes are brought up to date, and past its queue timeout it
// fails with where it stood.
func (b *Broker) wait(ctx context.Context, rs store.Runs, a store.Alloc, active []store.Alloc, waitFor []string) (store.Alloc, error) {
	nodes, count := queueNodes(waitFor)
	now := time.Now().UTC()
	if queueTimedOut(a, now) {
		a.QueueNodes, a.QueueNodeCount = nodes, count
		return b.finish(ctx, rs, a, store.AllocFailed, queueTimeoutReason(a, queuePosition(a, active)))
	}
	if !a.QueuedAt.IsZero() && slices.Equal(a.QueueNodes, nodes) && a.QueueNodeCount == count {
		return a, nil
	}
	out, err := rs.UpdateAlloc(ctx, a.ID, func(x *store.Alloc) error {
		if x.State != store.AllocPending {
			return errMoved
		}
		if x.QueuedAt.IsZero() {
			x.QueuedAt = now
			switch {
			case strings.Contains(x.Reason, "waiting for news"):
				x.Reason = "waiting for a free node"
			case !strings.Contains(x.Reason, "waiting for a free node"):
				x.Reason = strings.TrimPrefix(x.Reason+"; ", "; ") + "waiting for a free node"
			}
		}
		x.QueueNodes, x.QueueNodeCount = nodes, count
		return nil
	})
	if errors.Is(err, errMoved) {
		return rs.Alloc(ctx, a.ID)
	}
	if err == nil && a.QueuedAt.IsZero() {
		b.log.Info("run queued", "alloc", a.ID, "region", a.Region, "busy_nodes", count)
		b.runs.wakeRun(a.ID)
	}
	return out, err
}
