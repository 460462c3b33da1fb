package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestGangOneEligibleNode is issue #34's "a region with one eligible
// node: the run waits or fails with the reason, and holds no node
// meanwhile", read from the store itself (not only the API's view), on
// SQLite and PostgreSQL: of a region's two rendezvous nodes, one is busy
// (the gang waits, holding neither, and takes both once it frees), has
// stopped beating, or runs another runtime (the gang fails with the
// reason, holding neither).
func TestGangOneEligibleNode(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		for _, tc := range []struct {
			name string
			// second is the region's other node; silent: it stops
			// beating after registering.
			second func(n *brokertest.NodeSpec)
			silent bool
			busy   bool
			// why is the failed run's reason; "" for a gang that waits.
			why string
		}{
			{name: "one of two busy", busy: true},
			{name: "one of two offline", silent: true, why: "no gang of 2 nodes in us-west-2: only 1 certified h100-sxm5 node online (1 offline), a gang needs 2"},
			{name: "one of two certified for the runtime", second: func(n *brokertest.NodeSpec) { n.CUDA = "12.2.140" },
				why: "no gang of 2 nodes in us-west-2: 2 certified h100-sxm5 nodes, but only 1 matches the spec's runtime (a gang needs 2)"},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := brokertest.NewDB(t, kind)
				cfg := brokertest.Fast()
				cfg.OfflineAfter, cfg.HeartbeatInterval = 2*time.Second, 500*time.Millisecond
				b := brokertest.Start(t, db, cfg)
				rs := db.Open(t).(store.Runs)
				agentTok := b.Token(t, store.RoleAgent, "*")
				c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
				ws := map[string]*worker{}
				for i := range 2 {
					n := gangNode(i)
					if i == 1 && tc.second != nil {
						tc.second(&n)
					}
					w := newWorker(t, b, agentTok, n)
					if !(i == 1 && tc.silent) {
						w.keepAlive(t)
					}
					ws[w.ID] = w
				}
				if tc.silent {
					time.Sleep(cfg.OfflineAfter + 500*time.Millisecond)
				}
				var busy *gpupassv1.Run
				if tc.busy {
					busy = submit(t, c, "us-west-2", nil)
					busy = waitRun(t, c, busy.Id, "placed", matched)
				}
				run := submitGang(t, c, "gang")
				// holdsNone checks the store: neither rank has a node, and
				// no node but the busy run's is held.
				holdsNone := func(when string) {
					t.Helper()
					for _, id := range []string{run.Id, run.Id + "-r1"} {
						a, err := rs.Alloc(ctx, id)
						if err != nil {
							t.Fatal(err)
						}
						if a.NodeID != "" || (tc.why == "" && a.State != store.AllocPending) {
							t.Errorf("%s: %s is %s on %q in the store (%s), want %s on no node", when, id, a.State, a.NodeID, a.Reason,
								map[bool]string{true: "pending", false: "ended"}[tc.why == ""])
						}
					}
					active, err := rs.ActiveAllocs(ctx)
					if err != nil {
						t.Fatal(err)
					}
					for _, a := range active {
						if a.NodeID != "" && (busy == nil || a.ID != busy.Id) {
							t.Errorf("%s: %s holds %s in the store", when, a.ID, a.NodeID)
						}
					}
				}
				if tc.why != "" {
					r := waitRun(t, c, run.Id, "ended", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
					if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, tc.why) {
						t.Errorf("gang: %s (%s), want failed: %s", r.State, r.Reason, tc.why)
					}
					holdsNone("after the gang failed")
					return
				}
				waitRun(t, c, run.Id, "queued", func(r *gpupassv1.Run) bool { return r.QueuedUnixNano > 0 })
				if r := getRun(t, c, run.Id); !strings.Contains(r.Reason, "waiting for a free node") {
					t.Errorf("waiting gang's reason %q, want it to say it waits for a free node", r.Reason)
				}
				holdsNone("when the gang queued")
				// superviseRuns places pending runs every second: a
				// placement that wrongly took the free node would show.
				time.Sleep(1500 * time.Millisecond)
				holdsNone("1.5 s later")
				w := ws[busy.NodeId]
				as := w.poll(t, 5)
				for _, st := range []gpupassv1.AllocState{gpupassv1.AllocState_ALLOC_STATE_RUNNING, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED} {
					if _, err := w.update(as, st, "exited with status 0", 0); err != nil {
						t.Fatal(err)
					}
				}
				waitRun(t, c, run.Id, "placed", matched)
				if r1 := getRun(t, c, run.Id+"-r1"); !matched(r1) {
					t.Errorf("rank 1 once the busy node freed: %s on %q (%s), want matched", r1.State, r1.NodeId, r1.Reason)
				}
			})
		}
	}
}
