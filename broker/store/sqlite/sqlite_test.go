package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/broker/store/sqlstore"
	"github.com/gpupass/gpupass/broker/store/storetest"
)

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) (store.Store, func(*testing.T) store.Store) {
		path := filepath.Join(t.TempDir(), "broker.db")
		open := func(t *testing.T) store.Store {
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(t), open
	})
}

func TestMigrationsAreVersioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "broker.db")
	for i := 0; i < 2; i++ { // the second open finds the schema current
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.SchemaVersion(ctx)
		s.Close()
		if err != nil || v != len(sqlite.Migrations) {
			t.Fatalf("open %d: schema version %d, %v; want %d", i, v, err, len(sqlite.Migrations))
		}
	}
}

// TestRefreshQueriesUseIndexes: every broker runs the incremental
// registry refresh's queries every half second, so each must find the few
// recent rows by index. A full scan passes every other test and costs
// nothing at 1,000 nodes, but at 100,000 it kept the CPU busy with
// nothing else (dry-runs took seconds).
func TestRefreshQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct{ query, index string }{
		{"nodesSince", "nodes_updated"},
		{"liveness", "nodes_last_seen"},
	} {
		plan, err := s.QueryPlan(ctx, tc.query, int64(1))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan, "SEARCH n USING INDEX "+tc.index) && !strings.Contains(plan, "SEARCH nodes USING INDEX "+tc.index) {
			t.Errorf("query %s does not search nodes by %s; plan:\n%s", tc.query, tc.index, plan)
		}
	}
}

// TestEndedGroupsQueryUsesIndex: the webhook sweep looks for ended run
// groups every 2 s on the lease holder, so it must find the runs written
// in its window by allocs_updated. With the state in that search SQLite
// took allocs_active instead and read every run that ever ended, at each
// sweep.
func TestEndedGroupsQueryUsesIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plan, err := s.QueryPlan(ctx, "endedGroups", int64(1), int64(2), 500)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "SEARCH allocs USING INDEX allocs_updated") || strings.Contains(plan, "allocs_active") {
		t.Errorf("the ended-groups query does not find the window's runs by allocs_updated; plan:\n%s", plan)
	}
}

// TestFilesOwnerOnly (issue #31): the database and its -wal and -shm
// files are 0600 whatever the umask (this test's is the usual 022, under
// which SQLite alone makes them 0644), and a store an older broker left
// 0644 is narrowed when opened.
func TestFilesOwnerOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, path string) {
		t.Helper()
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// A write, so that the -wal and -shm files exist.
		if _, err := s.RotateSessionKey(ctx, "agt-x", make([]byte, 32), time.Now()); err != nil {
			t.Fatal(err)
		}
		for _, sfx := range []string{"", "-wal", "-shm"} {
			fi, err := os.Stat(path + sfx)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s is %v, want -rw------- (0600)", filepath.Base(path+sfx), fi.Mode().Perm())
			}
		}
	}
	t.Run("new", func(t *testing.T) {
		check(t, filepath.Join(t.TempDir(), "broker.db"))
	})
	t.Run("left 0644 by an older broker", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "broker.db")
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		for _, sfx := range []string{"", "-wal", "-shm"} {
			// SQLite removed the -wal and -shm files at close: empty
			// ones stand for those an older broker left behind.
			if _, err := os.Stat(path + sfx); os.IsNotExist(err) {
				if err := os.WriteFile(path+sfx, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(path+sfx, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		check(t, path)
	})
}

// TestUpgradeDropsClearSessionKeys (issue #31): a store written before
// verifiers held session keys in clear. Opening it drops them (no key a
// reader of the old file may have taken proves a node any more: agents
// enroll again for a new key) and keeps verifiers from then on.
func TestUpgradeDropsClearSessionKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "broker.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqlstore.Open(ctx, db, sqlstore.Dialect{Name: "sqlite", Migrations: sqlite.Migrations[:8]})
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{7}, 32)
	if _, err := db.ExecContext(ctx, `INSERT INTO agent_sessions (agent_id, session_key, epoch, issued_at) VALUES ('agt-old', ?, 3, 1)`, key); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.SessionVerifier(ctx, "agt-old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("session of agt-old after the upgrade: %v, want ErrNotFound (the agent enrolls again)", err)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'agent_sessions'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the table of clear session keys is still there (%d, %v)", n, err)
	}
	if e, err := s.RotateSessionKey(ctx, "agt-old", make([]byte, 32), time.Now()); err != nil || e != 1 {
		t.Errorf("first verifier after the upgrade: epoch %d, %v; want 1", e, err)
	}
}

// TestUpgradeQueue (issue #35): a run waiting when the broker is upgraded
// to version 13 is not in the queue (queued_at 0) until the broker places
// it again and finds its nodes busy; it is read back whole, and joins the
// queue then.
func TestUpgradeQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "broker.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqlstore.Open(ctx, db, sqlstore.Dialect{Name: "sqlite", Migrations: sqlite.Migrations[:12]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO allocs (id, name, region, state, created_at, updated_at, body)
		VALUES ('alloc-old', 'old-us-west-2', 'us-west-2', 'pending', 1, 1, '{"ID":"alloc-old","Name":"old-us-west-2","Region":"us-west-2","State":"pending","Reason":"waiting for a free node","created_ns":1,"updated_ns":1}')`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkUpgradedQueue(t, s)
}

func checkUpgradedQueue(t *testing.T, s store.Runs) {
	t.Helper()
	ctx := context.Background()
	if q, err := s.QueuedAllocs(ctx, "us-west-2", 10); err != nil || len(q) != 0 {
		t.Fatalf("queue right after the upgrade: %d runs, %v; want none (not placed since)", len(q), err)
	}
	a, err := s.Alloc(ctx, "alloc-old")
	if err != nil || a.Reason != "waiting for a free node" || !a.QueuedAt.IsZero() || a.QueueTimeoutSeconds != 0 {
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
