package broker

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
)

// readCounter counts the registry reads a refresh makes.
type readCounter struct {
	store.Store
	reads atomic.Int64
}

func (c *readCounter) Nodes(ctx context.Context) ([]store.Node, error) {
	c.reads.Add(1)
	return c.Store.Nodes(ctx)
}

func (c *readCounter) NodesUpdatedSince(ctx context.Context, t time.Time) ([]store.Node, error) {
	c.reads.Add(1)
	return c.Store.NodesUpdatedSince(ctx, t)
}

// TestRefreshesShareARead: callers that need a snapshot read after a
// moment (runs placed together while a replica waits for news of their
// node) share one read of the store instead of each making its own; a
// caller for an older moment reads nothing. Forcing a read per caller
// made 20 reads for 20 runs submitted together.
func TestRefreshesShareARead(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c := &readCounter{Store: st}
	b := New(Config{Store: c, SnapshotTTL: time.Hour, OfflineAfter: time.Hour, HeartbeatInterval: time.Minute})
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	ctx := context.Background()
	if _, err := b.snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	before := c.reads.Load()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if s, err := b.refresh(ctx, after); err != nil || s.at.Before(after) {
				t.Errorf("refresh: read at %v, %v; want one read after %v", s.at, err, after)
			}
		})
	}
	wg.Wait()
	if got := c.reads.Load() - before; got != 1 {
		t.Errorf("20 callers wanting a read after the same moment made %d reads of the nodes, want 1", got)
	}
	before = c.reads.Load()
	if _, err := b.refresh(ctx, after.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := c.reads.Load() - before; got != 0 {
		t.Errorf("a caller content with an older read made %d reads, want 0", got)
	}
}
