//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent/executor/fake"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/client"
	agentcmd "github.com/gpupass/gpupass/internal/command/agent"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestUpTrainAcrossRegionsSurvivesBrokerKill is the user's path: `gpupass
// up`, `train` in two regions with the real PyTorch example (which makes
// its loss NaN once, so the agent restarts it from a checkpoint), `logs
// --follow`, kill -9 of the broker mid-run (up starts it again), metrics
// through the API, `cancel`, and Ctrl-C. The stored records of each run
// must be exactly seq 1..N: nothing lost, nothing twice.
func TestUpTrainAcrossRegionsSurvivesBrokerKill(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2", "eu-central-1"}})
	out := stack.Out.String()
	for _, want := range []string{"us-west-2", "eu-central-1", `"simulated": true`, "token   gpp_"} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q:\n%s", want, out)
		}
	}
	readCfg := func() upstack.Config { return stack.Config(t) }
	cfg := readCfg()
	st, err := os.Stat(filepath.Join(stack.State, "config.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("config.json mode %v (%v), want 0600: it holds a token", st.Mode().Perm(), err)
	}
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }

	// train: no broker flags, `up`'s config is enough.
	var trainOut upstack.Buffer
	train := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--region", "eu-central-1",
		"--workdir", "examples/train", "--name", "e2e", "--follow", "--",
		py, "train.py", "--steps", "60", "--sleep", "0.15", "--checkpoint-every", "10", "--nan-at-step", "25")
	train.Stdout, train.Stderr = &trainOut, &trainOut
	if err := train.Start(); err != nil {
		t.Fatal(err)
	}
	trainDone := make(chan error, 1)
	go func() { trainDone <- train.Wait() }()

	var runs []*gpupassv1.Run
	upstack.WaitFor(t, ctx, "two runs in the broker", func() bool {
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			return false
		}
		runs = resp.Msg.Runs
		return len(runs) == 2
	})
	// logs --follow of one run, started while it runs.
	var followOut upstack.Buffer
	follow := gp("logs", "--follow", runs[0].Id)
	follow.Stdout, follow.Stderr = &followOut, &followOut
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followDone := make(chan error, 1)
	go func() { followDone <- follow.Wait() }()

	// kill -9 the broker once both runs are training and records flow.
	upstack.WaitFor(t, ctx, "both runs to hold records while running", func() bool {
		for _, r := range runs {
			resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: r.Id}))
			if err != nil || resp.Msg.Run.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING || resp.Msg.Run.HeldThrough < 12 {
				return false
			}
		}
		return true
	})
	if err := syscall.Kill(cfg.BrokerPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 broker %d: %v", cfg.BrokerPID, err)
	}
	upstack.WaitFor(t, ctx, "up to start the broker again", func() bool { return readCfg().BrokerPID != cfg.BrokerPID })

	select {
	case err := <-trainDone:
		if err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(trainOut.String(), 4000))
		}
	case <-ctx.Done():
		t.Fatalf("train did not finish:\n%s", upstack.Tail(trainOut.String(), 4000))
	}
	for _, want := range []string{"us-west-2", "eu-central-1", "non-finite loss", "succeeded"} {
		if !strings.Contains(trainOut.String(), want) {
			t.Errorf("train --follow output lacks %q", want)
		}
	}
	if err := <-followDone; err != nil {
		t.Errorf("logs --follow: %v\n%s", err, upstack.Tail(followOut.String(), 2000))
	}
	if !strings.Contains(followOut.String(), "trainer done") {
		t.Errorf("logs --follow did not stream to the end:\n%s", upstack.Tail(followOut.String(), 2000))
	}

	for _, r := range runs {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: r.Id}))
		if err != nil {
			t.Fatal(err)
		}
		run := resp.Msg.Run
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Errorf("%s (%s): state %s restarts %d reason %q, want succeeded after 1 NaN restart", run.Id, run.Region, run.State, run.Restarts, run.Reason)
		}
		// Every record exactly once: seq 1..held_through, no gap, no repeat.
		ls, err := rc.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: r.Id, IncludeMetrics: true}))
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		nanEvent := false
		for ls.Receive() {
			for _, rec := range ls.Msg().Records {
				seqs = append(seqs, rec.Seq)
				if rec.Kind == gpupassv1.RecordKind_RECORD_KIND_EVENT {
					var ev events.Event
					if err := json.Unmarshal(rec.Data, &ev); err != nil {
						t.Fatalf("%s seq %d: %v", r.Id, rec.Seq, err)
					}
					if ev.Level == events.Error && strings.Contains(ev.Message, "non-finite loss") && strings.Contains(ev.Message, "step 25") {
						nanEvent = true
					}
				}
			}
		}
		if err := ls.Err(); err != nil {
			t.Fatal(err)
		}
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("%s: record %d has seq %d: lost or duplicated records across the broker kill", r.Id, i+1, s)
			}
		}
		if uint64(len(seqs)) != run.HeldThrough || len(seqs) < 60 {
			t.Errorf("%s: %d records, held_through %d", r.Id, len(seqs), run.HeldThrough)
		}
		if !nanEvent {
			t.Errorf("%s: no ERROR event naming the NaN at step 25", r.Id)
		}
		// Metrics through the API: one continuous series, steps 1..60.
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: r.Id}))
		if err != nil {
			t.Fatal(err)
		}
		steps := map[int64]int{}
		for _, p := range mr.Msg.Points {
			steps[p.Step]++
		}
		for s := int64(1); s <= 60; s++ {
			if steps[s] != 1 {
				t.Errorf("%s: step %d appears %d times in the metric series, want once", r.Id, s, steps[s])
				break
			}
		}
	}

	// cancel a long run.
	long := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/train",
		"--name", "e2e-cancel", "--", py, "train.py", "--steps", "100000", "--sleep", "0.2")
	if b, err := long.CombinedOutput(); err != nil {
		t.Fatalf("train (no follow): %v\n%s", err, b)
	}
	var longRun *gpupassv1.Run
	upstack.WaitFor(t, ctx, "the long run to start", func() bool {
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			return false
		}
		for _, r := range resp.Msg.Runs {
			if strings.Contains(r.Name, "e2e-cancel") && r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && r.HeldThrough > 5 {
				longRun = r
				return true
			}
		}
		return false
	})
	if b, err := gp("cancel", longRun.Id).CombinedOutput(); err != nil {
		t.Fatalf("cancel: %v\n%s", err, b)
	}
	upstack.WaitFor(t, ctx, "the cancelled run to end", func() bool {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: longRun.Id}))
		if err != nil {
			return false
		}
		longRun = resp.Msg.Run
		return longRun.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
	})
	if longRun.Reason == "" {
		t.Error("cancelled run has no reason")
	}

	// Ctrl-C: up stops every child and exits 0.
	broker := readCfg().BrokerPID
	if err := stack.Stop(); err != nil {
		t.Errorf("up after Ctrl-C: %v\n%s", err, upstack.Tail(stack.Out.String(), 2000))
	}
	if err := syscall.Kill(broker, 0); err == nil {
		t.Errorf("broker pid %d still alive after up stopped", broker)
	}
}

// TestUpDemo is `make demo`: the whole pipeline on the example, exit 0,
// and every result where the demo says it is.
func TestUpDemo(t *testing.T) {
	upstack.RequireTorch(t)
	bin := upstack.BuildAll(t)
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "gpupass"), "up", "--demo", "--listen", "127.0.0.1:0", "--state-dir", state, "--demo-steps", "20")
	cmd.Dir = testutil.RepoRoot(t)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("up --demo: %v\n%s", err, upstack.Tail(out, 6000))
	}
	for _, want := range []string{"== 1/4 validate", "2 candidate(s)", "== 2/4 train", "trainer done", "== 3/4 compare", "consistent", "== 4/4 audit", "ok   signature", "ok   agent-signature", "ok   fingerprint", `"simulated": true`, "results:"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, upstack.Tail(out, 6000))
		}
	}
	// One log-line form for every command that follows runs of several
	// regions (runlog.PrefixRegion), not a padded one of its own.
	if padded := regexp.MustCompile(`(?m)^us-west-2 +\[`).FindString(out); padded != "" {
		t.Errorf("demo log line in a second form %q, want %q:\n%s", padded, "us-west-2 | [", upstack.Tail(out, 6000))
	}
	// The NaN the demo promises is injected and recovered from a
	// checkpoint in both regions (train.py --nan-at-step).
	for _, r := range []string{"us-west-2", "eu-central-1"} {
		if !regexp.MustCompile(`(?m)^`+r+` \| .*non-finite loss nan at step`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^`+r+` \| .*checkpoint:? resumed from .* at step`).MatchString(out) {
			t.Errorf("demo log of %s lacks the injected NaN and the resume from a checkpoint:\n%s", r, upstack.Tail(out, 6000))
		}
	}
	md, err := os.ReadFile(filepath.Join(state, "demo", "compare.md"))
	if err != nil || !strings.Contains(string(md), "us-west-2") {
		t.Errorf("compare report: %v\n%s", err, md)
	}
	if zips, _ := filepath.Glob(filepath.Join(state, "demo", "audit-alloc-*.zip")); len(zips) != 1 {
		t.Errorf("audit zips %v, want one", zips)
	}
	// The stack is gone once the demo has ended: a result it points to
	// is a file, not a command that asks the stopped broker ("gpupass
	// logs ALLOC" did, and failed when pasted), and every command it
	// prints runs as printed.
	results := out[strings.LastIndex(out, "results:"):]
	for _, m := range regexp.MustCompile(`(?m)^  run +(alloc-\S+) +\S+ +log (\S+)$`).FindAllStringSubmatch(results, -1) {
		if b, err := os.ReadFile(m[2]); err != nil || !strings.Contains(string(b), "trainer done") {
			t.Errorf("the log of %s the demo points to, %s: %v\n%s", m[1], m[2], err, upstack.Tail(string(b), 2000))
		}
	}
	if n := strings.Count(results, "  run "); n != 2 || strings.Contains(results, "gpupass logs") {
		t.Errorf("results name %d runs, or a command that needs the stopped broker:\n%s", n, results)
	}
	for _, m := range regexp.MustCompile(`verify: (gpupass audit verify [^)]*)\)`).FindAllStringSubmatch(results, -1) {
		pasted := exec.CommandContext(ctx, "bash", "-c", m[1])
		pasted.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		if b, err := pasted.CombinedOutput(); err != nil {
			t.Errorf("%s, as printed: %v\n%s", m[1], err, b)
		}
	}
	files, _ := filepath.Glob(filepath.Join(state, "demo", "alloc-*-metrics.jsonl"))
	if len(files) != 2 {
		t.Fatalf("metrics files %v, want two", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n != 20 {
			t.Errorf("%s: %d points, want 20", f, n)
		}
	}
}

// TestE2EUpExecutorErrors: up hands an executor's flags to the agents,
// whose backend checks them; a bad one stops up with the agent's error,
// naming the flag the user typed, and a flag of another executor is
// refused before anything starts. The runs' image, the shared dir and
// "needs --executor" are no rules of up's own any more.
func TestE2EUpExecutorErrors(t *testing.T) {
	bin := upstack.BuildAll(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--executor", "kubernetes", "--kube-image", "gpupass.local/run:1"}, `gpupass-agent: --kube-image: image "gpupass.local/run:1" is not pinned by digest`},
		{[]string{"--executor", "kubernetes"}, "gpupass-agent: --kube-image is required with the kubernetes executor: the runs' image, pinned by digest (NAME@sha256:…); on the local cluster, `sudo scripts/k8s-up.sh --run-image` builds one"},
		{[]string{"--executor", "slurm", "--slurm-shared-dir", "scratch"}, `gpupass-agent: --slurm-shared-dir "scratch": give an absolute directory every compute node sees`},
		{[]string{"--executor", "slurm", "--slurm-shared-dir", "/nonexistent/shared"}, `gpupass-agent: --slurm-shared-dir "/nonexistent/shared": not a directory here`},
		{[]string{"--kube-image", "gpupass.local/run:1"}, "gpupass: --kube-image needs --executor kubernetes"},
		{[]string{"--executor", "slurm", "--slurm-shared-dir", "/tmp", "--agents-per-region", "2"}, "--agents-per-region 2: with --executor slurm each region has one agent, which stands for every compute node"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(filepath.Join(bin, "gpupass"), append([]string{"up", "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--region", "r1"}, tt.args...)...)
			cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tt.want) {
				t.Errorf("gpupass up %s: %v\n%s\nwant %q", strings.Join(tt.args, " "), err, out, tt.want)
			}
		})
	}
}

// TestE2EFakeExecutorFromUp: an executor's flags reach gpupass up with no
// edit to up. gpupass up, given the executors' flags as gpupass-docs
// writes them from the agent's backends, here with the fake one added
// (one line, as in internal/command/agent's list), lists --fake-* in its help under
// the fake executor, hands them to the agents it starts (gpupass-agent
// -tags fakeexecutor, which has the fake executor), and shows the error
// the fake backend gives for a bad one; with good ones the agent stands
// for two fake nodes.
func TestE2EFakeExecutorFromUp(t *testing.T) {
	es, err := agentcmd.ExecutorFlags(append(agentcmd.Backends(), fake.Backend))
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
