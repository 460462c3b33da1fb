package sqlite_test

import (
	"context"
	"path/filepath"
	"strings"
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
