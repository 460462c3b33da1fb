package broker

import (
	"slices"

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
type beatAt struct {
	at  int64 // unix nanoseconds; 0: none taken
	rtt float64
}

// liveness returns, in dst's memory when it is large enough, the newest
// heartbeat this broker took from each of s's nodes, in s.nodes order
// (which is its index's order too). One lock for the whole registry.
func (b *Broker) liveness(s *snapshot, dst []beatAt) []beatAt {
	dst = slices.Grow(dst[:0], len(s.slots))[:len(s.slots)]
	b.beatsMu.RLock()
	for i, slot := range s.slots {
		hb := &b.seen.beats[slot]
		dst[i] = beatAt{rtt: hb.RTTMS}
		if !hb.At.IsZero() {
			dst[i].at = hb.At.UnixNano()
		}
	}
	b.beatsMu.RUnlock()
	return dst
}
