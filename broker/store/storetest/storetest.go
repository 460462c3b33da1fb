// Package storetest is the one contract suite every store.Store backend
// must pass. Backends call Run from their own tests with a factory that
// opens a fresh, empty store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
)

// Factory opens a fresh, empty store. reopen closes nothing: it opens a
// second handle on the same database (a restarted or second broker).
type Factory func(t *testing.T) (s store.Store, reopen func(t *testing.T) store.Store)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func agent(id, key, region string) store.Agent {
	return store.Agent{
		ID: id, PublicKeyPEM: []byte("PEM " + key), KeyFingerprint: key, AgentVersion: "v1", TokenID: "tok-1",
		EnrolledAt: t0,
		Labels: store.Labels{Provider: "lambda", Region: region, Zone: region + "a", PricePerHour: 20,
			StorageClass: "ultra-nvme", BandwidthGbps: 200, Hostname: "h-" + id},
	}
}

// Options tell the suite what a backend lets it observe.
type Options struct {
	// LockWaiters counts the sessions of s's database that wait for a
	// lock, so a race test knows a transaction is blocked rather than
	// sleeping and hoping it is (nil: the backend cannot say).
	LockWaiters func(ctx context.Context, s store.Store) (int, error)
}

// Run runs the contract suite.
func Run(t *testing.T, open Factory, opts ...Options) {
	ctx := context.Background()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	runRuns(t, open, o)
	runQueue(t, open)
	runGangs(t, open, o)
	runWebhooks(t, open)
	runEvidence(t, open)
	runSessionKeys(t, open)
	runLeases(t, open)
	runAdmissions(t, open)
	runLogUsage(t, open)
	runRegistry(t, open)

	t.Run("tokens", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		tok := store.Token{ID: "tok-a", Hash: "abc", Role: store.RoleSubmit, Regions: []string{"us-*", "eu-central-1"}, CreatedAt: t0, Note: "ci"}
		if err := s.CreateToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateToken(ctx, store.Token{ID: "tok-b", Hash: "abc", Role: store.RoleRead, Regions: []string{"*"}, CreatedAt: t0}); err == nil {
			t.Error("second token with the same hash was accepted")
		}
		got, err := s.TokenByHash(ctx, "abc")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tok, got); diff != "" {
			t.Errorf("TokenByHash (-want +got):\n%s", diff)
		}
		if _, err := s.TokenByHash(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown hash: err = %v, want ErrNotFound", err)
		}
		list, err := s.ListTokens(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("ListTokens = %v, %v; want 1 token", list, err)
		}
		if err := s.DeleteToken(ctx, "tok-a"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteToken(ctx, "tok-a"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleting twice: err = %v, want ErrNotFound", err)
		}
		if _, err := s.TokenByHash(ctx, "abc"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleted token still found: %v", err)
		}
	})

	t.Run("enroll keeps identity per key", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		a, created, err := s.EnrollAgent(ctx, agent("agt-1", "k1", "us-west-2"), nil)
		if err != nil || !created {
			t.Fatalf("first enroll: created=%v err=%v", created, err)
		}
		again := agent("agt-other", "k1", "us-west-2")
		again.Labels.PricePerHour = 25
		again.AgentVersion = "v2"
		b, created, err := s.EnrollAgent(ctx, again, nil)
		if err != nil || created {
			t.Fatalf("second enroll: created=%v err=%v", created, err)
		}
		if b.ID != a.ID || b.Labels.PricePerHour != 25 || b.AgentVersion != "v2" {
			t.Errorf("re-enroll = %+v, want id %s with updated labels", b, a.ID)
		}
		if _, err := s.Agent(ctx, "agt-none"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown agent: err = %v, want ErrNotFound", err)
		}
		got, err := s.Agent(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := agent("agt-1", "k1", "us-west-2")
		want.Labels.PricePerHour = 25
		want.AgentVersion = "v2"
		want.Labels.Hostname = "h-agt-other"
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Agent (-want +got):\n%s", diff)
		}
		nodes, err := s.Nodes(ctx)
		if err != nil || len(nodes) != 1 || nodes[0].HasReport || nodes[0].RTTMS != -1 || !nodes[0].LastSeen.IsZero() {
			t.Errorf("Nodes after enroll = %+v, %v; want one node without report, unseen", nodes, err)
		}
	})

	t.Run("enroll asks allow under the row lock", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		if _, _, err := s.EnrollAgent(ctx, agent("agt-1", "k1", "us-west-2"), func(store.Agent) error {
			return errors.New("allow called for a new key")
		}); err != nil {
			t.Fatal(err)
		}
		errRefused := errors.New("refused")
		var seen store.Agent
		_, _, err := s.EnrollAgent(ctx, agent("agt-x", "k1", "eu-central-1"), func(a store.Agent) error { seen = a; return errRefused })
		if err != errRefused {
			t.Errorf("refused enroll: err = %v, want allow's error unchanged", err)
		}
		if diff := cmp.Diff(agent("agt-1", "k1", "us-west-2"), seen); diff != "" {
			t.Errorf("allow saw (-want +got):\n%s", diff)
		}
		if got, err := s.Agent(ctx, "agt-1"); err != nil || got.Labels.Region != "us-west-2" {
			t.Errorf("after a refused enroll: %+v, %v; want it still in us-west-2", got, err)
		}
		// Many enrollments of one key, through two handles (two brokers),
		// each allowed only while the key is still in us-west-2: exactly
		// one may move it.
		s2 := reopen(t)
		const n = 8
		errs := make(chan error, n)
		for i := range n {
			go func() {
				h := s
				if i%2 == 1 {
					h = s2
				}
				_, _, err := h.EnrollAgent(ctx, agent("agt-x", "k1", fmt.Sprintf("eu-%d", i)), func(a store.Agent) error {
					if a.Labels.Region != "us-west-2" {
						return errRefused
					}
					return nil
				})
				errs <- err
			}()
		}
		moved := 0
		for range n {
			switch err := <-errs; {
			case err == nil:
				moved++
			case err != errRefused:
				t.Errorf("concurrent enroll: %v", err)
			}
		}
		if moved != 1 {
			t.Errorf("%d concurrent enrollments passed allow against the same stored region, want 1", moved)
		}
	})

	t.Run("reports index the node", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		if _, _, err := s.EnrollAgent(ctx, agent("agt-1", "k1", "eu-central-1"), nil); err != nil {
			t.Fatal(err)
		}
		idx := store.NodeIndex{Provider: "lambda", Region: "eu-central-1", Accelerator: "h100-sxm5", GPUName: "NVIDIA H100 80GB HBM3",
			GPUCount: 8, GPUMemoryMiB: 81559, StorageClass: "ultra-nvme", StorageFreeGB: 6000, StorageReadMBps: 5000,
			BandwidthGbps: 400, PricePerHour: 23.9, RuntimeFingerprint: "sha256:ab", Simulated: true, Profile: "h100", Passed: true,
			Runtime:     conformance.Runtime{NvidiaDriver: "535.104.05", CUDA: "12.1.105", Python: "3.10.12", PyTorch: "2.1.0+cu121", FIPSEnabled: true},
			GeneratedAt: t0.Add(time.Millisecond)}
		for i, body := range []string{`{"n":1}`, `{"n":2}`} {
			r := store.Report{AgentID: "agt-1", Bytes: []byte(body), Signature: "sig", ReceivedAt: t0.Add(time.Duration(i) * time.Second), Index: idx}
			if err := s.SaveReport(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SaveReport(ctx, store.Report{AgentID: "agt-none", Bytes: []byte("{}"), ReceivedAt: t0}); err == nil {
			t.Error("report of an unknown agent was saved")
		}
		r, err := s.LatestReport(ctx, "agt-1")
		if err != nil || string(r.Bytes) != `{"n":2}` {
			t.Errorf("LatestReport = %q, %v; want the second report", r.Bytes, err)
		}
		if _, err := s.LatestReport(ctx, "agt-2"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("LatestReport of unknown: %v, want ErrNotFound", err)
		}
		nodes, err := s.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("Nodes = %v, %v", nodes, err)
		}
		if !nodes[0].HasReport {
			t.Error("node has no report after SaveReport")
		}
		if since, err := s.NodesUpdatedSince(ctx, nodes[0].UpdatedAt); err != nil || len(since) != 1 {
			t.Errorf("NodesUpdatedSince(its own update) = %d nodes, %v; want 1", len(since), err)
		}
		if since, err := s.NodesUpdatedSince(ctx, nodes[0].UpdatedAt.Add(time.Nanosecond)); err != nil || len(since) != 0 {
			t.Errorf("NodesUpdatedSince(after its update) = %d nodes, %v; want 0", len(since), err)
		}
		if diff := cmp.Diff(idx, nodes[0].Index); diff != "" {
			t.Errorf("index (-want +got):\n%s", diff)
		}
	})

	t.Run("heartbeats never move last seen back", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		for _, id := range []string{"agt-1", "agt-2"} {
			if _, _, err := s.EnrollAgent(ctx, agent(id, "key-"+id, "us-east-1"), nil); err != nil {
				t.Fatal(err)
			}
		}
		beats := []store.Heartbeat{
			{AgentID: "agt-1", At: t0.Add(2 * time.Second), RTTMS: 12.5}, // fractional: typed as a float on every backend
			{AgentID: "agt-1", At: t0.Add(1 * time.Second), RTTMS: 99},   // late, older: ignored
			{AgentID: "agt-2", At: t0, RTTMS: 3},
			{AgentID: "agt-2", At: t0.Add(time.Second), RTTMS: -1}, // no RTT: keeps 3
			{AgentID: "agt-unknown", At: t0, RTTMS: 1},
		}
		if err := s.RecordHeartbeats(ctx, beats); err != nil {
			t.Fatal(err)
		}
		nodes, err := s.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type seen struct {
			ID   string
			Seen time.Time
			RTT  float64
		}
		var got []seen
		for _, n := range nodes {
			got = append(got, seen{n.ID, n.LastSeen, n.RTTMS})
		}
		want := []seen{{"agt-1", t0.Add(2 * time.Second), 12.5}, {"agt-2", t0.Add(time.Second), 3}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("liveness (-want +got):\n%s", diff)
		}
		live, err := s.Liveness(ctx, t0.Add(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Heartbeat{{AgentID: "agt-1", At: t0.Add(2 * time.Second), RTTMS: 12.5}}, live); diff != "" {
			t.Errorf("Liveness since t0+1.5s (-want +got):\n%s", diff)
		}
	})

	t.Run("heartbeat batches as if applied beat by beat", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		if _, _, err := s.EnrollAgent(ctx, agent("agt-1", "key-1", "us-east-1"), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordHeartbeats(ctx, []store.Heartbeat{{AgentID: "agt-1", At: t0.Add(5 * time.Second), RTTMS: 4}}); err != nil {
			t.Fatal(err)
		}
		// More nodes than one statement takes; agt-1's RTT comes from a
		// beat older than the stored one, so it is not taken, while the
		// newer beat without an RTT moves last-seen.
		var beats []store.Heartbeat
		for i := 0; i < 1200; i++ {
			beats = append(beats, store.Heartbeat{AgentID: fmt.Sprintf("agt-x%04d", i), At: t0, RTTMS: 1})
		}
		beats = append(beats, store.Heartbeat{AgentID: "agt-1", At: t0.Add(3 * time.Second), RTTMS: 7},
			store.Heartbeat{AgentID: "agt-1", At: t0.Add(6 * time.Second), RTTMS: -1})
		if err := s.RecordHeartbeats(ctx, beats); err != nil {
			t.Fatal(err)
		}
		live, err := s.Liveness(ctx, t0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Heartbeat{{AgentID: "agt-1", At: t0.Add(6 * time.Second), RTTMS: 4}}, live); diff != "" {
			t.Errorf("Liveness (-want +got):\n%s", diff)
		}
		// A later batch with an RTT takes it.
		if err := s.RecordHeartbeats(ctx, []store.Heartbeat{{AgentID: "agt-1", At: t0.Add(7 * time.Second), RTTMS: 9.5}}); err != nil {
			t.Fatal(err)
		}
		live, err = s.Liveness(ctx, t0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Heartbeat{{AgentID: "agt-1", At: t0.Add(7 * time.Second), RTTMS: 9.5}}, live); diff != "" {
			t.Errorf("Liveness after a later beat (-want +got):\n%s", diff)
		}
	})

	t.Run("launch stats over a window", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		for _, l := range []store.Launch{
			{NodeID: "agt-1", At: t0.Add(-25 * time.Hour), Failed: true, Reason: "old"},
			{NodeID: "agt-1", At: t0.Add(-time.Hour), Failed: true, Reason: "cuda init"},
			{NodeID: "agt-1", At: t0.Add(-time.Minute)},
			{NodeID: "agt-1", At: t0},
			{NodeID: "agt-2", At: t0},
			// One run, launched and then lost under its node: one
			// failed launch, not one failed and one successful.
			{NodeID: "agt-3", At: t0.Add(-time.Hour), AllocID: "alloc-lost"},
			{NodeID: "agt-3", At: t0, Failed: true, Reason: "node lost: NODE_FAIL", AllocID: "alloc-lost"},
			{NodeID: "agt-3", At: t0, AllocID: "alloc-ok"},
		} {
			if err := s.RecordLaunch(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.LaunchStats(ctx, t0.Add(-24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]store.LaunchStats{"agt-1": {Launches: 3, Failures: 1}, "agt-2": {Launches: 1}, "agt-3": {Launches: 2, Failures: 1}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("LaunchStats (-want +got):\n%s", diff)
		}
	})

	t.Run("registry survives reopen", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		if _, _, err := s.EnrollAgent(ctx, agent("agt-1", "k1", "us-west-2"), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.SaveReport(ctx, store.Report{AgentID: "agt-1", Bytes: []byte("{}"), Signature: "s", ReceivedAt: t0,
			Index: store.NodeIndex{Region: "us-west-2", GPUCount: 4}}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateToken(ctx, store.Token{ID: "tok-1", Hash: "h", Role: store.RoleAgent, Regions: []string{"*"}, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		s2 := reopen(t)
		nodes, err := s2.Nodes(ctx)
		if err != nil || len(nodes) != 1 || nodes[0].Index.GPUCount != 4 {
			t.Errorf("after reopen Nodes = %+v, %v", nodes, err)
		}
		if _, err := s2.TokenByHash(ctx, "h"); err != nil {
			t.Errorf("after reopen token: %v", err)
		}
		// A write through one handle is seen by the other (two brokers).
		if err := s2.RecordHeartbeats(ctx, []store.Heartbeat{{AgentID: "agt-1", At: t0, RTTMS: 7}}); err != nil {
			t.Fatal(err)
		}
		nodes, err = s.Nodes(ctx)
		if err != nil || len(nodes) != 1 || !nodes[0].LastSeen.Equal(t0) {
			t.Errorf("first handle does not see the heartbeat written by the second: %+v, %v", nodes, err)
		}
	})
}
