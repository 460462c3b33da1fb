package broker_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// Each replica knows only the agent-call counters it took: a call
// captured on its way to replica A and replayed to replica B must be
// refused there all the same. The genuine agent, moving from A to B, is
// told so and makes its next call with B's time.
func TestAgentCallReplayToAnotherReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := brokertest.NewDB(t, "postgres")
	a := brokertest.Start(t, db, brokertest.Fast())
	b := brokertest.Start(t, db, brokertest.Fast())
	tok := a.Token(t, store.RoleAgent, "*")
	w := newWorker(t, a, tok, brokertest.H100("us-west-2", 20))

	rec := &recorder{next: client.HTTPClient(false, nil).Transport}
	calls := dialWithTransport(t, a.URL, tok, w.Creds.Transport(rec))
	poll := &gpupassv1.PollWorkRequest{AgentId: w.ID, WaitSeconds: 0}
	if _, err := calls.Work.PollWork(ctx, connect.NewRequest(poll)); err != nil {
		t.Fatal(err)
	}
	// The same bytes, proof included, sent to the other replica.
	rec.mu.Lock()
	bURL, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec.req.URL.Host, rec.req.Host = bURL.Host, bURL.Host
	rec.mu.Unlock()
	status, body := rec.replay(t)
	if status == http.StatusOK || !strings.Contains(body, `"aborted"`) || !strings.Contains(body, "another broker replica's") {
		t.Errorf("call replayed to another replica: %d %s, want aborted: another replica's echo", status, body)
	}

	// The agent itself moves to B: its first call there is refused for
	// A's time and made again with B's, which B takes.
	onB := w.Runs(t, b.URL, tok)
	for range 2 {
		if _, err := onB.Work.PollWork(ctx, connect.NewRequest(poll)); err != nil {
			t.Fatalf("the agent's own call on replica B: %v", err)
		}
	}
}

// TestRunForANodeAnotherReplicaJustSaw: two brokers on one PostgreSQL with
// the production timings (heartbeats written every 250 ms, the registry
// re-read every 500 ms). A node enrolls and beats through b1, and a run
// for its region is submitted to b0 at once, as a CI job does right after
// its autoscaled node comes up. b0 knows of the node only from the store,
// and not yet: the run must wait for the news and be placed on the node,
// not fail with "never sent a heartbeat" or "no certified node". A region
// with no node at all still fails, within a bounded time.
func TestRunForANodeAnotherReplicaJustSaw(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	b0, b1 := brokertest.Start(t, db, broker.Config{}), brokertest.Start(t, db, broker.Config{})
	agentTok := b0.Token(t, store.RoleAgent, "*")
	c := dialRuns(t, b0, b0.Token(t, store.RoleSubmit, "*"))
	for _, region := range []string{"us-west-2", "us-east-1", "eu-central-1"} {
		w := newWorker(t, b1, agentTok, brokertest.H100(region, 20))
		w.keepAlive(t)
		run := submit(t, c, region, nil)
		r := waitRun(t, c, run.Id, "placed or ended", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
		if r.State != gpupassv1.AllocState_ALLOC_STATE_MATCHED || r.NodeId != w.ID {
			t.Errorf("%s: run submitted to b0 right after %s's first beats on b1 is %s on %q (%s), want matched on %s", region, w.ID, r.State, r.NodeId, r.Reason, w.ID)
		}
	}
	start := time.Now()
	run := submit(t, c, "ap-south-1", nil)
	r := waitRun(t, c, run.Id, "failed", func(r *gpupassv1.Run) bool { return r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING })
	if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, "no certified node in region ap-south-1") {
		t.Errorf("run for a region without nodes: %s (%s), want failed: no certified node", r.State, r.Reason)
	}
	took := time.Since(start)
	t.Logf("a run for a region without nodes failed after %s", took)
	if took > 5*time.Second {
		t.Errorf("a run for a region without nodes failed after %s, want within 5 s", took)
	}
}
