package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/broker/store/storetest"
)

// BenchmarkNodes measures a broker's first registry read (Store.Nodes on a
// freshly opened store, as at start-up) at 10,000 and 100,000 nodes of
// storetest's generated registry (see storetest.RegistryFile).
func BenchmarkNodes(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			path := storetest.RegistryFile(b, n, open)
			ctx := context.Background()
			b.ReportAllocs()
			var cpu time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := sqlite.Open(ctx, path)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				cpu0 := storetest.CPUTime()
				nodes, err := s.Nodes(ctx)
				cpu += storetest.CPUTime() - cpu0
				b.StopTimer()
				s.Close()
				if err != nil || len(nodes) != n {
					b.Fatalf("Nodes = %d nodes, %v; want %d", len(nodes), err, n)
				}
				b.StartTimer()
			}
			// CPU besides wall time: on a shared machine the wall time
			// mostly measures the other tenants (the load beside it).
			b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			b.ReportMetric(storetest.Load1(), "load1")
		})
	}
}

func open(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) }
