package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
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
