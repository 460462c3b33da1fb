package pgtest_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// ServerPID names the postmaster, and the CPU of the queries its
// backends run shows in its process tree.
func TestServerPID(t *testing.T) {
	db, err := sql.Open("pgx", pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pid := pgtest.ServerPID(t)
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
		t.Fatalf("ServerPID %d: comm %q (%v), want postgres", pid, comm, err)
	}
	before, err := testutil.TreeCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A query that costs the backend some 100 ms of CPU or more.
	var n int64
	if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM generate_series(1, 3000000)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	after, err := testutil.TreeCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("the server's tree used %v over a 3-million-row count, want its backend's CPU (50 ms or more)", after-before)
	}
}
