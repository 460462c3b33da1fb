package postgres_test

import (
	"context"
	"os"
	"sync"
	"testing"

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
