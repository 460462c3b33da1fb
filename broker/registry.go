package broker

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
)

// The registry snapshot: the store is the source of truth; each broker
// keeps an in-memory copy of it, prepared for matching (match.Index), so a
// dry-run over 10,000 nodes is a walk over memory, not a store read. The
// copy is refreshed from the store by what changed since the last read
// (NodesUpdatedSince, Liveness), so two brokers on one PostgreSQL converge
// within about SnapshotTTL; this broker's own registry writes (enrollment,
// reports) drop it, so callers read their own writes.

// snapshot is one read of the registry. It is never modified once
// published: refreshes build a new one.
type snapshot struct {
	nodes []store.Node
	pos   map[string]int // node id -> index in nodes
	// slots are nodes' slots in Broker.seen, in nodes order: the
	// heartbeats this broker took from them (Broker.liveness).
	slots    []int32
	launches map[string]store.LaunchStats
	index    *match.Index
	at       time.Time // when it was read
	full     time.Time // when it was last read in full
	writes   uint64    // Broker.writes when the read began
	// decided are the admission decisions by agent id; held the nodes
	// that may take no run (pending or denied admission), with why
	// (admission.go). Both nil when nothing is held.
	decided map[string]store.Admission
	held    map[string]match.Reason
}

// Registry refresh: in between full reads only what changed since the
// last read (entries re-indexed, beats), looking back refreshMargin to
// cover commits that land after their timestamp, the heartbeat flush delay
// and clock skew between replicas. The full read every fullRefresh is a
// safety net for a commit later than the margin; at 10,000 nodes it costs
// about as much CPU as a hundred dry-runs, so it is rare.
const (
	fullRefresh   = 5 * time.Minute
	refreshMargin = 2 * time.Second
	// minBackgroundTTL: below it (tests) calls refresh the snapshot
	// themselves and no loop runs.
	minBackgroundTTL = 100 * time.Millisecond
)

// snapshot returns the registry snapshot, refreshing it first when this
// broker wrote to the registry since it was read, or when it is older than
// the TTL (twice the TTL when the background loop keeps it fresh).
func (b *Broker) snapshot(ctx context.Context) (*snapshot, error) {
	b.snapMu.Lock()
	s, writes := b.snap, b.writes
	b.snapMu.Unlock()
	maxAge := b.cfg.SnapshotTTL
	if maxAge >= minBackgroundTTL {
		maxAge *= 2
	}
	if s != nil && s.writes == writes && time.Since(s.at) < maxAge {
		return s, nil
	}
	return b.refresh(ctx, time.Time{})
}

// refreshInBackground keeps the snapshot fresh so calls never wait for it.
func (b *Broker) refreshInBackground(ctx context.Context) error {
	_, err := b.refresh(ctx, time.Now())
	return err
}

// refresh reads the registry again, unless the snapshot is already good
// enough: one whose read began at or after readAfter, or with readAfter
// zero one younger than the TTL. Either way no write through this broker
// may have come since. Callers that wait for their turn here share the
// read that the first of them made.
func (b *Broker) refresh(ctx context.Context, readAfter time.Time) (*snapshot, error) {
	b.refreshMu.Lock()
	defer b.refreshMu.Unlock()
	b.snapMu.Lock()
	old, writes := b.snap, b.writes
	b.snapMu.Unlock()
	fresh := !readAfter.IsZero() && old != nil && !old.at.Before(readAfter)
	if readAfter.IsZero() && old != nil {
		fresh = time.Since(old.at) < b.cfg.SnapshotTTL
	}
	if fresh && old.writes == writes {
		return old, nil
	}
	now := time.Now()
	next := &snapshot{at: now, writes: writes}
	changedAny := true
	full := old == nil || now.Sub(old.full) >= fullRefresh
	prev := old
	if full {
		prev = nil
	}
	decisions, err := b.readAdmissions(ctx, next, prev)
	if err != nil {
		return nil, err
	}
	if full {
		nodes, err := b.store.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		next.nodes, next.full = nodes, now
		next.pos = make(map[string]int, len(nodes))
		for i, n := range nodes {
			next.pos[n.ID] = i
		}
	} else {
		changed, err := b.store.NodesUpdatedSince(ctx, old.at.Add(-refreshMargin))
		if err != nil {
			return nil, err
		}
		live, err := b.store.Liveness(ctx, old.at.Add(-refreshMargin))
		if err != nil {
			return nil, err
		}
		changedAny = len(changed) > 0
		next.nodes, next.pos, next.full = old.nodes, old.pos, old.full
		if changedAny || newer(old, live) {
			// Copy on write: published snapshots are never modified.
			next.nodes = slices.Clone(old.nodes)
		}
		for _, n := range changed {
			i, ok := next.pos[n.ID]
			if !ok {
				if len(next.pos) == len(old.pos) {
					next.pos = maps.Clone(old.pos)
				}
				i = len(next.nodes)
				next.nodes = append(next.nodes, n)
				next.pos[n.ID] = i
			}
			// Keep the newer liveness: the row may predate a beat we hold.
			if prev := next.nodes[i]; prev.LastSeen.After(n.LastSeen) {
				n.LastSeen, n.RTTMS = prev.LastSeen, prev.RTTMS
			}
			next.nodes[i] = n
		}
		for _, hb := range live {
			if i, ok := next.pos[hb.AgentID]; ok && hb.At.After(next.nodes[i].LastSeen) {
				next.nodes[i].LastSeen, next.nodes[i].RTTMS = hb.At, hb.RTTMS
			}
		}
	}
	// Nodes keep their positions between full reads; new ones are
	// appended (above), so only theirs need a slot.
	var prevSlots []int32
	if old != nil && next.full == old.full {
		prevSlots = old.slots
	}
	b.beatsMu.Lock()
	next.slots = b.seen.slotsOf(next.nodes, prevSlots)
	b.beatsMu.Unlock()
	launches, err := b.store.LaunchStats(ctx, now.Add(-24*time.Hour))
	if err != nil {
		return nil, err
	}
	next.launches = launches
	if changedAny || decisions || old == nil {
		b.holdNodes(next)
	} else {
		// The same nodes in the same regions, and no new decision: a
		// pass over every node (milliseconds at 10,000) would find
		// what old did, on every refresh that only moved liveness.
		next.held = old.held
	}
	if !changedAny && old != nil && len(next.nodes) == len(old.nodes) && maps.Equal(launches, old.launches) && sameHeld(next.held, old.held) {
		// Only liveness moved: the match keys and score terms stand.
		next.index = old.index.WithNodes(next.nodes)
	} else {
		next.index = match.PrepareHeld(next.nodes, launches, next.held)
	}
	b.snapMu.Lock()
	b.snap = next
	b.snapMu.Unlock()
	return next, nil
}

// newer reports whether any beat in live is newer than what s holds.
func newer(s *snapshot, live []store.Heartbeat) bool {
	for _, hb := range live {
		if i, ok := s.pos[hb.AgentID]; ok && hb.At.After(s.nodes[i].LastSeen) {
			return true
		}
	}
	return false
}

// invalidate makes the next read refresh the snapshot (incrementally)
// after a registry write through this broker, so callers read their writes.
func (b *Broker) invalidate() {
	b.snapMu.Lock()
	b.writes++
	b.snapMu.Unlock()
}
