//go:build e2e

package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestRunTmpReachesNoLaterRun is issue #31's finding 5 as a user meets
// it: a real broker (`gpupass up`), a real agent started as root with
// --run-as UID:GID (one uid for every run, a cgroup per run), and `gpupass
// train`. Run 1 leaves files in /tmp, /var/tmp and /dev/shm (64 MiB held
// there, and a process that escaped its group keeps the file open); run
// 2, as the same user, must find none of them, and the node's dirs must
// hold nothing of run 1 once it ended, its /dev/shm tmpfs (and the memory)
// included. With the default (a mount namespace per run) and with
// --run-private-tmp off (what the run added is removed at its end); the
// agent says at start which one runs get.
func TestRunTmpReachesNoLaterRun(t *testing.T) {
	testutil.NeedRoot(t)
	upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	for _, tc := range []struct {
		node, mode, wantLog string
		// runAs is the --run-as user of the node's runs: a uid of the
		// test's, as another agent's sweep of a shared user (nobody)
		// on this machine would take run 1's files too.
		runAs string
	}{
		{"tmp-ns", "auto", "each run gets a /tmp, /var/tmp and /dev/shm of its own", "230992:230992"},
		{"tmp-sweep", "off", "runs share the node's /tmp, /var/tmp and /dev/shm; what a run's uid adds there is removed at its end", "230993:230993"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			// The runs' user must reach its work dirs below the stack's state dir.
			for _, d := range []string{filepath.Dir(stack.State), stack.State, filepath.Join(stack.State, "test-agents"), filepath.Join(stack.State, "test-agents", tc.node)} {
				if err := os.MkdirAll(d, 0o711); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(d, 0o711); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"--run-as", tc.runAs}
			if tc.mode != "auto" { // the default, as a user has it
				args = append(args, "--run-private-tmp", tc.mode)
			}
			agent := stack.StartAgent(t, tc.node, tc.node, args...)
			agentLog := func() string { b, _ := os.ReadFile(agent.Log); return string(b) }
			upstack.WaitFor(t, ctx, "the agent's first report", func() bool { return strings.Contains(agentLog(), "report uploaded") })
			if log := agentLog(); !strings.Contains(log, tc.wantLog) {
				t.Errorf("the agent's log does not say %q:\n%s", tc.wantLog, upstack.Tail(log, 3000))
			}
			checkRunTmp(t, ctx, stack, agent, agentLog, tc.runAs)
			if tc.mode == "auto" {
				// Training that hands batches over in /dev/shm still
				// works there (default --run-shm-size).
				code, err := os.ReadFile(filepath.Join(stack.Root, "agent", "executor", "testdata", "torch_shm.py"))
				if err != nil {
					t.Fatal(err)
				}
				out, err := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", agent.Name, "--name", "torch-shm",
					"--follow", "--", upstack.Python, "-c", string(code)).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "dataloader-sum=499500 shared=1000/1000") {
					t.Errorf("PyTorch DataLoader (num_workers=2) and shared tensors in a run's own /dev/shm: %v\n%s", err, out)
				}
			}
		})
	}
}

// checkRunTmp runs run 1 and run 2 on agent and checks that nothing of
// run 1's /tmp, /var/tmp and /dev/shm files reaches run 2 or stays.
func checkRunTmp(t *testing.T, ctx context.Context, stack *upstack.Stack, agent *upstack.Agent, agentLog func() string, runAs string) {
	name := fmt.Sprintf("gpupass-e2e-leak-%d-%s", os.Getpid(), agent.Name)
	leftovers := []string{"/tmp/" + name, "/var/tmp/" + name, "/dev/shm/" + name}
	t.Cleanup(func() {
		for _, p := range leftovers {
			os.Remove(p)
		}
	})
	train := func(run, job string) string {
		t.Helper()
		out, err := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", agent.Name, "--name", run,
			"--follow", "--", "sh", "-c", job).CombinedOutput()
		if err != nil {
			t.Fatalf("train %s: %v\n%s\n--- agent log\n%s", run, err, out, upstack.Tail(agentLog(), 3000))
		}
		return string(out)
	}
	out := train("tmp-one-"+agent.Name, `set -e
id -u
echo secret > /tmp/`+name+`
echo secret > /var/tmp/`+name+`
dd if=/dev/zero of=/dev/shm/`+name+` bs=1M count=64 2>/dev/null
setsid sh -c 'exec 3</dev/shm/`+name+`; exec sleep 300' </dev/null >/dev/null 2>&1 &
echo "wrote $(cat /tmp/`+name+`) $(stat -c %s /dev/shm/`+name+`)"
`)
	if uid, _, _ := strings.Cut(runAs, ":"); !strings.Contains(out, " stdout "+uid+"\n") || !strings.Contains(out, "wrote secret 67108864") {
		t.Fatalf("run 1 did not run as %s or could not write its files:\n%s", runAs, out)
	}
	for _, p := range leftovers {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is on the node after run 1 ended (%v)", p, err)
		}
	}
	runs, _ := filepath.Glob(filepath.Join(agent.State, "runs", "alloc-*"))
	if len(runs) != 1 {
		t.Fatalf("work dirs %q, want run 1's", runs)
	}
	if m := testutil.MountsOf("gpupass-" + filepath.Base(runs[0])); len(m) > 0 {
		t.Errorf("run 1's /dev/shm tmpfs is still mounted after the run (its memory held): %q", m)
	}

	out = train("tmp-two-"+agent.Name, `for f in `+strings.Join(leftovers, " ")+`; do
  if [ -e "$f" ]; then echo "found $f: $(head -c 6 "$f")"; else echo "no $f"; fi
done
`)
	for _, p := range leftovers {
		if !strings.Contains(out, "no "+p) {
			t.Errorf("run 2 (same user) reached run 1's %s:\n%s", p, out)
		}
	}
}
