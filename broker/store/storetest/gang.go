package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
)

// runGangs is the gang part of the contract (issue #34): a run across
// several nodes is stored whole, leased whole or not at all (no rank
// ever holds a node while another rank's node is taken), across brokers
// sharing the database, and its ranks are found from rank 0.
func runGangs(t *testing.T, open Factory, o Options) {
	ctx := context.Background()

	// gang stores rank 0 (id) and ranks 1..n-1, all pending.
	gang := func(t *testing.T, r store.Runs, id string, n int) []string {
		t.Helper()
		ids := []string{id}
		as := []store.Alloc{{ID: id, Name: "n", Region: "us-west-2", State: store.AllocPending, GangSize: n}}
		for i := 1; i < n; i++ {
			rid := fmt.Sprintf("%s-r%d", id, i)
			ids = append(ids, rid)
			as = append(as, store.Alloc{ID: rid, Name: "n", Region: "us-west-2", State: store.AllocPending, Gang: id, Rank: i, GangSize: n})
		}
		if err := r.CreateAllocs(ctx, as); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// lease puts the gang's ranks on nodes, in rank order.
	lease := func(r store.Runs, ids []string, nodes ...string) error {
		_, err := r.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
			for i, a := range as {
				if a.State != store.AllocPending {
					return fmt.Errorf("%s is %s", a.ID, a.State)
				}
				a.State, a.NodeID, a.Fence = store.AllocMatched, nodes[i], a.Fence+1
			}
			return nil
		})
		return err
	}
	enroll := func(t *testing.T, s store.Store, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, _, err := s.EnrollAgent(ctx, agent(id, "k-"+id, "us-west-2"), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	holding := func(t *testing.T, r store.Runs) map[string]string {
		t.Helper()
		active, err := r.ActiveAllocs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]string{}
		for _, a := range active {
			if a.State.HoldsNode() {
				held[a.NodeID] = a.ID
			}
		}
		return held
	}

	t.Run("an agent's rendezvous address and job ports are stored and listed", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		a := agent("agt-j", "kj", "us-west-2")
		a.Labels.JobAddress, a.Labels.JobPortMin, a.Labels.JobPortMax = "10.0.0.7", 29500, 29599
		if _, _, err := s.EnrollAgent(ctx, a, nil); err != nil {
			t.Fatal(err)
		}
		enroll(t, s, "agt-plain")
		s2 := reopen(t)
		if got, err := s2.Agent(ctx, "agt-j"); err != nil || got.Labels != a.Labels {
			t.Errorf("Agent labels %+v, %v; want %+v", got.Labels, err, a.Labels)
		}
		nodes, err := s2.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if want := n.ID == "agt-j"; n.Labels.Rendezvous() != want {
				t.Errorf("node %s: rendezvous %v (%s %d-%d), want %v", n.ID, !want, n.Labels.JobAddress, n.Labels.JobPortMin, n.Labels.JobPortMax, want)
			}
		}
		// Enrolling again without them (an agent restarted without the
		// flags) takes them away.
		a.Labels.JobAddress, a.Labels.JobPortMin, a.Labels.JobPortMax = "", 0, 0
		if _, _, err := s.EnrollAgent(ctx, a, nil); err != nil {
			t.Fatal(err)
		}
		if got, err := s2.Agent(ctx, "agt-j"); err != nil || got.Labels.Rendezvous() {
			t.Errorf("after enrolling without job ports: %+v, %v", got.Labels, err)
		}
	})

	t.Run("a gang is stored whole or not at all", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r := runsOf(t, s)
		if err := r.CreateAlloc(ctx, store.Alloc{ID: "alloc-g0000001-r2", Name: "n", Region: "us-west-2", State: store.AllocPending}); err != nil {
			t.Fatal(err)
		}
		// Rank 2's id is taken: ranks 0 and 1 must not be stored alone.
		err := r.CreateAllocs(ctx, []store.Alloc{
			{ID: "alloc-g0000001", Name: "n", Region: "us-west-2", State: store.AllocPending, GangSize: 3},
			{ID: "alloc-g0000001-r1", Name: "n", Region: "us-west-2", State: store.AllocPending, Gang: "alloc-g0000001", Rank: 1, GangSize: 3},
			{ID: "alloc-g0000001-r2", Name: "n", Region: "us-west-2", State: store.AllocPending, Gang: "alloc-g0000001", Rank: 2, GangSize: 3},
		})
		if err == nil {
			t.Fatal("a gang with a taken id was stored")
		}
		for _, id := range []string{"alloc-g0000001", "alloc-g0000001-r1"} {
			if a, err := r.Alloc(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s stored from a refused gang: %+v, %v", id, a, err)
			}
		}
	})

	t.Run("a gang's ranks are found from rank 0, in rank order", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		ids := gang(t, r, "alloc-g0000002", 4)
		gang(t, r, "alloc-g0000003", 2)
		got, err := runsOf(t, reopen(t)).GangAllocs(ctx, "alloc-g0000002")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 {
			t.Fatalf("GangAllocs: %d ranks, want 3", len(got))
		}
		for i, a := range got {
			if a.ID != ids[i+1] || a.Rank != i+1 || a.Gang != "alloc-g0000002" || a.GangSize != 4 || a.GangID() != "alloc-g0000002" {
				t.Errorf("rank %d: %s rank %d of %q (%d nodes), want %s rank %d of alloc-g0000002 (4)", i+1, a.ID, a.Rank, a.Gang, a.GangSize, ids[i+1], i+1)
			}
		}
		list, err := r.ListAllocs(ctx, 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range list {
			if a.Gang != "" {
				t.Errorf("ListAllocs lists rank %d of %s (%s): it lists runs", a.Rank, a.Gang, a.ID)
			}
		}
		if len(list) != 2 {
			t.Errorf("ListAllocs: %d allocations, want the 2 runs", len(list))
		}
		if got, err := r.GangAllocs(ctx, "alloc-g0000002-r1"); err != nil || len(got) != 0 {
			t.Errorf("GangAllocs of a rank: %d, %v; want none", len(got), err)
		}
		// The gang a rank belongs to is fixed when stored.
		if _, err := r.UpdateAllocs(ctx, ids[1:2], func(as []*store.Alloc) error { as[0].Gang = "alloc-g0000003"; return nil }); err != nil {
			t.Fatal(err)
		}
		if a, err := r.Alloc(ctx, ids[1]); err != nil || a.Gang != "alloc-g0000002" {
			t.Errorf("rank 1 moved to gang %q, %v; want it kept in alloc-g0000002", a.Gang, err)
		}
		if _, err := r.UpdateAllocs(ctx, []string{ids[0], "alloc-nope"}, func([]*store.Alloc) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UpdateAllocs with an unknown id: %v, want ErrNotFound", err)
		}
	})

	t.Run("a gang is leased whole or not at all", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		enroll(t, s, "agt-1", "agt-2", "agt-3")
		r := runsOf(t, s)
		if err := r.CreateAlloc(ctx, store.Alloc{ID: "alloc-one", Name: "n", Region: "us-west-2", State: store.AllocRunning, NodeID: "agt-2"}); err != nil {
			t.Fatal(err)
		}
		ids := gang(t, r, "alloc-g0000004", 2)
		if err := lease(r, ids, "agt-1", "agt-2"); !errors.Is(err, store.ErrNodeBusy) {
			t.Fatalf("leasing a gang onto a busy node: %v, want ErrNodeBusy", err)
		}
		if err := lease(r, ids, "agt-3", "agt-3"); !errors.Is(err, store.ErrNodeBusy) {
			t.Fatalf("leasing two ranks onto one node: %v, want ErrNodeBusy", err)
		}
		if held := holding(t, r); len(held) != 1 || held["agt-2"] != "alloc-one" {
			t.Fatalf("after refused gang leases the nodes held are %v, want only agt-2 by alloc-one", held)
		}
		if err := lease(r, ids, "agt-1", "agt-3"); err != nil {
			t.Fatalf("leasing a gang onto free nodes: %v", err)
		}
		if held := holding(t, r); held["agt-1"] != ids[0] || held["agt-3"] != ids[1] {
			t.Errorf("nodes held: %v, want agt-1 by rank 0, agt-3 by rank 1", held)
		}
		// A one-node run cannot take a gang's node.
		if _, err := r.UpdateAlloc(ctx, "alloc-one", func(a *store.Alloc) error { a.NodeID = "agt-3"; return nil }); !errors.Is(err, store.ErrNodeBusy) {
			t.Errorf("moving a run onto a gang's node: %v, want ErrNodeBusy", err)
		}
		// Ending the gang together frees both nodes in one write.
		if _, err := r.UpdateAllocs(ctx, ids, func(as []*store.Alloc) error {
			for _, a := range as {
				a.State = store.AllocFailed
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if held := holding(t, r); len(held) != 1 {
			t.Errorf("after the gang ended the nodes held are %v, want only agt-2", held)
		}
	})

	t.Run("two brokers leasing gangs that share a node: one wins whole, the other holds nothing", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		enroll(t, s, "agt-1", "agt-2", "agt-3")
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		for round := 0; round < 10; round++ {
			a := gang(t, r1, fmt.Sprintf("alloc-a%07d", round), 2)
			b := gang(t, r1, fmt.Sprintf("alloc-b%07d", round), 2)
			errs := make(chan error, 2)
			// Opposite orders on the shared node: a lease that locked
			// rows in the order given would deadlock here.
			go func() { errs <- lease(r1, a, "agt-1", "agt-2") }()
			go func() { errs <- lease(r2, b, "agt-3", "agt-2") }()
			e1, e2 := <-errs, <-errs
			if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), store.ErrNodeBusy) {
				t.Fatalf("round %d: two gangs on one node: errs %v, %v; want one nil, one ErrNodeBusy", round, e1, e2)
			}
			won, lost := a, b
			if got, _ := r1.Alloc(ctx, a[0]); got.State != store.AllocMatched {
				won, lost = b, a
			}
			for _, id := range lost {
				if got, err := r1.Alloc(ctx, id); err != nil || got.State != store.AllocPending || got.NodeID != "" {
					t.Fatalf("round %d: the refused gang's %s was written: %s on %q, %v", round, id, got.State, got.NodeID, err)
				}
			}
			held := holding(t, r1)
			if len(held) != 2 || held["agt-2"] != won[1] {
				t.Fatalf("round %d: nodes held %v, want exactly the winner's two", round, held)
			}
			for _, g := range [][]string{a, b} {
				if _, err := r2.UpdateAllocs(ctx, g, func(as []*store.Alloc) error {
					for _, x := range as {
						x.State = store.AllocCancelled
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
