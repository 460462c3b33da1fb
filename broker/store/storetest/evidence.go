package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// runEvidence is the run-evidence part of the contract: a run's signed
// report is kept under the current lease only, replaced by a later one,
// and survives a restart byte for byte.
func runEvidence(t *testing.T, open Factory) {
	ctx := context.Background()
	t.Run("run evidence under the lease", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		ev, ok := s.(store.Evidence)
		if !ok {
			t.Fatalf("%T does not implement store.Evidence", s)
		}
		r := runsOf(t, s)
		a := store.Alloc{ID: "alloc-0000e001", Name: "audit-eu", Region: "eu-west-1", State: store.AllocStarting, NodeID: "agt-1", Fence: 2,
			SpecJSON: []byte(`{"name":"x"}`), SpecYAML: []byte("name: x\n"), Command: []string{"true"}, CreatedAt: t0}
		if err := r.CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		if _, err := ev.RunEvidence(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("RunEvidence before any: err = %v, want ErrNotFound", err)
		}
		first := store.RunEvidence{AllocID: a.ID, AgentID: "agt-1", Report: []byte(`{"alloc_id":"alloc-0000e001","n":1}`),
			Signature: "MEUCIQ==", AgentPublicKeyPEM: []byte("-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----\n"), ReceivedAt: t0}
		if err := ev.PutRunEvidence(ctx, first, 1); !errors.Is(err, store.ErrStaleFence) {
			t.Errorf("PutRunEvidence with an old fence: err = %v, want ErrStaleFence", err)
		}
		if err := ev.PutRunEvidence(ctx, store.RunEvidence{AllocID: "alloc-nope"}, 2); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("PutRunEvidence of an unknown run: err = %v, want ErrNotFound", err)
		}
		if _, err := ev.RunEvidence(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused report was stored: err = %v", err)
		}
		if err := ev.PutRunEvidence(ctx, first, 2); err != nil {
			t.Fatal(err)
		}
		second := first
		second.Report, second.Signature, second.ReceivedAt = []byte(`{"alloc_id":"alloc-0000e001","n":2}`), "MEYCIQ==", t0.Add(1e9)
		if err := ev.PutRunEvidence(ctx, second, 2); err != nil {
			t.Fatal(err)
		}
		s2 := reopen(t)
		got, err := s2.(store.Evidence).RunEvidence(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(second, got); diff != "" {
			t.Errorf("RunEvidence after replace and reopen (-want +got):\n%s", diff)
		}
		back, err := runsOf(t, s2).Alloc(ctx, a.ID)
		if err != nil || string(back.SpecYAML) != "name: x\n" {
			t.Errorf("Alloc.SpecYAML after reopen = %q, %v", back.SpecYAML, err)
		}
	})
}
