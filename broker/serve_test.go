package broker_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// A graceful shutdown with an agent long-polling and a client following
// logs ends those calls, returns no error and writes the heartbeats that
// were only in memory.
func TestServeShutdownEndsLongCallsAndFlushes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := brokertest.Fast()
	cfg.FlushInterval = time.Hour // beats stay in memory until Close
	// Serve's default shutdown timeout (10 s) is long enough that a
	// shutdown waiting for the calls fails.
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)

	w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
	run := submit(t, c, "us-west-2", nil)
	as := w.poll(t, 5)
	if as == nil || as.AllocId != run.Id {
		t.Fatalf("assignment = %v", as)
	}
	for _, st := range []gpupassv1.AllocState{gpupassv1.AllocState_ALLOC_STATE_STARTING, gpupassv1.AllocState_ALLOC_STATE_RUNNING} {
		if _, err := w.update(as, st, "", 3); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.upload(as, records(1, 3)); err != nil {
		t.Fatal(err)
	}

	polled := make(chan error, 1)
	go func() {
		resp, err := w.runs.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: w.ID, WaitSeconds: 30}))
		if err == nil && resp.Msg.Assignment != nil {
			t.Errorf("long poll got an assignment: %v", resp.Msg.Assignment)
		}
		polled <- err
	}()
	st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, Follow: true}))
	if err != nil {
		t.Fatal(err)
	}
	// The first message proves the follow is in flight; it then waits.
	if !st.Receive() {
		t.Fatalf("follow ended before its first records: %v", st.Err())
	}

	// The poll must be held by the broker before it stops: a request
	// still on its way then finds the listener closed (connection
	// refused), which says nothing of how Serve ends the calls it holds.
	for deadline := time.Now().Add(10 * time.Second); b.Broker.LongPolls() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls held after 10 s; want the long poll and the follow", b.Broker.LongPolls())
		}
	}
	b.Stop(t) // fails the test unless Serve shut down cleanly
	if err := <-polled; err != nil {
		t.Errorf("long poll during shutdown: %v, want an empty answer", err)
	}
	for st.Receive() {
	}
	if code := brokertest.Code(st.Err()); code != connect.CodeUnavailable {
		t.Errorf("follow during shutdown ended with %v, want unavailable (follow again)", st.Err())
	}
	nodes, err := b.Store.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == w.ID && n.LastSeen.IsZero() {
			t.Errorf("node %s has no last-seen after shutdown: buffered heartbeats were lost", n.ID)
		}
	}
	if len(nodes) != 1 {
		t.Errorf("store holds %d nodes, want 1", len(nodes))
	}
}
