// Package pgtest starts a throwaway PostgreSQL 15 cluster for tests: initdb
// and pg_ctl run as the postgres user (via runuser when the tests run as
// root), data and socket directory in a temporary directory, listening on a
// free loopback port, trust authentication (loopback only). One cluster is
// shared per test binary; every test gets a database of its own.
//
// Use it from TestMain so the cluster is stopped when the binary exits:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
// With CI=true a missing PostgreSQL fails the test (testutil.Missing).
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/gpupass/gpupass/internal/testutil"
)

// BinDir is where Debian installs the PostgreSQL 15 server binaries.
const BinDir = "/usr/lib/postgresql/15/bin"

type cluster struct {
	dir  string
	port int
	err  error
	// missing is set when PostgreSQL is not installed (skip, or fail in CI).
	missing string
	stopFn  func()
}

var (
	once   sync.Once
	shared *cluster
)

// Run runs the tests and stops the shared cluster afterwards.
func Run(m *testing.M) int {
	code := m.Run()
	if shared != nil && shared.err == nil && shared.missing == "" {
		shared.stop()
	}
	return code
}

// NewDatabase returns the URL of a fresh, empty database on the shared
// cluster (starting it on first use).
func NewDatabase(t testing.TB) string {
	t.Helper()
	c := running(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	admin, err := sql.Open("pgx", c.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	return c.url(name)
}

// running returns the shared cluster, starting it on first use; a test
// skips where PostgreSQL is not installed (fails in CI).
func running(t testing.TB) *cluster {
	t.Helper()
	once.Do(func() { shared = start() })
	c := shared
	if c.missing != "" {
		testutil.Missing(t, "%s", c.missing)
	}
	if c.err != nil {
		t.Fatalf("starting postgres: %v", c.err)
	}
	return c
}

func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

func start() *cluster {
	c := &cluster{}
	initdb := filepath.Join(BinDir, "initdb")
	if _, err := os.Stat(initdb); err != nil {
		if p, lerr := exec.LookPath("initdb"); lerr == nil {
			initdb = p
		} else {
			c.missing = "PostgreSQL 15 server (initdb) not installed"
			return c
		}
	}
	pgctl := filepath.Join(filepath.Dir(initdb), "pg_ctl")
	asPostgres := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		}
		return exec.Command(name, args...)
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		c.err = err
		return c
	}
	c.dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			c.missing = "no postgres user to run the server as"
			return c
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			c.err = err
			return c
		}
		// The temp dir's parents must be traversable by postgres.
		_ = os.Chmod(dir, 0o755)
	}
	data := filepath.Join(dir, "data")
	if out, err := asPostgres(initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		c.err = fmt.Errorf("initdb: %v: %s", err, out)
		return c
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.err = err
		return c
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", c.port, dir)
	if out, err := asPostgres(pgctl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		c.err = fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
		return c
	}
	c.stopFn = func() {
		_ = asPostgres(pgctl, "-D", data, "-m", "immediate", "-w", "stop").Run()
		_ = os.RemoveAll(dir)
	}
	return c
}

func (c *cluster) stop() {
	if c.stopFn != nil {
		c.stopFn()
	}
}

// ServerPID is the shared cluster's postmaster PID (its backends are its
// children), for benchmarks that say how much CPU the server took. It
// starts the cluster if no test has yet.
func ServerPID(t testing.TB) int {
	t.Helper()
	c := running(t)
	f := filepath.Join(c.dir, "data", "postmaster.pid")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatalf("pgtest.ServerPID: %v", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("pgtest.ServerPID: %s: first line %q is not a PID: %v", f, line, err)
	}
	return pid
}
