package sqlite_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/broker/store/storetest"
)

// BenchmarkNodes measures a broker's first registry read (Store.Nodes on a
// freshly opened store, as at start-up) at 10,000 and 100,000 nodes.
// Populating 100,000 nodes through the store takes a while:
// GPUPASS_BENCH_REGISTRY_DIR keeps the generated databases between runs
// (scripts/bench.d/31-registry.sh compares revisions on the same files).
func BenchmarkNodes(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			path := registryDB(b, n)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := sqlite.Open(ctx, path)
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

// registryDB is a copy of a SQLite registry of n generated nodes.
func registryDB(b *testing.B, n int) string {
	b.Helper()
	name := fmt.Sprintf("registry-%d.db", n)
	dir := os.Getenv("GPUPASS_BENCH_REGISTRY_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	cached := filepath.Join(dir, name)
	if _, err := os.Stat(cached); err != nil {
		tmp := cached + ".tmp"
		os.Remove(tmp)
		s, err := sqlite.Open(context.Background(), tmp)
		if err != nil {
			b.Fatal(err)
		}
		storetest.PopulateRegistry(b, s, n, 1)
		if _, err := s.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			b.Fatal(err)
		}
		s.Close()
		if err := os.Rename(tmp, cached); err != nil {
			b.Fatal(err)
		}
	}
	// A copy: opening migrates, and each revision reads the same bytes.
	path := filepath.Join(b.TempDir(), name)
	if err := copyFile(cached, path); err != nil {
		b.Fatal(err)
	}
	return path
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
