package upstack

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Agent is a gpupass-agent a test starts next to the stack's own (which
// `up` supervises: one of those exiting stops the stack), so the test can
// kill -9 it and start it again, as a node that crashes and comes back.
type Agent struct {
	Name  string
	State string // --state-dir: identity, spools, work dirs
	Log   string

	args []string
	env  []string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartAgent starts the real gpupass-agent named name in region against
// the stack's broker, with up's simulated profile; extra are more agent
// flags (e.g. --price-per-hour 2.4). It is stopped when the test ends.
func (s *Stack) StartAgent(t testing.TB, name, region string, extra ...string) *Agent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.State, "tokens.json"))
	if err != nil {
		t.Fatalf("reading the stack's agent token: %v", err)
	}
	var tok struct {
		Agent string `json:"agent"`
	}
	if err := json.Unmarshal(b, &tok); err != nil || tok.Agent == "" {
		t.Fatalf("tokens.json has no agent token (%v)", err)
	}
	dir := filepath.Join(s.State, "test-agents", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	a := &Agent{Name: name, State: dir, Log: filepath.Join(s.State, "logs", name+".log"),
		// The stack's environment (Options.Env) reaches these agents
		// as it reaches up's; their flags below win over it.
		env: append(slices.Clone(s.Env), "GPUPASS_BROKER_TOKEN="+tok.Agent)}
	a.args = append([]string{
		"--broker-url", s.Config(t).BrokerURL, "--region", region, "--provider", "local", "--zone", region + "a",
		"--hostname", name, "--state-dir", dir, "--simulate", "a100-80gb-4x", "--python", Python,
		"--query-addr", "127.0.0.1:0", "--price-per-hour", "2.5", "--storage-class", "standard",
		"--bandwidth-gbps", "25", "--read-probe-mb", "8",
	}, extra...)
	bin := filepath.Join(s.Bin, "gpupass-agent")
	a.start(t, bin)
	t.Cleanup(func() {
		if a.cmd.Process != nil {
			_ = a.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-a.done:
			case <-time.After(20 * time.Second):
				_ = a.cmd.Process.Kill()
				<-a.done
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(a.Log)
			t.Logf("--- %s (tail)\n%s", filepath.Base(a.Log), Tail(string(b), 3000))
		}
	})
	return a
}

func (a *Agent) start(t testing.TB, bin string) {
	t.Helper()
	lf, err := os.OpenFile(a.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(lf, "=== started by the test at %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	a.cmd = exec.Command(bin, a.args...)
	a.cmd.Env, a.cmd.Stdout, a.cmd.Stderr = a.env, lf, lf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("starting %s: %v", a.Name, err)
	}
	a.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		lf.Close()
		close(done)
	}(a.cmd, a.done)
}

// Kill9 kills the agent with SIGKILL (its process only, as a crash
// would) and waits for it to be gone.
func (a *Agent) Kill9(t testing.TB) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s: %v", a.Name, err)
	}
	<-a.done
}

// Restart starts the agent again with the same flags and state dir (the
// same identity, its spools and ledgers).
func (a *Agent) Restart(t testing.TB) {
	t.Helper()
	select {
	case <-a.done:
	default:
		t.Fatalf("restarting %s: it is still running", a.Name)
	}
	a.start(t, a.cmd.Path)
}
