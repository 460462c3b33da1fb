package sqlite_test

import (
	"context"
	"fmt"
	"testing"

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
			storetest.BenchNodes(b, n, func(ctx context.Context) (store.Store, error) { return sqlite.Open(ctx, path) })
		})
	}
}

func open(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) }
