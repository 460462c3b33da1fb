package broker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
)

// The relay's payloads: wake-ups queued between two sends go out as one
// signal, a node named twice once; more nodes than a payload holds become
// "every node"; a replica ignores its own signals and anything that is
// not a relay signal.
func TestRelayPayloads(t *testing.T) {
	r, other := newRelay(nil), newRelay(nil)
	if p := r.take(); p != "" {
		t.Fatalf("nothing queued: payload %q, want none", p)
	}
	r.node("agt-1")
	r.node("agt-2")
	r.node("agt-1")
	p := r.take()
	changes, nodes, all, ok := other.parseSignal(p)
	slices.Sort(nodes)
	if !ok || changes || all || !slices.Equal(nodes, []string{"agt-1", "agt-2"}) {
		t.Errorf("two nodes (one named twice): %q reads changes=%v nodes=%v all=%v ok=%v", p, changes, nodes, all, ok)
	}
	if _, _, _, ok := r.parseSignal(p); ok {
		t.Errorf("a replica acts on its own signal %q", p)
	}
	if p := r.take(); p != "" {
		t.Errorf("after a take: payload %q, want none", p)
	}
	r.changed()
	if changes, nodes, all, ok := other.parseSignal(r.take()); !ok || !changes || len(nodes) != 0 || all {
		t.Errorf("a run changed: changes=%v nodes=%v all=%v ok=%v", changes, nodes, all, ok)
	}
	for i := 0; i < store.MaxSignal/10; i++ {
		r.node(fmt.Sprintf("agt-%016x", i))
	}
	p = r.take()
	if len(p) > store.MaxSignal {
		t.Fatalf("payload of %d bytes, over the %d a signal takes", len(p), store.MaxSignal)
	}
	if _, nodes, all, ok := other.parseSignal(p); !ok || !all || len(nodes) != 0 {
		t.Errorf("more nodes than a payload holds: %q… reads nodes=%d all=%v ok=%v, want every node", p[:min(len(p), 40)], len(nodes), all, ok)
	}
	for _, junk := range []string{"", "gp1", "gp2 x c", "hello world again"} {
		if _, _, _, ok := other.parseSignal(junk); ok {
			t.Errorf("parseSignal(%q) took it for a relay signal", junk)
		}
	}
	var nilRelay *relay
	nilRelay.changed() // a store that is not shared: no relay, no panic
	nilRelay.node("agt-1")
}
