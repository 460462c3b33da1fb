package broker

import (
	"slices"
	"sync"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
)

// beatTable holds the newest heartbeat this broker took per agent, each
// agent in a slot of one array. Reading every node's beat one id at a
// time (a lock and a map lookup per node) cost a dry-run at 100,000 nodes
// tens of milliseconds, mostly cache misses in a map of 100,000 entries;
// a snapshot keeps its nodes' slots beside them (snapshot.slots), so that
// liveness for the whole registry is one pass over an array under one
// lock (Broker.liveness). Guarded by Broker.beatsMu. Slots are never
// freed: there is one per agent that beat or is in the registry, as the
// map of beats had.
type beatTable struct {
	slot  map[string]int32
	beats []store.Heartbeat // zero At: none taken yet
}

func newBeatTable() beatTable { return beatTable{slot: map[string]int32{}} }

// get returns the newest heartbeat taken from id.
func (t *beatTable) get(id string) (store.Heartbeat, bool) {
	i, ok := t.slot[id]
	if !ok || t.beats[i].At.IsZero() {
		return store.Heartbeat{}, false
	}
	return t.beats[i], true
}

// set keeps hb as the newest heartbeat of its agent.
func (t *beatTable) set(hb store.Heartbeat) {
	t.beats[t.slotOf(hb.AgentID)] = hb
}

// slotOf returns id's slot, making one if it has none.
func (t *beatTable) slotOf(id string) int32 {
	i, ok := t.slot[id]
	if !ok {
		i = int32(len(t.beats))
		t.slot[id] = i
		t.beats = append(t.beats, store.Heartbeat{})
	}
	return i
}

// slotsOf returns the slots of nodes, in order: prev's for the first
// len(prev) nodes (a snapshot whose nodes only grew at the end), new ones
// looked up or made for the rest. prev is not modified.
func (t *beatTable) slotsOf(nodes []store.Node, prev []int32) []int32 {
	if len(prev) == len(nodes) {
		return prev
	}
	out := slices.Grow(slices.Clone(prev), len(nodes)-len(prev))
	for _, n := range nodes[len(prev):] {
		out = append(out, t.slotOf(n.ID))
	}
	return out
}

// beatAt is a heartbeat as a match reads it: 16 bytes, no pointer (at
// 100,000 nodes, copying whole store.Heartbeats into fresh memory cost
// more in page faults than the map lookups it saves).
type beatAt = match.LiveBeat

// liveness returns, in dst's memory when it is large enough, the newest
// heartbeat this broker took from each of s's nodes, in s.nodes order
// (which is its index's order too). One lock for the whole registry.
func (b *Broker) liveness(s *snapshot, dst []beatAt) []beatAt {
	dst = slices.Grow(dst[:0], len(s.slots))[:len(s.slots)]
	b.beatsMu.RLock()
	for i, slot := range s.slots {
		hb := &b.seen.beats[slot]
		dst[i] = beatAt{RTTMS: hb.RTTMS}
		if !hb.At.IsZero() {
			dst[i].At = hb.At.UnixNano()
		}
	}
	b.beatsMu.RUnlock()
	return dst
}

// livePool holds liveness buffers for matches (1.6 MB at 100,000 nodes):
// a match copies what it needs, so a buffer is back in the pool as soon
// as the match returns.
var livePool sync.Pool

// match runs q against s's index with the liveness of s's nodes.
func (b *Broker) match(s *snapshot, q match.Query) match.Verdicts {
	var vs match.Verdicts
	b.live(s, &q, func() { vs = s.index.Match(q) })
	return vs
}

// gangs is match for the gangs of a spec that may need several nodes
// (match.Index.Gangs, given the match the dry-run lists), with the
// nodes' newest liveness; nothing for one that needs one node.
func (b *Broker) gangs(s *snapshot, q match.Query, listed *match.Verdicts) match.Gangs {
	var g match.Gangs
	if len(match.NodeCounts(q.Spec)) == 0 {
		return g
	}
	b.live(s, &q, func() { g = s.index.Gangs(q, listed) })
	return g
}

// live gives q the newest heartbeats and the held nodes for the length
// of f.
func (b *Broker) live(s *snapshot, q *match.Query, f func()) {
	var buf []beatAt
	if p, ok := livePool.Get().(*[]beatAt); ok {
		buf = *p
	}
	q.Live, q.Beat, q.Held = b.liveness(s, buf), nil, s.held
	if len(q.Live) != s.index.Len() {
		// Not the index's nodes (never expected): ask per node.
		q.Live, q.Beat = nil, b.beat
	}
	f()
	if q.Live != nil {
		livePool.Put(&q.Live)
	}
}
