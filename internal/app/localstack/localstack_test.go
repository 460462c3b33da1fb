package localstack

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

func TestListenAddr(t *testing.T) {
	t.Parallel()
	if got, err := listenAddr("127.0.0.1:7070"); err != nil || got != "127.0.0.1:7070" {
		t.Errorf("fixed port: %q, %v", got, err)
	}
	got, err := listenAddr("127.0.0.1:0")
	if err != nil || got == "127.0.0.1:0" {
		t.Errorf("port 0 was not resolved to a free port: %q, %v", got, err)
	}
	if _, err := listenAddr("7070"); err == nil {
		t.Error("an address without a host was accepted")
	}
}

func TestUpTokensReplacesAtomically(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A stand-in for `gpupass-broker token create --output json`.
	broker := filepath.Join(dir, "gpupass-broker")
	if err := os.WriteFile(broker, []byte("#!/bin/sh\necho '{\"token\":\"gpp_new\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// An older, incomplete tokens.json with a loose mode: upTokens makes
	// new tokens and must leave the file 0600.
	path := filepath.Join(dir, "tokens.json")
	old := `{"agent":"gpp_old"}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	before := filepath.Join(dir, "before")
	if err := os.Link(path, before); err != nil {
		t.Fatal(err)
	}
	tok, err := upTokens(context.Background(), broker, filepath.Join(dir, "broker.db"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Agent != "gpp_new" || tok.Submit != "gpp_new" {
		t.Fatalf("tokens %+v", tok)
	}
	testutil.WantFile(t, before, old, 0o644)
	testutil.WantFile(t, path, `{"agent":"gpp_new","submit":"gpp_new","read":"gpp_new"}`, 0o600)
	testutil.WantFile(t, filepath.Join(dir, ReadTokenFile), "gpp_new", 0o600)
}

// TestUpTokensAddsAReadTokenToAnOlderStateDir: a state dir from before
// the read token keeps its agent and submit tokens (its config and agents
// stay valid) and gets a read token for the metrics line.
func TestUpTokensAddsAReadTokenToAnOlderStateDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	broker := filepath.Join(dir, "gpupass-broker")
	if err := os.WriteFile(broker, []byte("#!/bin/sh\necho '{\"token\":\"gpp_read\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broker.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.json"), []byte(`{"agent":"gpp_a","submit":"gpp_s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := upTokens(context.Background(), broker, filepath.Join(dir, "broker.db"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Agent != "gpp_a" || tok.Submit != "gpp_s" || tok.Read != "gpp_read" {
		t.Fatalf("tokens %+v, want the old agent and submit tokens and a new read token", tok)
	}
	testutil.WantFile(t, filepath.Join(dir, ReadTokenFile), "gpp_read", 0o600)
}

// TestAgentArgs checks the executor choice reaches every agent's command
// line, and stays off it when empty (the agent's default, local).
func TestAgentArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		o    Options
		want []string // the tail of the command line
	}{
		{"local by default", Options{Profile: "p", Python: "py"}, []string{"--query-addr", "127.0.0.1:0"}},
		{"an executor and its settings", Options{Executor: "local", AgentArgs: []string{"--other-flag", "x"}}, []string{"--query-addr", "127.0.0.1:0", "--other-flag", "x"}},
		// Every executor's settings go on as they are, after the stack's
		// dir, where the agent places the region's work (agent.Regional).
		{"an executor's settings", Options{Executor: "slurm", ExecutorArgs: []string{"--slurm-shared-dir", "/s", "--slurm-partition", "gpu"}},
			[]string{"--executor", "slurm", "--stack-dir", "/state", "--provider", "local", "--zone", "us-west-2a", "--hostname", "agent-us-west-2-1", "--query-addr", "127.0.0.1:0", "--slurm-shared-dir", "/s", "--slurm-partition", "gpu"}},
		{"another executor", Options{Executor: "fake", Profile: "p", AgentArgs: []string{"--fake-dir", "/d"}},
			[]string{"--executor", "fake", "--stack-dir", "/state", "--simulate", "p", "--provider", "local", "--zone", "us-west-2a", "--hostname", "agent-us-west-2-1", "--query-addr", "127.0.0.1:0", "--fake-dir", "/d"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := AgentArgs(tc.o, "http://127.0.0.1:1", "us-west-2", "agent-us-west-2-1", "/state")
			if err != nil {
				t.Fatal(err)
			}
			tail := got[len(got)-len(tc.want):]
			for i := range tc.want {
				if tail[i] != tc.want[i] {
					t.Fatalf("command line ends %q, want %q", tail, tc.want)
				}
			}
		})
	}
}

// TestLocalURL: the stack's own processes reach a broker on a wildcard
// address over loopback, so their tokens stay on this host and the plain
// HTTP rule (internal/client) lets them through without consent.
func TestLocalURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1:7070":  "http://127.0.0.1:7070",
		"0.0.0.0:7070":    "http://127.0.0.1:7070",
		"[::]:7070":       "http://[::1]:7070",
		":7070":           "http://127.0.0.1:7070",
		"10.0.0.5:7070":   "http://10.0.0.5:7070",
		"localhost:7070":  "http://localhost:7070",
		"[2001:db8::1]:1": "http://[2001:db8::1]:1",
	} {
		if got := localURL(addr); got != want {
			t.Errorf("localURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestCheckExecutor: up takes an executor the agent lists (gpupass-agent
// executors), so one added to the agent needs no edit here, and refuses
// another before anything starts, naming what the agent has.
func TestCheckExecutor(t *testing.T) {
	t.Parallel()
	// A stand-in for the gpupass-agent next to gpupass, which has a
	// fourth executor (internal/command/agent's tests show the real
	// agent lists one registered with a line).
	agent := filepath.Join(t.TempDir(), "gpupass-agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\n[ \"$1\" = executors ] && printf 'local\\nslurm\\nkubernetes\\nfake\\n'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"", "local", "slurm", "fake"} {
		if err := checkExecutor(ctx, agent, name); err != nil {
			t.Errorf("executor %q: %v", name, err)
		}
	}
	err := checkExecutor(ctx, agent, "pbs")
	if err == nil || !strings.Contains(err.Error(), `"pbs": `+agent+" has no such executor: use one of local, slurm, kubernetes, fake") {
		t.Errorf("executor pbs: %v, want refused with the agent's executors", err)
	}
	// An agent that cannot say (older than `executors`) is named.
	if err := checkExecutor(ctx, "/bin/false", "fake"); err == nil || !strings.Contains(err.Error(), "/bin/false executors") {
		t.Errorf("an agent without executors: %v", err)
	}
}

// TestJobArgs (issue #34): each local agent of a stack advertises a job
// port range of its own, so the rank 0s of two gangs on one machine are
// never given the same rendezvous port; an executor that takes no gang
// rank advertises none.
func TestJobArgs(t *testing.T) {
	t.Parallel()
	if got, want := JobArgs(Options{}, 0), []string{"--job-address", "127.0.0.1", "--job-ports", "29500-29599"}; !slices.Equal(got, want) {
		t.Errorf("agent 0: %q, want %q", got, want)
	}
	if got, want := JobArgs(Options{Executor: "local"}, 1), []string{"--job-address", "127.0.0.1", "--job-ports", "29600-29699"}; !slices.Equal(got, want) {
		t.Errorf("agent 1: %q, want %q", got, want)
	}
	if got, want := JobArgs(Options{Executor: "slurm"}, 0), []string{"--job-ports", "29500-29599"}; !slices.Equal(got, want) {
		t.Errorf("slurm agent: %q, want %q (each node's address is its NodeAddr)", got, want)
	}
	if got := JobArgs(Options{Executor: "fake"}, 0); got != nil {
		t.Errorf("fake agent: %q, want no job flags (it takes no gang rank)", got)
	}
	// Pods have IPs of their own: the ports alone, the same for each.
	if got, want := JobArgs(Options{Executor: "kubernetes"}, 3), []string{"--job-ports", "29500-29599"}; !slices.Equal(got, want) {
		t.Errorf("kubernetes agent 3: %q, want %q", got, want)
	}
	if got := JobArgs(Options{}, 400); got != nil {
		t.Errorf("agent 400: %q, want none (past port 65535)", got)
	}
}
