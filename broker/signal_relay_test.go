package broker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
)

// The relay's payloads: wake-ups queued between two sends go out as one
// signal, a key named twice once; more keys than a payload holds become
// "everyone"; a replica ignores its own signals, anything that is not a
// relay signal, and keys that are neither a run's nor a node's.
func TestRelayPayloads(t *testing.T) {
	r, other := newRelay(nil), newRelay(nil)
	if p := r.take(); p != "" {
		t.Fatalf("nothing queued: payload %q, want none", p)
	}
	r.add(nodeKey("agt-1"))
	r.add(runKey("alloc-1"))
	r.add(nodeKey("agt-1"))
	p := r.take()
	keys, all, ok := other.parseSignal(p)
	slices.Sort(keys)
	if !ok || all || !slices.Equal(keys, []string{"n:agt-1", "r:alloc-1"}) {
		t.Errorf("a node (named twice) and a run: %q reads keys=%v all=%v ok=%v", p, keys, all, ok)
	}
	if _, _, ok := r.parseSignal(p); ok {
		t.Errorf("a replica acts on its own signal %q", p)
	}
	if p := r.take(); p != "" {
		t.Errorf("after a take: payload %q, want none", p)
	}
	for i := 0; i < store.MaxSignal/10; i++ {
		r.add(runKey(fmt.Sprintf("alloc-%016x", i)))
	}
	p = r.take()
	if len(p) > store.MaxSignal {
		t.Fatalf("payload of %d bytes, over the %d a signal takes", len(p), store.MaxSignal)
	}
	if keys, all, ok := other.parseSignal(p); !ok || !all || len(keys) != 0 {
		t.Errorf("more keys than a payload holds: %q… reads keys=%d all=%v ok=%v, want everyone", p[:min(len(p), 40)], len(keys), all, ok)
	}
	if keys, _, ok := other.parseSignal("gp1 sometag x:evil r:alloc-2"); !ok || !slices.Equal(keys, []string{"r:alloc-2"}) {
		t.Errorf("a key of another kind: keys=%v ok=%v, want it skipped", keys, ok)
	}
	for _, junk := range []string{"", "gp1", "gp2 x r:a", "hello world again"} {
		if _, _, ok := other.parseSignal(junk); ok {
			t.Errorf("parseSignal(%q) took it for a relay signal", junk)
		}
	}
	var nilRelay *relay
	nilRelay.add(runKey("alloc-1")) // a store that is not shared: no relay, no panic
}

// Waiters on a key share one channel, closed by its wake-up; a key's
// entry goes when its last waiter stops waiting (a run nobody follows
// any more holds no memory), and a wake-up of one key wakes no other.
func TestRunsStateWaits(t *testing.T) {
	r := newRunsState()
	a, releaseA := r.wait(runKey("alloc-1"))
	b, releaseB := r.wait(runKey("alloc-1"))
	n, releaseN := r.wait(nodeKey("agt-1"))
	if a != b || r.waiting() != 2 {
		t.Fatalf("two waiters on one run: same channel %v, %d keys waited on; want one channel, 2 keys", a == b, r.waiting())
	}
	r.wakeRun("alloc-1")
	select {
	case <-a:
	default:
		t.Fatal("the run's wake-up did not close its waiters' channel")
	}
	select {
	case <-n:
		t.Fatal("a run's wake-up woke a node's poll")
	default:
	}
	releaseA()
	releaseB()
	releaseN()
	releaseN() // twice: no effect
	if r.waiting() != 0 {
		t.Errorf("%d keys still waited on after every waiter released, want 0", r.waiting())
	}
	c, releaseC := r.wait(runKey("alloc-1"))
	if c == a {
		t.Error("a wait after the wake-up got the closed channel")
	}
	r.wakeAllHere()
	select {
	case <-c:
	default:
		t.Error("wakeAllHere left a waiter waiting")
	}
	releaseC()
	if r.waiting() != 0 {
		t.Errorf("%d keys waited on, want 0", r.waiting())
	}
}
