package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/postgres"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/broker/store/storetest"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

// BenchmarkNodes measures a broker's first registry read (Store.Nodes on a
// freshly opened store, as at start-up) at 10,000 and 100,000 nodes on a
// real PostgreSQL on loopback (the server's CPU is not in cpu-ms/op). The
// registry is storetest's generated one, written by the SQLite store and
// copied row for row (storetest.CopyRegistry): through the store's API,
// 100,000 nodes take many minutes here.
func BenchmarkNodes(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			ctx := context.Background()
			dsn := pgtest.NewDatabase(b)
			src, err := sqlite.Open(ctx, storetest.RegistryFile(b, n, func(ctx context.Context, path string) (store.Store, error) {
				return sqlite.Open(ctx, path)
			}))
			if err != nil {
				b.Fatal(err)
			}
			s, err := postgres.Open(ctx, dsn)
			if err != nil {
				b.Fatal(err)
			}
			if err := storetest.CopyRegistry(ctx, src.DB(), s.DB(), true); err != nil {
				b.Fatal(err)
			}
			src.Close()
			if _, err := s.DB().ExecContext(ctx, `VACUUM ANALYZE`); err != nil {
				b.Fatal(err)
			}
			// The copy is the registry, field for field.
			nodes, err := s.Nodes(ctx)
			if err == nil {
				err = storetest.CheckRegistry(nodes, n)
			}
			if err != nil {
				b.Fatal(err)
			}
			s.Close()
			storetest.BenchNodes(b, n, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, dsn) })
		})
	}
}
