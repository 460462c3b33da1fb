package broker_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// Gangs (issue #34) across broker replicas on one PostgreSQL: the store
// transaction that leases every rank at once is what makes a gang all or
// nothing whichever replica places it, and a gang waits for news and
// for freed nodes as a one-node run does.

// gangNode is an H100 node that takes ranks of a gang: its jobs are
// reached on loopback, each node on ports of its own.
func gangNode(i int) brokertest.NodeSpec {
	n := brokertest.H100("us-west-2", 20)
	n.JobAddress, n.JobPortMin, n.JobPortMax = "127.0.0.1", int32(29500+100*i), int32(29599+100*i)
	return n
}

// submitGang submits testdata/h100.yaml as a gang of two 8-GPU nodes in
// us-west-2.
func submitGang(t *testing.T, c *client.RunClients, name string) *gpupassv1.Run {
	t.Helper()
	return submitGangIn(t, c, "us-west-2", name)
}

func submitGangIn(t *testing.T, c *client.RunClients, region, name string) *gpupassv1.Run {
	t.Helper()
	return submit(t, c, region, func(r *gpupassv1.SubmitRequest) {
		r.SpecYaml = bytes.Replace(specYAML(t), []byte("  count: 8\n"), []byte("  count: 16\n  nodes: 2\n"), 1)
		r.Name = name
	})
}

// gangState is a gang of two as the broker has it: rank 0's and rank
// 1's run.
func gangState(t *testing.T, c *client.RunClients, id string) (r0, r1 *gpupassv1.Run) {
	t.Helper()
	return getRun(t, c, id), getRun(t, c, id+"-r1")
}

func matched(r *gpupassv1.Run) bool {
	return r.State == gpupassv1.AllocState_ALLOC_STATE_MATCHED && r.NodeId != ""
}

// TestGangForNodesAnotherReplicaJustSaw is TestRunForANodeAnotherReplicaJustSaw
// for a gang: two nodes enroll and beat through b1, and a gang of two is
// submitted to b0 at once. b0 knows of them only from the store, and not
// yet: the gang must wait for the news and be placed on both, not fail
// with "only 1 certified h100-sxm5 node". A region with one eligible node
// still fails with the reason, holding none, once the news is in.
func TestGangForNodesAnotherReplicaJustSaw(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	b0, b1 := brokertest.Start(t, db, broker.Config{}), brokertest.Start(t, db, broker.Config{})
	agentTok := b0.Token(t, store.RoleAgent, "*")
	c := dialRuns(t, b0, b0.Token(t, store.RoleSubmit, "*"))
	var ws []*worker
	for i := range 2 {
		w := newWorker(t, b1, agentTok, gangNode(i))
		w.keepAlive(t)
		ws = append(ws, w)
	}
	run := submitGang(t, c, "fresh")
	waitRun(t, c, run.Id, "placed or ended", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
	r0, r1 := gangState(t, c, run.Id)
	if !matched(r0) || !matched(r1) || r0.NodeId == r1.NodeId {
		t.Errorf("gang submitted to b0 right after %s's and %s's first beats on b1: rank 0 %s on %q (%s), rank 1 %s on %q (%s); want both matched on the two nodes",
			ws[0].ID, ws[1].ID, r0.State, r0.NodeId, r0.Reason, r1.State, r1.NodeId, r1.Reason)
	}

	lone := gangNode(0)
	lone.Region = "eu-central-1"
	newWorker(t, b1, agentTok, lone).keepAlive(t)
	run = submitGangIn(t, c, "eu-central-1", "lone")
	waitRun(t, c, run.Id, "ended", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
	r0, r1 = gangState(t, c, run.Id)
	const why = "no gang of 2 nodes in eu-central-1: only 1 certified h100-sxm5 node, a gang needs 2"
	if r0.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r0.Reason, why) || r0.NodeId != "" || r1.NodeId != "" ||
		r1.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
		t.Errorf("gang in a region of one node: rank 0 %s on %q (%s), rank 1 %s on %q; want failed: %s, rank 1 cancelled, neither on a node",
			r0.State, r0.NodeId, r0.Reason, r1.State, r1.NodeId, why)
	}
}

// finishGang has each rank's node take its rank, run it and succeed, as
// the agents of a gang do.
func finishGang(t *testing.T, ws map[string]*worker, c *client.RunClients, id string) {
	t.Helper()
	r0, r1 := gangState(t, c, id)
	for _, r := range []*gpupassv1.Run{r0, r1} {
		w := ws[r.NodeId]
		as := w.poll(t, 5)
		if as == nil || as.AllocId != r.Id {
			t.Fatalf("%s polled %v, want its rank %s", w.ID, as, r.Id)
		}
		for _, st := range []gpupassv1.AllocState{gpupassv1.AllocState_ALLOC_STATE_RUNNING, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED} {
			if _, err := w.update(as, st, "exited with status 0", 0); err != nil {
				t.Fatalf("%s: %s of %s: %v", w.ID, st, r.Id, err)
			}
		}
	}
}

// TestGangQueuedOnOneReplicaPlacedViaAnother: a gang submitted to b0
// while its two nodes run another gang waits holding neither; when that
// gang's ranks end through b1 (where the nodes' agents are), b0's waiting
// gang is placed on both nodes, as soon as a waiting one-node run would
// be (superviseRuns, on whichever replica holds the once lease).
func TestGangQueuedOnOneReplicaPlacedViaAnother(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	b0, b1 := brokertest.Start(t, db, brokertest.Fast()), brokertest.Start(t, db, brokertest.Fast())
	agentTok := b0.Token(t, store.RoleAgent, "*")
	c0 := dialRuns(t, b0, b0.Token(t, store.RoleSubmit, "*"))
	c1 := dialRuns(t, b1, b1.Token(t, store.RoleSubmit, "*"))
	ws := map[string]*worker{}
	for i := range 2 {
		w := newWorker(t, b1, agentTok, gangNode(i))
		w.keepAlive(t)
		ws[w.ID] = w
	}
	first := submitGang(t, c1, "first")
	waitRun(t, c1, first.Id, "placed", matched)
	second := submitGang(t, c0, "second")
	waitRun(t, c0, second.Id, "queued", func(r *gpupassv1.Run) bool { return r.QueuedUnixNano > 0 })
	// Long enough for a wrong placement: superviseRuns places pending
	// runs every second.
	time.Sleep(1500 * time.Millisecond)
	if r0, r1 := gangState(t, c0, second.Id); r0.NodeId != "" || r1.NodeId != "" || r0.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || r1.State != gpupassv1.AllocState_ALLOC_STATE_PENDING {
		t.Fatalf("waiting gang: rank 0 %s on %q, rank 1 %s on %q; want both pending on no node", r0.State, r0.NodeId, r1.State, r1.NodeId)
	}
	finishGang(t, ws, c1, first.Id)
	freed := time.Now()
	waitRun(t, c0, first.Id, "succeeded", func(r *gpupassv1.Run) bool { return r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED })
	waitRun(t, c0, second.Id, "placed", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
	took := time.Since(freed)
	r0, r1 := gangState(t, c0, second.Id)
	if !matched(r0) || !matched(r1) || r0.NodeId == r1.NodeId {
		t.Fatalf("waiting gang after the nodes freed through b1: rank 0 %s on %q (%s), rank 1 %s on %q (%s); want both matched on the two nodes",
			r0.State, r0.NodeId, r0.Reason, r1.State, r1.NodeId, r1.Reason)
	}
	t.Logf("the gang waiting on b0 was placed %s after its nodes freed through b1", took.Round(time.Millisecond))
	// A functional bound, not a timing figure: placement of waiting runs
	// is a once-a-second pass; a gang stuck behind an extra poll or a
	// stale snapshot would take far longer.
	if took > 5*time.Second {
		t.Errorf("the waiting gang was placed %s after its nodes freed, want within 5 s", took)
	}
}

// TestGangsRaceAcrossReplicas: two replicas place a gang of two each at
// the same moment over three nodes, round after round. Every round one
// gang holds two nodes and the other waits holding none (or, once the
// first ended, holds two): never a node in two gangs, never one rank of
// a gang placed without the other.
func TestGangsRaceAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	b0, b1 := brokertest.Start(t, db, brokertest.Fast()), brokertest.Start(t, db, brokertest.Fast())
	agentTok := b0.Token(t, store.RoleAgent, "*")
	cs := []*client.RunClients{dialRuns(t, b0, b0.Token(t, store.RoleSubmit, "*")), dialRuns(t, b1, b1.Token(t, store.RoleSubmit, "*"))}
	ws := map[string]*worker{}
	for i := range 3 {
		w := newWorker(t, []*brokertest.Broker{b0, b1}[i%2], agentTok, gangNode(i))
		w.keepAlive(t)
		ws[w.ID] = w
	}
	const rounds = 8
	for round := range rounds {
		runs := make([]*gpupassv1.Run, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 {
			wg.Go(func() {
				<-start
				runs[i] = submitGang(t, cs[i], fmt.Sprintf("race-%d-%d", round, i))
			})
		}
		close(start)
		wg.Wait()
		// Both settle: placed, or waiting in the queue.
		for i, r := range runs {
			waitRun(t, cs[i], r.Id, "placed or queued", func(r *gpupassv1.Run) bool { return matched(r) || r.QueuedUnixNano > 0 })
		}
		held := map[string]string{}
		placed := 0
		for i, r := range runs {
			r0, r1 := gangState(t, cs[i], r.Id)
			switch {
			case matched(r0) && matched(r1):
				placed++
				for _, x := range []*gpupassv1.Run{r0, r1} {
					if other, ok := held[x.NodeId]; ok {
						t.Fatalf("round %d: node %s holds %s and %s", round, x.NodeId, other, x.Id)
					}
					held[x.NodeId] = x.Id
				}
			case r0.NodeId == "" && r1.NodeId == "" && r0.State == gpupassv1.AllocState_ALLOC_STATE_PENDING && r1.State == gpupassv1.AllocState_ALLOC_STATE_PENDING:
			default:
				t.Fatalf("round %d: a partial gang: rank 0 %s on %q (%s), rank 1 %s on %q (%s)", round, r0.State, r0.NodeId, r0.Reason, r1.State, r1.NodeId, r1.Reason)
			}
		}
		if placed != 1 {
			t.Fatalf("round %d: %d gangs placed over 3 nodes, want exactly 1", round, placed)
		}
		// The placed gang ends; the waiting one then takes two nodes,
		// and ends too.
		for i, r := range runs {
			if matched(getRun(t, cs[i], r.Id)) {
				finishGang(t, ws, cs[i], r.Id)
			}
		}
		for i, r := range runs {
			r = waitRun(t, cs[i], r.Id, "placed or ended", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
			if matched(r) {
				if r1 := getRun(t, cs[i], r.Id+"-r1"); !matched(r1) || r1.NodeId == r.NodeId {
					t.Fatalf("round %d: the second gang: rank 0 on %q, rank 1 %s on %q (%s)", round, r.NodeId, r1.State, r1.NodeId, r1.Reason)
				}
				finishGang(t, ws, cs[i], r.Id)
			}
			waitRun(t, cs[i], r.Id, "succeeded", func(r *gpupassv1.Run) bool { return r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED })
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("%d rounds of two gangs submitted at once to two replicas over 3 nodes: one placed whole, one waiting on none, each round", rounds)
}
