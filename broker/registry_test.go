package broker_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestReplicaSnapshotsConverge: two brokers on one PostgreSQL with the
// production snapshot settings (refreshed in the background every 500 ms).
// The second one already holds a snapshot when a node registers and later
// re-indexes through the first; both writes reach its dry-runs, and its own
// writes show at once.
func TestReplicaSnapshotsConverge(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	cfg := broker.Config{HeartbeatInterval: time.Second, OfflineAfter: time.Minute, FlushInterval: 20 * time.Millisecond}
	b1 := brokertest.Start(t, db, cfg)
	b2 := brokertest.Start(t, db, cfg)
	ctx := context.Background()
	c2 := b2.Clients(t, b2.Token(t, store.RoleRead, "*"))
	dryRun := func() *gpupassv1.DryRunResponse {
		t.Helper()
		resp, err := c2.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
		if err != nil {
			t.Fatal(err)
		}
		if err := api.ExpandDryRun(resp.Msg); err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	if m := dryRun(); len(m.Candidates)+len(m.Excluded) != 0 {
		t.Fatalf("empty registry answered %v", m)
	}
	waitFor := func(what string, ok func(*gpupassv1.DryRunResponse) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			m := dryRun()
			if ok(m) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the second broker never saw %s: %v", what, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	tok := b1.Token(t, store.RoleAgent, "*")
	a := brokertest.Register(t, b1.URL, tok, brokertest.H100("us-west-2", 20))
	waitFor("the node registered through the first", func(m *gpupassv1.DryRunResponse) bool {
		return len(m.Candidates) == 1 && m.Candidates[0].Node.Id == a.ID && m.Candidates[0].Node.PricePerHour == 20
	})
	// Re-indexed through the first broker: a report with another CUDA.
	a.Node.CUDA = "12.2.140"
	if err := a.Upload(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitFor("the node re-indexed through the first", func(m *gpupassv1.DryRunResponse) bool {
		return len(m.Candidates) == 0 && len(m.Excluded) == 1 && len(m.Excluded[0].Reasons) == 1 && m.Excluded[0].Reasons[0].Measured == "12.2.140"
	})
	// A write through the second broker shows in its next answer.
	a.Node.CUDA = "12.1.105"
	a2, err := brokertest.Enroll(ctx, b2.URL, tok, a.Key, a.Node)
	if err != nil || a2.ID != a.ID {
		t.Fatalf("enrolling the same key on the second broker: %v, %v", a2, err)
	}
	if err := a2.Upload(ctx, a.Report()); err != nil {
		t.Fatal(err)
	}
	if m := dryRun(); len(m.Candidates) != 1 {
		t.Errorf("own write not read back at once: %v", m)
	}
}
