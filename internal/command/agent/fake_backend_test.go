package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/agent/executor/fake"
	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// The one line a new executor needs besides its package (backends.go has
// the real ones): every test of this package sees the fake executor
// (once: -tags fakeexecutor registers it too).
func init() {
	if _, err := backendFor(newBackends(), fake.Name); err != nil {
		backends = append(backends, fake.Backend)
	}
}

// TestNewExecutorIsOneLine: an executor registered with one line is an
// --executor value, listed in --help and in the unknown executor's
// error; its own flags are flags of gpupass-agent, each with its
// GPUPASS_ variable, and its errors name them.
func TestNewExecutorIsOneLine(t *testing.T) {
	t.Parallel()
	var out, errw bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &out, &errw); code != 0 {
		t.Fatalf("--help: exit %d %s", code, errw.String())
	}
	for _, want := range []string{"fake (test-only: nodes that are all this machine; see --fake-*)", "--fake-dir", "--fake-nodes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not say %q:\n%s", want, out.String())
		}
	}
	// gpupass up asks the agent which executors it has.
	out.Reset()
	if code := Main(context.Background(), []string{"executors"}, &out, &errw); code != 0 || !strings.HasPrefix(out.String(), "local\nslurm\n") || !strings.HasSuffix(out.String(), "\nfake\n") {
		t.Errorf("gpupass-agent executors: exit %d, %q; want local, slurm, …, fake", code, out.String())
	}
	base := []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "x", "--region", "r", "--state-dir", t.TempDir()}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--executor", "pbs"}, nil, `--executor "pbs": unknown executor: use one of local, slurm`},
		{[]string{"--executor", "pbs"}, nil, ", fake"},
		{[]string{"--executor", "fake"}, nil, "--fake-dir: give an absolute directory"},
		{[]string{"--executor", "fake", "--fake-dir", "/tmp", "--fake-nodes", "0"}, nil, `--fake-nodes "0": must be 1 or more`},
		{nil, map[string]string{"GPUPASS_EXECUTOR": "fake", "GPUPASS_FAKE_DIR": "rel"}, `--fake-dir "rel": give an absolute directory`},
	} {
		root := NewCommand(io.Discard)
		var out, errw bytes.Buffer
		root.SetArgs(append(base, tt.args...))
		root.SetOut(&out)
		root.SetErr(&errw)
		root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd, func(k string) string { return tt.env[k] })
		}
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(allFlagNames().Apply(err).Error(), tt.want) {
			t.Errorf("%v %v: %v, want an error with %q", tt.args, tt.env, err, tt.want)
		}
	}
}

// TestFakeExecutorRunsAJob: gpupass-agent --executor fake against a real
// broker enrolls the fake cluster's nodes through the agent's generic
// cluster path (one broker node each, its report carrying the backend's
// check first) and runs a submitted job through the node's Runner in the
// node's WorkRoot, with no other edit anywhere.
func TestFakeExecutorRunsAJob(t *testing.T) {
	t.Parallel()
	// The example spec, as gpupass up's nodes run it: its numpy is
	// checked for real in the run's Python.
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import numpy").Run(); err != nil {
		testutil.Missing(t, "%s with numpy (python3-numpy)", python)
	}
	spec, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), broker.Config{Logger: slog.New(slog.DiscardHandler), HeartbeatInterval: time.Second})
	url := b.URL
	tok := func(role store.Role, regions ...string) string { return b.Token(t, role, regions...) }
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	// The agent gpupass up --executor fake starts, through the path up's
	// agents take (the fake's settings as GPUPASS_FAKE_* or these).
	args, err := localstack.AgentArgs(localstack.Options{Executor: fake.Name, Profile: "a100-80gb-4x", Python: python,
		AgentArgs: []string{"--fake-dir", shared, "--fake-nodes", "2"}}, url, "us-west-2", "agent-us-west-2-1", dir)
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	var logs testutil.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(actx, append(args, "--broker-token", tok(store.RoleAgent, "*")), io.Discard, &logs)
	}()
	t.Cleanup(func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("gpupass-agent --executor fake: exit %d\n%s", code, logs.String())
		}
	})

	c, err := client.DialRuns(url, client.Options{Token: tok(store.RoleSubmit, "us-*")})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.Dial(url, client.Options{Token: tok(store.RoleRead, "us-west-2")})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	var r *gpupassv1.Run
	for {
		resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{Region: "us-west-2",
			SpecYaml: spec, Command: []string{"sh", "-c", "echo hello"}}))
		if err != nil {
			t.Fatal(err)
		}
		if r = resp.Msg.Run; r.NodeId != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.NodeId == "" {
		t.Fatalf("run never placed: %v %s\n%s", r.State, r.Reason, logs.String())
	}
	for r.State < gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		if time.Now().After(deadline) {
			t.Fatalf("run %s still %v\n%s", r.Id, r.State, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
		g, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: r.Id}))
		if err != nil {
			t.Fatal(err)
		}
		r = g.Msg.Run
	}
	if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		t.Fatalf("run %v: %s\n%s", r.State, r.Reason, logs.String())
	}
	// The run's work dir is in the node's WorkRoot, in the region's own
	// part of the fake dir (agent.Regional): another region's agent of
	// the stack never shares it.
	runs, _ := filepath.Glob(filepath.Join(shared, "up-us-west-2", "fake-*", "runs", r.Id))
	if len(runs) != 1 {
		all, _ := filepath.Glob(filepath.Join(shared, "*", "*", r.Id))
		t.Errorf("run %s's work dir not under %s/up-us-west-2/fake-N/runs: %v", r.Id, shared, all)
	}
	// Each fake node is a broker node of its own, provider fake:test,
	// certified with the backend's check.
	list, err := nodes.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range list.Msg.Nodes {
		if n.GetProvider() == "fake:test" {
			names = append(names, n.GetHostname())
		}
	}
	if strings.Join(names, ",") != "fake-0,fake-1" && strings.Join(names, ",") != "fake-1,fake-0" {
		t.Errorf("broker nodes of provider fake:test: %v, want fake-0 and fake-1", names)
	}
	// gpupass validate --dry-run sees both as candidates for the spec.
	var cands []string
	for len(cands) != 2 && time.Now().Before(deadline) {
		dry, err := nodes.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: spec}}))
		if err != nil {
			t.Fatal(err)
		}
		if err := api.ExpandDryRun(dry.Msg); err != nil {
			t.Fatal(err)
		}
		cands = nil
		for _, c := range dry.Msg.GetCandidates() {
			cands = append(cands, c.GetNode().GetHostname())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(cands) != 2 {
		t.Errorf("dry-run candidates %v, want both fake nodes", cands)
	}
	rep, err := os.ReadFile(filepath.Join(dir, "agents", "agent-us-west-2-1", "fake", "test-fake-0", "report.json"))
	if err != nil || !strings.Contains(string(rep), `"`+fake.CheckName+`"`) {
		t.Errorf("fake-0's signed report has no %s check (%v): %.300s", fake.CheckName, err, rep)
	}
}
