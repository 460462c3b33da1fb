package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// runWebhooks is the webhook part of the contract (issue #35).
func runWebhooks(t *testing.T, open Factory) {
	ctx := context.Background()
	t.Run("webhooks, once-only deliveries and their attempts", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		w, ok := s.(store.Webhooks)
		if !ok {
			t.Fatalf("%T does not implement store.Webhooks", s)
		}
		hook := store.Webhook{ID: "hook-1", URL: "https://ci.example/hook", Secret: []byte("s3cret"), Regions: []string{"eu-*"}, CreatedAt: t0}
		if err := w.CreateWebhook(ctx, hook); err != nil {
			t.Fatal(err)
		}
		got, err := reopen(t).(store.Webhooks).ListWebhooks(ctx)
		if err != nil || len(got) != 1 {
			t.Fatalf("ListWebhooks = %v, %v", got, err)
		}
		if diff := cmp.Diff(hook, got[0]); diff != "" {
			t.Errorf("webhook read back (-want +got):\n%s", diff)
		}
		d := store.Delivery{ID: "dlv-1", WebhookID: "hook-1", Group: "group-a", Event: "group.ended", Body: []byte(`{"group":"group-a"}`),
			State: store.DeliveryPending, NextAt: t0, Created: t0}
		if created, err := w.CreateDelivery(ctx, d); err != nil || !created {
			t.Fatalf("CreateDelivery = %v, %v", created, err)
		}
		// Another replica noticing the same group end stores nothing.
		d2 := d
		d2.ID = "dlv-2"
		if created, err := w.CreateDelivery(ctx, d2); err != nil || created {
			t.Errorf("second CreateDelivery of the group = %v, %v; want false", created, err)
		}
		due, err := w.DueDeliveries(ctx, t0, 10)
		if err != nil || len(due) != 1 || string(due[0].Body) != string(d.Body) {
			t.Fatalf("DueDeliveries = %v, %v", due, err)
		}
		if due, _ := w.DueDeliveries(ctx, t0.Add(-time.Second), 10); len(due) != 0 {
			t.Errorf("a delivery due later is due now: %v", due)
		}
		until := t0.Add(time.Minute)
		if ok, err := w.ClaimDelivery(ctx, "dlv-1", t0, until); err != nil || !ok {
			t.Fatalf("ClaimDelivery = %v, %v", ok, err)
		}
		if ok, err := w.ClaimDelivery(ctx, "dlv-1", t0, until); err != nil || ok {
			t.Errorf("a second claim of the same read = %v, %v; want false", ok, err)
		}
		d.State, d.Attempts, d.NextAt = store.DeliveryPending, 1, t0.Add(2*time.Second)
		if err := w.FinishAttempt(ctx, d, store.Attempt{N: 1, At: t0, Status: 500, Error: "answered 500", Duration: time.Second}); err != nil {
			t.Fatal(err)
		}
		d.State, d.Attempts = store.DeliveryDelivered, 2
		if err := w.FinishAttempt(ctx, d, store.Attempt{N: 2, At: t0.Add(2 * time.Second), Status: 204, Duration: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		list, err := w.Deliveries(ctx, "hook-1", 10)
		if err != nil || len(list) != 1 {
			t.Fatalf("Deliveries = %v, %v", list, err)
		}
		if l := list[0]; l.State != store.DeliveryDelivered || l.Attempts != 2 || len(l.Log) != 2 || l.Log[0].Status != 500 || l.Log[1].Status != 204 {
			t.Errorf("delivery after two attempts = %+v", l)
		}
		if list, _ := w.Deliveries(ctx, "hook-other", 10); len(list) != 0 {
			t.Errorf("Deliveries of another webhook = %v", list)
		}
		if err := w.DeleteWebhook(ctx, "hook-1"); err != nil {
			t.Fatal(err)
		}
		if err := w.DeleteWebhook(ctx, "hook-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleting it again: %v, want ErrNotFound", err)
		}
	})

	t.Run("ended groups", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r, w := runsOf(t, s), s.(store.Webhooks)
		for _, a := range []store.Alloc{
			{ID: "alloc-e1", Group: "group-done", State: store.AllocSucceeded},
			{ID: "alloc-e2", Group: "group-done", State: store.AllocFailed},
			{ID: "alloc-e3", Group: "group-half", State: store.AllocSucceeded},
			{ID: "alloc-e4", Group: "group-half", State: store.AllocRunning},
			{ID: "alloc-e5", State: store.AllocSucceeded},
			// One of the two runs the group will hold: not ended yet.
			{ID: "alloc-e6", Group: "group-short", GroupSize: 2, State: store.AllocFailed},
		} {
			a.Name, a.Region, a.CreatedAt = "n", "us-west-2", t0
			if err := r.CreateAlloc(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		got, err := w.EndedGroups(ctx, now.Add(-time.Minute), now.Add(time.Minute), 10)
		if err != nil || len(got) != 1 || got[0].ID != "group-done" || got[0].LastUpdate.Before(now.Add(-time.Minute)) || got[0].LastUpdate.After(time.Now()) {
			t.Errorf("EndedGroups = %+v, %v; want [group-done] with its last update", got, err)
		}
		if got, _ := w.EndedGroups(ctx, now.Add(time.Minute), now.Add(2*time.Minute), 10); len(got) != 0 {
			t.Errorf("EndedGroups after the window = %v", got)
		}
		// Pages in the order the groups ended: a second group ending later
		// comes after a full page of one, from the first's LastUpdate.
		if err := r.CreateAlloc(ctx, store.Alloc{ID: "alloc-e7", Name: "n", Region: "us-west-2", Group: "group-later", State: store.AllocCancelled, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		until := time.Now().Add(time.Minute)
		page, err := w.EndedGroups(ctx, now.Add(-time.Minute), until, 1)
		if err != nil || len(page) != 1 || page[0].ID != "group-done" {
			t.Fatalf("first page of one = %+v, %v; want [group-done]", page, err)
		}
		if next, err := w.EndedGroups(ctx, page[0].LastUpdate, until, 1); err != nil || len(next) != 1 || next[0].ID != "group-later" {
			t.Errorf("page after group-done = %+v, %v; want [group-later]", next, err)
		}
	})
}
