//go:build e2e

package buildinfo_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestReleaseBuildVersion builds the host platform's archives through
// scripts/release/build.sh, as the release workflow does, and checks that
// the three released binaries say the version they were built as: in
// --version, and, for the agent, in what it sends at enrollment and the
// broker stores (released agents used to enroll as "dev").
func TestReleaseBuildVersion(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the release's -all archive has the agent on Linux only")
	}
	const version = "v9.9.9-test"
	dist, bin := t.TempDir(), t.TempDir()
	cmd := exec.Command("scripts/release/build.sh")
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH, "VERSION="+version,
		"DIST="+dist, "REQUIRE_NATIVE=1", "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release/build.sh: %v\n%s", err, out)
	}
	archive := filepath.Join(dist, "gpupass-all_"+runtime.GOOS+"_"+runtime.GOARCH+".tar.gz")
	if out, err := exec.Command("tar", "-xzf", archive, "-C", bin).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf %s: %v\n%s", archive, err, out)
	}

	for _, name := range []string{"gpupass", "gpupass-broker", "gpupass-agent"} {
		out, err := exec.Command(filepath.Join(bin, name), "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", name, err)
		}
		// "gpupass-agent version v9.9.9-test (commit …, …)"
		f := strings.Fields(string(out))
		if len(f) < 3 || f[0] != name || f[1] != "version" || f[2] != version {
			t.Errorf("%s --version = %q, want %q first", name, strings.TrimSpace(string(out)), name+" version "+version)
		} else {
			t.Logf("%s", strings.TrimSpace(string(out)))
		}
	}

	// Enrollment: the released agent, on a simulated profile, against the
	// released broker on SQLite.
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "broker.db")
	db := "sqlite://" + dbPath
	tokOut, err := exec.Command(filepath.Join(bin, "gpupass-broker"), "--db", db, "-o", "json",
		"token", "create", "--role", "agent", "--regions", "*").Output()
	if err != nil {
		t.Fatalf("gpupass-broker token create: %v", err)
	}
	var tok struct{ Token string }
	if err := json.Unmarshal(tokOut, &tok); err != nil || tok.Token == "" {
		t.Fatalf("token create -o json: %v: %s", err, tokOut)
	}
	tokFile := filepath.Join(dir, "agent.token")
	if err := os.WriteFile(tokFile, []byte(tok.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	broker := start(t, filepath.Join(dir, "broker.log"), nil, filepath.Join(bin, "gpupass-broker"), "--db", db, "serve", "--listen", addr)
	waitFor(t, "the broker's /healthz", broker, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	state := filepath.Join(dir, "agent")
	ag := start(t, filepath.Join(dir, "agent.log"), []string{"GPUPASS_TOKEN_FILE=" + tokFile}, filepath.Join(bin, "gpupass-agent"),
		"--broker-url", "http://"+addr, "--state-dir", state, "--region", "us-west-2", "--provider", "sim",
		"--price-per-hour", "10", "--simulate", "h100-sxm5-8x", "--query-addr", "127.0.0.1:0",
		"--read-probe-mb", "1", "--suite-interval", "1m")
	var persisted struct {
		AgentID string `json:"agent_id"`
	}
	waitFor(t, "the agent to enroll", ag, func() bool {
		b, err := os.ReadFile(filepath.Join(state, agent.StateFile))
		return err == nil && json.Unmarshal(b, &persisted) == nil && persisted.AgentID != ""
	})
	ag.stop(t)
	broker.stop(t)

	st, err := sqlite.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := st.Agent(context.Background(), persisted.AgentID)
	if err != nil {
		t.Fatalf("agent %s in the broker's store: %v", persisted.AgentID, err)
	}
	if a.AgentVersion != version {
		t.Errorf("the broker stored AgentVersion %q for the released agent, want %q", a.AgentVersion, version)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs bin with its stderr in the file log.
func start(t *testing.T, log string, env []string, bin string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &proc{cmd: exec.Command(bin, args...), log: log, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	return p
}

func (p *proc) stderr() string { b, _ := os.ReadFile(p.log); return string(b) }

func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30 s of SIGTERM\n%s", filepath.Base(p.cmd.Path), p.stderr())
	}
}

// waitFor polls ok until it holds, the process exits, or 90 s pass.
func waitFor(t *testing.T, what string, p *proc, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !ok() {
		select {
		case <-p.done:
			t.Fatalf("waiting for %s: %s exited\n%s", what, filepath.Base(p.cmd.Path), p.stderr())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s\n%s", what, p.stderr())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
