package postgres_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/postgres"
	"github.com/gpupass/gpupass/broker/store/sqlstore"
	"github.com/gpupass/gpupass/broker/store/storetest"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) (store.Store, func(*testing.T) store.Store) {
		dsn := pgtest.NewDatabase(t)
		open := func(t *testing.T) store.Store {
			s, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(t), open
	}, storetest.Options{LockWaiters: lockWaiters})
}

// lockWaiters counts the sessions of s's database waiting for a lock.
func lockWaiters(ctx context.Context, s store.Store) (int, error) {
	var n int
	err := s.(*sqlstore.Store).DB().QueryRowContext(ctx,
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
	return n, err
}

// Replicas starting together on an empty database migrate exactly once.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(context.Background(), dsn)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent open: %v", err)
		}
	}
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(context.Background()); err != nil || v != len(postgres.Migrations) {
		t.Errorf("schema version %d, %v; want %d", v, err, len(postgres.Migrations))
	}
}

// Signals between two stores on one database: each listener hears every
// signal (its own store's included), a payload over the limit is refused
// before it reaches the server, and a listener that has stopped leaves
// no listening session behind (its connection is closed, not pooled).
func TestSignals(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	open := func() *sqlstore.Store {
		s, err := postgres.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	ctx, cancel := context.WithCancel(context.Background())
	heard := make(chan string, 8)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- b.Listen(ctx, func() { close(ready) }, func(p string) { heard <- p }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Listen: %v", err)
	}
	for _, s := range []*sqlstore.Store{a, b} {
		if err := s.Signal(context.Background(), "gp1 x c n1"); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-heard:
			if p != "gp1 x c n1" {
				t.Errorf("heard %q, want the payload sent", p)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a signal was not heard within 5 s")
		}
	}
	if err := a.Signal(context.Background(), strings.Repeat("n", store.MaxSignal+1)); err == nil || !strings.Contains(err.Error(), "at most 7999") {
		t.Errorf("a payload of MaxSignal+1 bytes: %v, want refused", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Listen after its context ended: %v, want context.Canceled", err)
	}
	// The pool still works, and no session listens any more.
	var n int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := b.DB().QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still listen 5 s after the listener stopped", n)
		}
	}
}

// TestUpgradeDropsClearSessionKeys (issue #31): a store written before
// verifiers held session keys in clear, readable by any holder of a dump.
// Opening it drops them (agents enroll again for a new key) and keeps
// verifiers from then on.
func TestUpgradeDropsClearSessionKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqlstore.Open(ctx, db, sqlstore.Dialect{Name: "postgres", Dollar: true, Migrations: postgres.Migrations[:8]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO agent_sessions (agent_id, session_key, epoch, issued_at) VALUES ('agt-old', $1, 3, 1)`, bytes.Repeat([]byte{7}, 32)); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.SessionVerifier(ctx, "agt-old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("session of agt-old after the upgrade: %v, want ErrNotFound (the agent enrolls again)", err)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'agent_sessions'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the table of clear session keys is still there (%d, %v)", n, err)
	}
	if e, err := s.RotateSessionKey(ctx, "agt-old", make([]byte, 32), time.Now()); err != nil || e != 1 {
		t.Errorf("first verifier after the upgrade: epoch %d, %v; want 1", e, err)
	}
}

// TestUpgradeQueue (issue #35): a run waiting when the broker is upgraded
// to version 13 is not in the queue until the broker places it again.
func TestUpgradeQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqlstore.Open(ctx, db, sqlstore.Dialect{Name: "postgres", Dollar: true, Migrations: postgres.Migrations[:12]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO allocs (id, name, region, state, created_at, updated_at, body)
		VALUES ('alloc-old', 'old-us-west-2', 'us-west-2', 'pending', 1, 1, '{"ID":"alloc-old","Name":"old-us-west-2","Region":"us-west-2","State":"pending","Reason":"waiting for a free node","created_ns":1,"updated_ns":1}')`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if q, err := s.QueuedAllocs(ctx, "us-west-2", 10); err != nil || len(q) != 0 {
		t.Fatalf("queue right after the upgrade: %d runs, %v; want none (not placed since)", len(q), err)
	}
	a, err := s.Alloc(ctx, "alloc-old")
	if err != nil || a.Reason != "waiting for a free node" || !a.QueuedAt.IsZero() {
		t.Fatalf("run stored before the upgrade reads back as %+v, %v", a, err)
	}
	at := time.Now().UTC()
	if _, err := s.UpdateAlloc(ctx, "alloc-old", func(a *store.Alloc) error { a.QueuedAt = at; return nil }); err != nil {
		t.Fatal(err)
	}
	if q, err := s.QueuedAllocs(ctx, "us-west-2", 10); err != nil || len(q) != 1 || !q[0].QueuedAt.Equal(at) {
		t.Errorf("queue once the broker found its nodes busy: %v, %v; want alloc-old queued at %v", q, err, at)
	}
}
