package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpupass/gpupass/broker/store/postgres"
	"github.com/gpupass/gpupass/broker/store/storetest"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

// BenchmarkNodes measures a broker's first registry read (Store.Nodes on a
// freshly opened store, as at start-up) at 10,000 and 100,000 nodes on a
// real PostgreSQL on loopback.
func BenchmarkNodes(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			dsn := pgtest.NewDatabase(b)
			ctx := context.Background()
			s, err := postgres.Open(ctx, dsn)
			if err != nil {
				b.Fatal(err)
			}
			storetest.PopulateRegistry(b, s, n, 8)
			if _, err := s.DB().ExecContext(ctx, `VACUUM ANALYZE`); err != nil {
				b.Fatal(err)
			}
			s.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := postgres.Open(ctx, dsn)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				nodes, err := s.Nodes(ctx)
				b.StopTimer()
				s.Close()
				if err != nil || len(nodes) != n {
					b.Fatalf("Nodes = %d nodes, %v; want %d", len(nodes), err, n)
				}
				b.StartTimer()
			}
		})
	}
}
