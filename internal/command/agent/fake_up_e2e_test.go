//go:build e2e

package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestE2EFakeExecutorFromUp: an executor's flags reach gpupass up with no
// edit to up. gpupass up, given the executors' flags as gpupass-docs
// writes them from this package's backends (the fake one included, as
// this package's tests register it), lists --fake-* in its help under
// the fake executor, hands them to the agents it starts (gpupass-agent
// -tags fakeexecutor, which has the fake executor), and shows the error
// the fake backend gives for a bad one; with good ones the agent stands
// for two fake nodes.
func TestE2EFakeExecutorFromUp(t *testing.T) {
	es, err := ExecutorFlags(Backends())
	if err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	if code := gpupass.Main(context.Background(), []string{"up", "--help"}, nil, &out, &errw, gpupass.WithExecutors(es)); code != 0 {
		t.Fatalf("up --help: exit %d %s", code, errw.String())
	}
	help := out.String()
	i := strings.Index(help, "Flags of --executor fake")
	if i < 0 || !strings.Contains(help[i:], "--fake-nodes int") || !strings.Contains(help[i:], "--fake-dir string") || !strings.Contains(help, "fake (test-only: nodes that are all this machine; see --fake-*)") {
		t.Fatalf("up --help has no group of the fake executor's flags:\n%s", help)
	}

	broker := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	agent := testutil.BuildBinaryTags(t, "./cmd/gpupass-agent", "fakeexecutor")
	t.Setenv("PATH", filepath.Dir(broker)+string(os.PathListSeparator)+filepath.Dir(agent)+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	shared := t.TempDir()
	up := func(ctx context.Context, stdout *testutil.Buffer, state string, args ...string) (int, string) {
		var errw testutil.Buffer
		args = append([]string{"up", "--state-dir", state, "--listen", "127.0.0.1:0", "--region", "us-west-2", "--executor", "fake", "--python", "/usr/bin/python3"}, args...)
		code := gpupass.Main(ctx, args, nil, stdout, &errw, gpupass.WithExecutors(es))
		return code, errw.String()
	}

	// The agent's fake backend refuses the flag, and up says why.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, stderr := up(ctx, &testutil.Buffer{}, t.TempDir(), "--fake-dir", shared, "--fake-nodes", "0")
	if want := `gpupass-agent: --fake-nodes "0": must be 1 or more`; code == 0 || !strings.Contains(stderr, want) {
		t.Fatalf("up --fake-nodes 0: exit %d, stderr %q; want the agent's error %q", code, stderr, want)
	}

	// With good flags the stack's agent stands for two fake nodes.
	var stdout testutil.Buffer
	state := t.TempDir()
	done := make(chan string, 1)
	go func() {
		_, stderr := up(ctx, &stdout, state, "--fake-dir", shared, "--fake-nodes", "2")
		done <- stderr
	}()
	defer func() {
		cancel()
		<-done
	}()
	for !strings.Contains(stdout.String(), "ready: ") {
		select {
		case stderr := <-done:
			t.Fatalf("up ended before it was ready: %s\n%s", stdout.String(), stderr)
		case <-time.After(100 * time.Millisecond):
		}
	}
	cfg, err := localstack.ReadConfig(state)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.Dial(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	var fakes int
	for deadline := time.Now().Add(60 * time.Second); fakes != 2 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		list, err := nodes.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		fakes = 0
		for _, n := range list.Msg.Nodes {
			if n.GetProvider() == "fake:test" {
				fakes++
			}
		}
	}
	if fakes != 2 {
		t.Errorf("broker nodes of provider fake:test: %d, want 2 (up's --fake-nodes 2)", fakes)
	}
}
