// Package upstack starts the local stack (`gpupass up`) for end-to-end
// tests, the way a user does: the three binaries built into one
// directory, `up` on a loopback port with its own state dir, and teardown
// with Ctrl-C. Tests of compare, audit, CI and runs share it so there is
// one way to stand the stack up and one place that dumps its logs when a
// test fails.
package upstack

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/testutil"
)

// Python is the interpreter that has Debian's python3-torch.
const Python = "/usr/bin/python3"

// RequireTorch calls testutil.Missing unless Python imports torch and numpy.
func RequireTorch(t testing.TB) string {
	t.Helper()
	if err := exec.Command(Python, "-c", "import torch, numpy").Run(); err != nil {
		testutil.Missing(t, "%s with torch and numpy (python3-torch, python3-numpy)", Python)
	}
	return Python
}

var (
	buildOnce sync.Mutex
	binDir    string
)

// BuildAll builds gpupass, gpupass-broker and gpupass-agent into one
// directory, once per test binary, as `make build` does, so `gpupass up`
// finds the others next to itself. It returns the directory.
func BuildAll(t testing.TB) string {
	t.Helper()
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if binDir != "" {
		return binDir
	}
	dir, err := testutil.ProcessTempDir("gpupass-up-bin-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/gpupass", "./cmd/gpupass-broker", "./cmd/gpupass-agent")
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	binDir = dir
	return dir
}

// Config is config.json as `gpupass up` writes it (the fields tests use).
type Config struct {
	BrokerURL string   `json:"broker_url"`
	Token     string   `json:"token"`
	Regions   []string `json:"regions"`
	StateDir  string   `json:"state_dir"`
	BrokerPID int      `json:"broker_pid,omitempty"`
	AgentPIDs []int    `json:"agent_pids,omitempty"`
}

// Options changes how the stack starts.
type Options struct {
	// Regions for the agents; none: up's default, as a user who runs
	// `gpupass up` gets (localstack.DefaultRegions).
	Regions []string
	// Args are extra `gpupass up` flags.
	Args []string
	// Env is added to the environment of up and of Command.
	Env []string
	// Environ, when set, replaces this process's environment as the base
	// of up's and Command's (a clean HOME, nothing of the machine's).
	Environ []string
	// Dir is where up and Command run (default: the repository root).
	Dir string
	// DefaultStateDir starts up without --state-dir or GPUPASS_STATE_DIR,
	// so it keeps its state where a user's would (Dir/.gpupass with a
	// clean environment); State names that dir.
	DefaultStateDir bool
}

// Stack is a running `gpupass up`.
type Stack struct {
	Bin   string // directory of the three binaries
	State string // --state-dir
	Root  string // working directory of up and of commands: the repository root, or Options.Dir
	Env   []string
	Out   *Buffer // up's stdout and stderr

	cmd  *exec.Cmd
	done chan error
	once sync.Once
	err  error
}

// Start runs `gpupass up` and returns once it printed its stack. The
// stack is stopped with Ctrl-C when the test ends; if the test failed, the
// tails of the broker and agent logs are logged.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	s := &Stack{Bin: BuildAll(t), Root: opts.Dir, Out: &Buffer{}}
	if s.Root == "" {
		s.Root = testutil.RepoRoot(t)
	}
	base := opts.Environ
	if base == nil {
		base = os.Environ()
	}
	// up saves its stack as a context in the config file: a test's goes
	// to a config of its own, never the user's nor one the test process
	// shares with other tests (testutil.RunIsolatedFromUser sets one for
	// the whole package), unless the test names one.
	named := func(env []string) bool {
		return slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "XDG_CONFIG_HOME=") })
	}
	if !named(opts.Env) && (opts.Environ == nil || !named(opts.Environ)) {
		base = append(slices.Clone(base), "XDG_CONFIG_HOME="+t.TempDir())
	}
	args := []string{"up", "--listen", "127.0.0.1:0"}
	if opts.DefaultStateDir {
		// Where up finds its state dir without one named: the
		// project's, which may be above Root.
		s.Env = append(slices.Clone(base), opts.Env...)
		s.State = localstack.StateDirFrom(func(k string) string { return envValue(s.Env, k) }, s.Root)
		if !filepath.IsAbs(s.State) {
			s.State = filepath.Join(s.Root, s.State)
		}
	} else {
		s.State = t.TempDir()
		s.Env = append(append(slices.Clone(base), "GPUPASS_STATE_DIR="+s.State), opts.Env...)
		args = append(args, "--state-dir", s.State)
	}
	for _, r := range opts.Regions {
		args = append(args, "--region", r)
	}
	args = append(args, opts.Args...)
	s.cmd = exec.Command(filepath.Join(s.Bin, "gpupass"), args...)
	s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr, s.cmd.Dir = s.Env, s.Out, s.Out, s.Root
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = s.Stop()
		if t.Failed() {
			t.Logf("--- gpupass up output (tail)\n%s", Tail(s.Out.String(), 3000))
			logs, _ := filepath.Glob(filepath.Join(s.State, "logs", "*.log"))
			for _, f := range logs {
				b, _ := os.ReadFile(f)
				t.Logf("--- %s (tail)\n%s", filepath.Base(f), Tail(string(b), 3000))
			}
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(s.Out.String(), "Ctrl-C stops everything") {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("gpupass up exited early: %v\n%s", err, s.Out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpupass up did not come up within 3m:\n%s", s.Out.String())
		}
	}
	return s
}

// PID is the process id of `gpupass up`.
func (s *Stack) PID() int { return s.cmd.Process.Pid }

// Config reads the config.json `up` wrote (it changes when up restarts
// the broker).
func (s *Stack) Config(t testing.TB) Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.State, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Command returns `gpupass ARGS...` run from the stack's Root (the
// repository root, or Options.Dir) with the stack's environment, so it
// finds the broker without flags.
func (s *Stack) Command(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, filepath.Join(s.Bin, "gpupass"), args...)
	c.Env, c.Dir = s.Env, s.Root
	return c
}

// Stop sends Ctrl-C and waits up to a minute; it returns up's exit error.
// Calling it again returns the same result.
func (s *Stack) Stop() error {
	s.once.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case s.err = <-s.done:
		case <-time.After(60 * time.Second):
			_ = s.cmd.Process.Kill()
			s.err = <-s.done
			if s.err == nil {
				s.err = context.DeadlineExceeded
			}
		}
	})
	return s.err
}

// WaitFor polls cond every 100 ms until it holds or ctx ends (a test failure
// naming what was awaited).
func WaitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Tail returns the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Buffer is testutil.Buffer (tests name it through this package too).
type Buffer = testutil.Buffer

// envValue is the last value of key in env (as exec uses it), or "".
func envValue(env []string, key string) string {
	v := ""
	for _, e := range env {
		if k, val, ok := strings.Cut(e, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// CheckAudit signs an audit of run with a fresh cosign key pair, as a user
// would (`gpupass audit keygen`, `gpupass audit RUN --key`), verifies it
// with `gpupass audit verify`, and fails t unless verify passes and names
// every layer in want (e.g. "rank-1" for a gang's second node). It
// returns verify's output.
func (s *Stack) CheckAudit(t testing.TB, ctx context.Context, run string, want ...string) string {
	t.Helper()
	dir := t.TempDir()
	gp := func(args ...string) string {
		t.Helper()
		cmd := s.Command(ctx, args...)
		cmd.Env = append(slices.Clone(cmd.Env), "COSIGN_PASSWORD=upstack-audit")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gpupass %s: %v\n%s", strings.Join(args, " "), err, Tail(string(b), 3000))
		}
		return string(b)
	}
	gp("audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign"))
	zip := filepath.Join(dir, "audit.zip")
	gp("audit", run, "--key", filepath.Join(dir, "cosign.key"), "--out", zip)
	out := gp("audit", "verify", zip, "--key", filepath.Join(dir, "cosign.pub"))
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("audit verify of %s names no %q:\n%s", run, w, out)
		}
	}
	return out
}
