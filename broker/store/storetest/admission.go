package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// runAdmissions checks store.Admissions as two replicas see it: a
// decision written through one is read through the other, a later one
// replaces it, and since reads only what was decided at or after it.
func runAdmissions(t *testing.T, open Factory) {
	t.Run("admissions", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s, reopen := open(t)
		a, ok := s.(store.Admissions)
		if !ok {
			t.Fatalf("%T does not implement store.Admissions", s)
		}
		b := reopen(t).(store.Admissions)
		if got, err := b.Admissions(ctx, time.Time{}); err != nil || len(got) != 0 {
			t.Fatalf("Admissions of an empty store = %v, %v", got, err)
		}
		x := store.Admission{AgentID: "agt-x", Region: "eu-central-1", State: store.AdmissionApproved, DecidedBy: "tok-a", DecidedAt: t0}
		y := store.Admission{AgentID: "agt-y", Region: "eu-west-1", State: store.AdmissionDenied, DecidedBy: "tok-a", DecidedAt: t0.Add(time.Second)}
		for _, d := range []store.Admission{x, y} {
			if err := a.SetAdmission(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		got, err := b.Admissions(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Admission{x, y}, got); diff != "" {
			t.Errorf("Admissions through the other handle (-want +got):\n%s", diff)
		}
		// x is denied later, through the other handle: it replaces the
		// approval, and a read since then finds only it.
		x2 := x
		x2.State, x2.DecidedBy, x2.DecidedAt = store.AdmissionDenied, "tok-b", t0.Add(time.Minute)
		if err := b.SetAdmission(ctx, x2); err != nil {
			t.Fatal(err)
		}
		got, err = a.Admissions(ctx, t0.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Admission{x2}, got); diff != "" {
			t.Errorf("Admissions since the second decision (-want +got):\n%s", diff)
		}
		if err := a.SetAdmission(ctx, store.Admission{AgentID: "agt-z", Region: "r", State: "maybe", DecidedAt: t0}); err == nil {
			t.Error("SetAdmission took an unknown state")
		}
	})
}
