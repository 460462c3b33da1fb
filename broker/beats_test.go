package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// The beats a snapshot's liveness gives are each node's own, in node
// order, as a snapshot grows and as beats arrive; a slot made for a node
// that never beat is no beat.
func TestLivenessFollowsSnapshotNodes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	b := &Broker{seen: newBeatTable()}
	beat := func(id string, s int, rtt float64) store.Heartbeat {
		hb := store.Heartbeat{AgentID: id, At: t0.Add(time.Duration(s) * time.Second), RTTMS: rtt}
		b.beatsMu.Lock()
		b.seen.set(hb)
		b.beatsMu.Unlock()
		return hb
	}
	nodes := func(ids ...string) []store.Node {
		out := make([]store.Node, len(ids))
		for i, id := range ids {
			out[i].ID = id
		}
		return out
	}
	snap := func(prev *snapshot, ids ...string) *snapshot {
		s := &snapshot{nodes: nodes(ids...)}
		var slots []int32
		if prev != nil {
			slots = prev.slots
		}
		b.beatsMu.Lock()
		s.slots = b.seen.slotsOf(s.nodes, slots)
		b.beatsMu.Unlock()
		return s
	}
	none := beatAt{}
	at := func(hbs ...store.Heartbeat) []beatAt {
		out := make([]beatAt, len(hbs))
		for i, hb := range hbs {
			out[i] = beatAt{At: hb.At.UnixNano(), RTTMS: hb.RTTMS}
		}
		return out
	}
	var buf []beatAt
	live := func(s *snapshot) []beatAt {
		buf = b.liveness(s, buf) // the buffer reused, as a caller would
		return buf
	}

	x := beat("x", 1, 3) // beats before any snapshot, not in the registry
	c := beat("c", 1, 5)
	s1 := snap(nil, "a", "b", "c")
	a := beat("a", 2, 7)
	if diff := cmp.Diff(append(at(a), none, at(c)[0]), live(s1)); diff != "" {
		t.Errorf("liveness of a, b, c (-want +got):\n%s", diff)
	}
	if _, ok := b.beat("b"); ok {
		t.Error("b has a slot but never beat, and beat(b) says it did")
	}
	bb := beat("b", 3, 1)
	c = beat("c", 4, 6)
	s2 := snap(s1, "a", "b", "c", "d", "x") // grown at the end, as an incremental refresh does
	if len(s1.slots) != 3 {
		t.Fatalf("growing a snapshot changed its predecessor's slots: %v", s1.slots)
	}
	d := beat("d", 5, 2)
	if diff := cmp.Diff(at(a, bb, c, d, x), live(s2)); diff != "" {
		t.Errorf("liveness of a, b, c, d, x (-want +got):\n%s", diff)
	}
	s3 := snap(nil, "x", "c") // a full read: positions change
	if diff := cmp.Diff(at(x, c), live(s3)); diff != "" {
		t.Errorf("liveness after a full read (-want +got):\n%s", diff)
	}
	for _, want := range []store.Heartbeat{a, bb, c, d, x} {
		if got, ok := b.beat(want.AgentID); !ok || got != want {
			t.Errorf("beat(%s) = %v, %v; want %v", want.AgentID, got, ok, want)
		}
	}
}

// BenchmarkLiveness: every node's newest beat for one dry-run, with every
// node beating this broker: one b.beat per node (a lock and a map lookup
// each, what a match asks through match.Query.Beat) against one
// b.liveness of the snapshot.
func BenchmarkLiveness(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		br := &Broker{seen: newBeatTable()}
		s := &snapshot{nodes: make([]store.Node, n)}
		now := time.Now()
		for i := range s.nodes {
			s.nodes[i].ID = fmt.Sprintf("agt-%016x", i*7919)
		}
		s.slots = br.seen.slotsOf(s.nodes, nil)
		// Beats arrive in any order.
		for i := range s.nodes {
			j := (i * 7) % n
			br.seen.set(store.Heartbeat{AgentID: s.nodes[j].ID, At: now, RTTMS: 1})
		}
		b.Run(fmt.Sprintf("nodes=%d/per-node", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				for _, nd := range s.nodes {
					if _, ok := br.beat(nd.ID); !ok {
						b.Fatal("no beat")
					}
				}
			}
		})
		b.Run(fmt.Sprintf("nodes=%d/snapshot", n), func(b *testing.B) {
			var buf []beatAt
			for i := 0; i < b.N; i++ {
				if buf = br.liveness(s, buf); buf[n-1].At == 0 {
					b.Fatal("no beat")
				}
			}
		})
	}
}
