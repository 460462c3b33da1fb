package broker_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"

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
