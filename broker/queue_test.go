package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/runview"
)

// TestQueueOrderAndTimeout (issue #35): one node, busy; runs submitted
// to two replicas of one PostgreSQL store (one broker on SQLite) wait in
// one queue. Each replica shows the
// same positions (1, 2: from the store, not its memory); when the node
// frees, the first waiting run takes it, not a run submitted at that
// moment (which goes to the back); and a run still waiting when its
// queue timeout expires fails with where it stood and what was busy.
func TestQueueOrderAndTimeout(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const region = "us-west-2"
			db := brokertest.NewDB(t, kind)
			cfg := brokertest.Fast()
			cfg.Webhooks = fastHooks()
			one := brokertest.Start(t, db, cfg)
			// Replicas share PostgreSQL; a SQLite store has one broker.
			two := one
			if kind == "postgres" {
				two = brokertest.Start(t, db, cfg)
			}
			hook := newReceiver(t, nil)
			addHook(t, one.Store, hook.URL)
			busy := brokertest.StartRun(t, one, region) // the only node, running
			dial := func(b *brokertest.Broker) *client.RunClients {
				c, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, region)})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			onOne, onTwo := dial(one), dial(two)
			submit := func(c *client.RunClients, name string, queueTimeout int64) *gpupassv1.Run {
				t.Helper()
				resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
					SpecYaml: busy.SpecYAML, Region: region, Name: name,
					Command: []string{"python3", "train.py"}, QueueTimeoutSeconds: queueTimeout}))
				if err != nil {
					t.Fatalf("submitting %s: %v", name, err)
				}
				return resp.Msg.Run
			}
			get := func(c *client.RunClients, id string) *gpupassv1.Run {
				t.Helper()
				resp, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Msg.Run
			}
			first := submit(onOne, "first", 0)
			second := submit(onTwo, "second", 0)
			if first.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || first.QueuePosition != 1 || second.QueuePosition != 2 {
				t.Fatalf("submitted behind a busy node: %s %v position %d, %s %v position %d (%s); want pending at 1 and 2",
					first.Id, first.State, first.QueuePosition, second.Id, second.State, second.QueuePosition, second.Reason)
			}
			// Each replica lists the same queue.
			for i, c := range []*client.RunClients{onOne, onTwo} {
				resp, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]int32{}
				for _, r := range resp.Msg.Runs {
					got[r.Id] = r.QueuePosition
				}
				if got[first.Id] != 1 || got[second.Id] != 2 || got[busy.Run.Id] != 0 {
					t.Errorf("replica %d lists positions %v; want %s at 1, %s at 2, the running %s at 0", i+1, got, first.Id, second.Id, busy.Run.Id)
				}
				if r := get(c, second.Id); r.QueuePosition != 2 || r.QueueNodes != 1 || r.QueuedUnixNano == 0 || !strings.Contains(r.Reason, "waiting for a free node") {
					t.Errorf("replica %d: GetRun(second) = position %d, %d busy nodes, queued at %d, reason %q; want 2, 1, set, waiting",
						i+1, r.QueuePosition, r.QueueNodes, r.QueuedUnixNano, r.Reason)
				}
			}

			// The node frees; a run submitted right then must not take
			// it from the runs that waited.
			busy.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 0)
			late := submit(onTwo, "late", 2)
			if late.State != gpupassv1.AllocState_ALLOC_STATE_PENDING {
				t.Fatalf("a run submitted as the node freed took it (%v on %s) ahead of %s and %s, which waited", late.State, late.NodeId, first.Id, second.Id)
			}
			deadline := time.Now().Add(20 * time.Second)
			for get(onOne, first.Id).State == gpupassv1.AllocState_ALLOC_STATE_PENDING {
				if time.Now().After(deadline) {
					t.Fatalf("%s still pending 20 s after the node freed", first.Id)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if r := get(onTwo, first.Id); r.NodeId != busy.Agent.ID || r.QueuePosition != 0 {
				t.Errorf("first placed as %v on %q at position %d; want on %s, out of the queue", r.State, r.NodeId, r.QueuePosition, busy.Agent.ID)
			}
			if r := get(onOne, second.Id); r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || r.QueuePosition != 1 {
				t.Errorf("second is %v at position %d; want pending at 1", r.State, r.QueuePosition)
			}

			// late's 2 s run out while first holds the node.
			deadline = time.Now().Add(20 * time.Second)
			r := get(onOne, late.Id)
			for !runview.Terminal(r.State) {
				if time.Now().After(deadline) {
					t.Fatalf("%s still %v 20 s after its 2 s queue timeout began", late.Id, r.State)
				}
				time.Sleep(50 * time.Millisecond)
				r = get(onOne, late.Id)
			}
			want := "waited 2s in the queue at position 2 for 1 busy certified node in us-west-2: raise --queue-timeout or add nodes"
			// It keeps when it began waiting: clients tell a run that
			// waited out its timeout from one no node could take.
			if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || r.Reason != want || r.QueuedUnixNano == 0 {
				t.Errorf("late ended %v: %q, queued at %d; want failed: %q, with its time in the queue", r.State, r.Reason, r.QueuedUnixNano, want)
			}
			if r := get(onTwo, second.Id); r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || r.QueuePosition != 1 {
				t.Errorf("second, with no queue timeout, is %v at position %d; want still pending at 1", r.State, r.QueuePosition)
			}
			// The group's webhook carries the reason.
			deadline = time.Now().Add(20 * time.Second)
			for found := false; !found; {
				for _, got := range hook.got() {
					var ev broker.GroupEvent
					if json.Unmarshal(got.body, &ev) == nil && ev.Group == late.Group {
						found = true
						if len(ev.Runs) != 1 || ev.Runs[0].State != "failed" || ev.Runs[0].Reason != want {
							t.Errorf("webhook of late's group: %+v; want its run failed with %q", ev.Runs, want)
						}
					}
				}
				if !found && time.Now().After(deadline) {
					t.Fatalf("no webhook for late's group %s in 20 s", late.Group)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
