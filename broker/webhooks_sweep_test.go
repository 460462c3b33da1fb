package broker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
)

// TestSweepPagesThroughEndedGroups: more ended groups than one sweep
// reads (a page of one here, of 500 in a broker) are each delivered, a
// page a sweep, and a replica that takes the sweep up after a day reads
// back no further than a starting broker does. The sweep once kept its
// window where it was after a full page, so it read the same page every
// sweep and never reached the groups after it: none of them was sent.
func TestSweepPagesThroughEndedGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	recv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(recv.Close)
	// No sweep of its own in the test's time: the test makes each one.
	b := New(Config{Store: st, OfflineAfter: time.Hour, HeartbeatInterval: time.Minute,
		Webhooks: WebhookConfig{Sweep: time.Hour, Settle: time.Nanosecond}})
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	hook, err := AddWebhook(ctx, st, recv.URL, []byte("0123456789abcdef-webhook-secret"), nil)
	if err != nil {
		t.Fatal(err)
	}
	const groups = 3
	for i := range groups {
		a := store.Alloc{ID: fmt.Sprintf("alloc-page%d", i), Name: "n", Region: "us-west-2", Group: fmt.Sprintf("group-%016x", i), GroupSize: 1, State: store.AllocFailed}
		if err := st.CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	b.hooks.page = 1
	b.hooks.since = time.Now().Add(-24 * time.Hour)
	for i := range groups + 1 {
		if err := b.sweepWebhooks(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 0 && b.hooks.since.Before(time.Now().Add(-endedLookback-time.Minute)) {
			t.Errorf("after a day away the sweep reads from %s; want at most %s back", b.hooks.since, endedLookback)
		}
	}
	ds, err := st.Deliveries(ctx, hook.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.Group] = true
	}
	if len(seen) != groups {
		t.Errorf("deliveries for %d groups after %d sweeps: %v; want all %d", len(seen), groups+1, seen, groups)
	}
}
