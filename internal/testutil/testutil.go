// Package testutil holds helpers shared by tests. It is imported only from
// _test.go files.
package testutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// real component is a failure, not a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing stops the test because a real component it needs (a binary, a
// server, an interpreter) is absent: a skip on a developer machine, a
// failure in CI, so that CI can never go green by skipping.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("required component missing (CI=true): "+format, args...)
	}
	t.Skipf("skipping, component missing: "+format+" (run `make deps` to install it)", args...)
}

// Tool returns the path of an executable on PATH or calls Missing.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found on PATH", name)
	}
	return p
}

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	// From the source file where the build keeps its path; with -trimpath
	// (which lets worktrees share one build cache) it does not, and the
	// root is the nearest directory above the test's own holding go.mod.
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		return filepath.Join(filepath.Dir(file), "..", "..")
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("cannot locate the repository root: no go.mod above " + dir)
		}
		dir = parent
	}
}

// BuildBinary builds a main package of this module (e.g. "./cmd/gpupass")
// into a temporary directory, once per test binary, and returns its path.
func BuildBinary(t testing.TB, pkg string) string { return BuildBinaryTags(t, pkg) }

// BuildBinaryTags is BuildBinary with build tags (-tags fakeexecutor:
// gpupass-agent with the test-only fake executor); each set of tags
// gets a directory of its own.
func BuildBinaryTags(t testing.TB, pkg string, tags ...string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	key := pkg
	if len(tags) > 0 {
		key += " -tags " + strings.Join(tags, ",")
	}
	if p, ok := built[key]; ok {
		return p
	}
	dir, err := ProcessTempDir("gpupass-bin-")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", key, err, b)
	}
	built[key] = out
	return out
}

// ProcessTempDir makes a temporary directory that belongs to this test
// process, for what it builds once and many tests use (binaries: 40-100
// MB each), so that no single test can remove it. It is named
// PREFIX<pid>-<random>; the directories of test processes that are gone
// are removed first, so a machine that runs the tests over and over keeps
// only those of the processes still running.
func ProcessTempDir(prefix string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, m := range matches {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(m), prefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || n == os.Getpid() || PIDAlive(n) {
			continue
		}
		_ = os.RemoveAll(m)
	}
	return os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
}

// PIDAlive reports whether process pid is running. A zombie counts as
// gone: it only waits for its parent to reap it, and an orphan's new
// parent may be slow to.
func PIDAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// Run runs cmd and returns its stdout, its stderr and its exit code; a
// command that could not start at all fails the test.
func Run(t testing.TB, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", cmd.Path, err)
	}
	return out.String(), errb.String(), code
}

// HTTPClient returns a client with a transport of its own, closed when the
// test ends. Tests must not share http.DefaultTransport: every
// httptest.Server.Close in the same package calls its
// CloseIdleConnections, and a parallel test whose request has just picked
// up an idle connection then fails with "http: CloseIdleConnections
// called" (CI saw it once in the forge tests).
func HTTPClient(t testing.TB) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// RefuseDials returns a clone of srv's transport that opens a connection
// per request and dials a loopback port nobody listens on whenever
// refuse(n) holds for the n-th dial (from 1): the kernel refuses those
// connections, so their requests never leave.
func RefuseDials(t testing.TB, srv *httptest.Server, refuse func(n int32) bool) *http.Transport {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	var dials atomic.Int32
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse(dials.Add(1)) {
			addr = refused
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return tr
}

// NeedRoot stops a test that needs root (starting processes as another
// user, owning files for one) as Missing does: CI runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (the test starts processes as, or gives files to, another user; CI runs as root)")
	}
}

// TempDirMode is t.TempDir made outside t.TempDir's own parent (mode
// 0700, which no other user may pass) and set to mode; it is removed
// when the test ends.
func TempDirMode(t testing.TB, mode os.FileMode) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gpupass-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, mode); err != nil {
		t.Fatal(err)
	}
	return d
}

// MountsOf lists the mounts whose source is source in any process's
// mount namespace (/proc/*/mountinfo), one "FILE: LINE" each: a tmpfs
// that is still mounted somewhere still holds its memory.
func MountsOf(source string) []string {
	var found []string
	files, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		for l := range bytes.Lines(b) {
			// ... - fstype source options
			_, after, ok := bytes.Cut(l, []byte(" - "))
			if f := bytes.Fields(after); ok && len(f) >= 2 && string(f[1]) == source {
				found = append(found, p+": "+strings.TrimSpace(string(l)))
			}
		}
	}
	return found
}

// clientEnv are the variables through which a developer's own gpupass
// setup reaches the CLI: `gpupass up` tells users to export
// GPUPASS_STATE_DIR in other shells, and saves a context in the config
// file XDG_CONFIG_HOME (else HOME/.config) locates.
var clientEnv = []string{"GPUPASS_STATE_DIR", "GPUPASS_CONTEXT", "GPUPASS_BROKER_URL", "GPUPASS_BROKER_TOKEN", "GPUPASS_BROKER_TOKEN_FILE", "GPUPASS_BROKER_CA"}

// RunIsolatedFromUser runs a CLI package's tests (call it from TestMain)
// with none of the developer's gpupass setup: the client variables unset
// and XDG_CONFIG_HOME an empty directory, so a context saved by `gpupass
// up` (or a GPUPASS_STATE_DIR exported as it says) cannot send a test's
// commands to the developer's broker. Tests that need a config set
// XDG_CONFIG_HOME themselves.
func RunIsolatedFromUser(m interface{ Run() int }) int {
	dir, err := os.MkdirTemp("", "gpupass-test-config-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, k := range clientEnv {
		os.Unsetenv(k)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	return m.Run()
}

// FreePort is a TCP port that was free on 127.0.0.1 a moment ago, for a
// test's process to listen on (another may take it in between).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
