package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// runQueue is the queue part of the contract: a region's waiting runs in
// the order they began waiting, the same for every replica (a reopened
// store), a run leaving the queue when it is placed or ends.
func runQueue(t *testing.T, open Factory) {
	ctx := context.Background()

	t.Run("a region's queue is its waiting runs in the order they began waiting", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		// Created in one order, queued in another: the queue is the
		// waiting order, not the submission order.
		for i, c := range []struct {
			region string
			queued time.Duration // 0: not waiting
		}{
			{"us-west-2", 3 * time.Second},
			{"us-west-2", time.Second},
			{"eu-central-1", 2 * time.Second},
			{"us-west-2", 0},
			{"us-west-2", 2 * time.Second},
		} {
			a := store.Alloc{ID: fmt.Sprintf("alloc-q%07d", i), Name: "n", Region: c.region, State: store.AllocPending,
				CreatedAt: t0.Add(time.Duration(i) * time.Second), QueueTimeoutSeconds: 600}
			if c.queued > 0 {
				a.QueuedAt = t0.Add(time.Minute + c.queued)
				a.QueueNodes, a.QueueNodeCount = []string{"agt-1", "agt-2"}, 2
			}
			if err := r.CreateAlloc(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(as []store.Alloc) (out []string) {
			for _, a := range as {
				out = append(out, a.ID)
			}
			return out
		}
		got, err := runsOf(t, reopen(t)).QueuedAllocs(ctx, "us-west-2", 10)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"alloc-q0000001", "alloc-q0000004", "alloc-q0000000"}, ids(got)); diff != "" {
			t.Errorf("QueuedAllocs(us-west-2) (-want +got):\n%s", diff)
		}
		if len(got) > 0 {
			a := got[0]
			if !a.QueuedAt.Equal(t0.Add(time.Minute+time.Second)) || a.QueueTimeoutSeconds != 600 || a.QueueNodeCount != 2 || !cmp.Equal(a.QueueNodes, []string{"agt-1", "agt-2"}) {
				t.Errorf("queued run read back as QueuedAt %v, QueueTimeoutSeconds %d, QueueNodes %v (%d); want %v, 600, [agt-1 agt-2] (2)",
					a.QueuedAt, a.QueueTimeoutSeconds, a.QueueNodes, a.QueueNodeCount, t0.Add(time.Minute+time.Second))
			}
		}
		if got, err := r.QueuedAllocs(ctx, "us-west-2", 2); err != nil || len(got) != 2 {
			t.Errorf("QueuedAllocs(us-west-2, 2) = %v, %v; want the first 2", ids(got), err)
		}

		// Placed: it leaves the queue whatever the field still says.
		if _, err := r.UpdateAlloc(ctx, "alloc-q0000001", func(a *store.Alloc) error {
			a.State, a.NodeID, a.Fence = store.AllocMatched, "agt-1", 7
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// Ended while waiting (its queue timeout): it leaves too.
		if _, err := r.UpdateAlloc(ctx, "alloc-q0000000", func(a *store.Alloc) error {
			a.State, a.Reason = store.AllocFailed, "waited"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// Began waiting: it joins at the back.
		if _, err := r.UpdateAlloc(ctx, "alloc-q0000003", func(a *store.Alloc) error {
			a.QueuedAt = t0.Add(time.Hour)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		got, err = runsOf(t, reopen(t)).QueuedAllocs(ctx, "us-west-2", 10)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"alloc-q0000004", "alloc-q0000003"}, ids(got)); diff != "" {
			t.Errorf("QueuedAllocs(us-west-2) after a placement, an end and a new waiter (-want +got):\n%s", diff)
		}
		if got, err := r.QueuedAllocs(ctx, "ap-south-1", 10); err != nil || len(got) != 0 {
			t.Errorf("QueuedAllocs(ap-south-1) = %v, %v; want none", ids(got), err)
		}
	})
}
