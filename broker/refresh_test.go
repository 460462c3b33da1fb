package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
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

// TestEnrollInApproveRegionReadsNoRegistry: Enroll's warning that a node
// waits for admission comes from the decisions this replica holds; it
// made every enrollment in an approve region refresh the snapshot (a
// registry read and a re-index each, for a log line), one after another
// when a fleet re-enrolls after a restart.
func TestEnrollInApproveRegionReadsNoRegistry(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c := &readCounter{Store: st}
	logged := &testutil.Buffer{}
	b := New(Config{Store: c, SnapshotTTL: time.Hour, OfflineAfter: time.Hour, HeartbeatInterval: time.Minute,
		Admission: []AdmissionRule{{Pattern: "eu-*", Mode: AdmissionApprove}}, Logger: slog.New(slog.NewTextHandler(logged, nil))})
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	ctx := context.WithValue(context.Background(), tokenKey{}, store.Token{ID: "tok-agent", Role: store.RoleAgent, Regions: []string{"*"}})
	if _, err := b.snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	before := c.reads.Load()
	for range 3 {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pem, err := conformance.PublicKeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		req := &gpupassv1.EnrollRequest{PublicKeyPem: pem, Labels: &gpupassv1.NodeLabels{Region: "eu-central-1", Provider: "test"}}
		if _, err := (&agentService{b: b}).Enroll(ctx, connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.reads.Load() - before; got != 0 {
		t.Errorf("3 enrollments in an approve region made %d registry reads, want 0", got)
	}
	if n := strings.Count(logged.String(), "node takes no runs until an admin admits it"); n != 3 {
		t.Errorf("%d warnings that a node waits for admission, want 3:\n%s", n, logged.String())
	}
}
