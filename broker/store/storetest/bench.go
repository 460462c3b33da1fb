package storetest

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchNodes times a broker's first registry read of n nodes: Nodes on
// a store that open makes afresh each time, as at start-up. It reports
// CPU per read besides wall time, and the load beside them.
func BenchNodes(b *testing.B, n int, open func(context.Context) (store.Store, error)) {
	ctx := context.Background()
	b.ReportAllocs()
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, err := open(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cpu0 := testutil.CPUTime()
		nodes, err := s.Nodes(ctx)
		cpu += testutil.CPUTime() - cpu0
		b.StopTimer()
		s.Close()
		if err != nil || len(nodes) != n {
			b.Fatalf("Nodes = %d nodes, %v; want %d", len(nodes), err, n)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	b.ReportMetric(testutil.Load1(), "load1")
}

// RegistryFile returns the path of a fresh copy of a SQLite database
// holding the generated registry of n nodes, opened and populated with
// open (sqlite.Open) the first time. Populating 100,000 nodes through the
// store takes minutes, so the generated databases are kept between runs
// in GPUPASS_BENCH_REGISTRY_DIR (default: gpupass-bench-registry in the
// temporary directory); scripts/bench.d/31-registry.sh reads the same
// files with two revisions. Each caller gets its own copy: opening a
// store migrates it.
func RegistryFile(b testing.TB, n int, open func(ctx context.Context, path string) (store.Store, error)) string {
	b.Helper()
	// The name changes with what RegistryNode generates.
	name := fmt.Sprintf("registry-v1-%d.db", n)
	dir := os.Getenv("GPUPASS_BENCH_REGISTRY_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "gpupass-bench-registry")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	cached := filepath.Join(dir, name)
	if _, err := os.Stat(cached); err != nil {
		tmp := cached + ".tmp"
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(tmp + suffix)
		}
		s, err := open(context.Background(), tmp)
		if err != nil {
			b.Fatal(err)
		}
		PopulateRegistry(b, s, n, 1)
		// Everything into the main file, which is all that is copied.
		if db, ok := s.(interface{ DB() *sql.DB }); ok {
			if _, err := db.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
				b.Fatal(err)
			}
		}
		s.Close()
		if err := os.Rename(tmp, cached); err != nil {
			b.Fatal(err)
		}
	}
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

// registryTables are the columns of the registry's two tables, as both
// backends' schemas name them.
var registryTables = []struct{ name, cols string }{
	{"agents", "id, public_key_pem, key_fingerprint, agent_version, token_id, enrolled_at, provider, region, zone, price_per_hour, storage_class, bandwidth_gbps, hostname"},
	{"nodes", "id, has_report, idx, last_seen, rtt_ms, updated_at"},
}

// CopyRegistry copies the registry tables row for row from one database
// into another's empty ones (dollar: PostgreSQL placeholders), in one
// transaction of multi-row INSERTs: 100,000 nodes through the store's
// API, a transaction or two each, take many minutes on PostgreSQL. The
// rows are the store's own (RegistryFile's), so the stored form is
// exactly what the store writes; check what is read back with
// CheckRegistry.
func CopyRegistry(ctx context.Context, from, to *sql.DB, dollar bool) error {
	tx, err := to.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, t := range registryTables {
		rows, err := from.QueryContext(ctx, "SELECT "+t.cols+" FROM "+t.name+" ORDER BY id")
		if err != nil {
			return fmt.Errorf("reading %s: %w", t.name, err)
		}
		ncol := strings.Count(t.cols, ",") + 1
		var batch []any
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			var q strings.Builder
			q.WriteString("INSERT INTO " + t.name + " (" + t.cols + ") VALUES ")
			for r := 0; r < len(batch)/ncol; r++ {
				if r > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(")
				for c := 0; c < ncol; c++ {
					if c > 0 {
						q.WriteString(", ")
					}
					if dollar {
						fmt.Fprintf(&q, "$%d", r*ncol+c+1)
					} else {
						q.WriteString("?")
					}
				}
				q.WriteString(")")
			}
			_, err := tx.ExecContext(ctx, q.String(), batch...)
			batch = batch[:0]
			return err
		}
		for rows.Next() {
			vals := make([]any, ncol)
			ptrs := make([]any, ncol)
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return fmt.Errorf("reading %s: %w", t.name, err)
			}
			if t.name == "nodes" {
				// SQLite keeps booleans as integers.
				if v, ok := vals[1].(int64); ok {
					vals[1] = v != 0
				}
			}
			batch = append(batch, vals...)
			if len(batch) >= 500*ncol {
				if err := flush(); err != nil {
					rows.Close()
					return fmt.Errorf("writing %s: %w", t.name, err)
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("reading %s: %w", t.name, err)
		}
		if err := flush(); err != nil {
			return fmt.Errorf("writing %s: %w", t.name, err)
		}
	}
	return tx.Commit()
}
