//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// ddpGangSteps keeps the gang's run to seconds on a shared 2-core machine
// (examples/ddp's own tests use as many).
const ddpGangSteps = 60

// TestGangTwoLocalAgents (issue #34) is a run across two nodes as a user
// makes one: `gpupass up --agents-per-region 2` (two local agents in one
// region, each with its own job port range) and `gpupass train` of
// examples/ddp with resources.nodes: 2. The broker places both ranks at
// once, each agent gives its job the rendezvous, and the loss curve of
// the 2 ranks (rank 0's metrics, as the run shows them) is the curve of
// one process with the same global batch. Then: with one of the two
// nodes busy, a 2-node run waits holding no node; a 3-node run in a
// region of 2 fails with the matcher's reason, holding none; and a rank
// killed mid-run (kill -9 of its process) fails the run naming the rank
// and stops the other.
func TestGangTwoLocalAgents(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Args: []string{"--agents-per-region", "2"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	getRun := func(id string) *gpupassv1.Run {
		t.Helper()
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
		return resp.Msg.Run
	}
	runNamed := func(name string) *gpupassv1.Run {
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			return nil
		}
		for _, r := range resp.Msg.Runs {
			if strings.HasPrefix(r.Name, name+"-") {
				return r
			}
		}
		return nil
	}
	terminal := func(r *gpupassv1.Run) bool {
		switch r.State {
		case gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, gpupassv1.AllocState_ALLOC_STATE_FAILED, gpupassv1.AllocState_ALLOC_STATE_CANCELLED:
			return true
		}
		return false
	}

	// The reference: one process, no rendezvous, the same global batch.
	ref := filepath.Join(t.TempDir(), "metrics.jsonl")
	one := exec.CommandContext(ctx, py, filepath.Join(stack.Root, "examples", "ddp", "train_ddp.py"), "--steps", strconv.Itoa(ddpGangSteps))
	one.Env = append(os.Environ(), "GPUPASS_METRICS_FILE="+ref)
	if out, err := one.CombinedOutput(); err != nil {
		t.Fatalf("1 rank: %v\n%s", err, out)
	}
	series, err := metrics.ReadFile(ref, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]float64{}
	for _, p := range series.Points {
		want[p.Step] = p.Value
	}

	t.Run("two ranks give one rank's curve", func(t *testing.T) {
		train := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "gang", "--follow", "--", py, "train_ddp.py", "--steps", strconv.Itoa(ddpGangSteps), "--timeout", "60")
		out, err := train.CombinedOutput()
		if err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
		}
		run := runNamed("gang")
		if run == nil {
			t.Fatal("the gang's run is not listed")
		}
		rank1 := getRun(run.Id + "-r1")
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %s %s (%s), rank 1 %s (%s): want both succeeded", run.Id, run.State, run.Reason, rank1.State, rank1.Reason)
		}
		if run.NodeId == "" || run.NodeId == rank1.NodeId {
			t.Errorf("rank 0 on %q, rank 1 on %q: want two nodes", run.NodeId, rank1.NodeId)
		}
		log, _ := upstack.RunLog(t, ctx, rc, rank1.Id)
		if !strings.Contains(log, "rank 1/2 (local rank 0, node 1)") {
			t.Errorf("rank 1's log has no first line of global rank 1 of 2:\n%s", upstack.Tail(log, 2000))
		}
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		n := 0
		for _, p := range mr.Msg.Points {
			w, ok := want[p.Step]
			if !ok {
				continue
			}
			n++
			if d := math.Abs(w - p.Values["loss"]); d > worst || math.IsNaN(d) {
				worst = d
			}
		}
		t.Logf("2 ranks on %s and %s: max |Δloss| %.3g over %d steps against 1 rank", run.NodeId, rank1.NodeId, worst, n)
		if n != ddpGangSteps || !(worst <= 1e-5) {
			t.Errorf("2 ranks: %d of %d steps, max |Δloss| %g against 1 rank with the same global batch; want every step within 1e-5", n, ddpGangSteps, worst)
		}
		// The ranks are not runs of their own in the listing.
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Runs {
			if r.Id == rank1.Id {
				t.Errorf("runs lists rank 1 (%s) as a run", r.Id)
			}
		}
	})

	t.Run("with one node free a gang of two waits holding none, and a gang of three fails with the reason", func(t *testing.T) {
		long := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/train",
			"--name", "busy", "--", py, "train.py", "--steps", "100000", "--sleep", "0.2")
		if b, err := long.CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		var busy *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the one-node run to hold a node", func() bool {
			busy = runNamed("busy")
			return busy != nil && busy.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING
		})
		wait := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "waiting", "--", py, "train_ddp.py", "--steps", "10")
		if b, err := wait.CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		var w *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the gang to wait in the queue", func() bool {
			w = runNamed("waiting")
			return w != nil && w.QueuedUnixNano > 0
		})
		// Some time for a placement that would wrongly take the free
		// node: superviseRuns places pending runs every second.
		time.Sleep(3 * time.Second)
		for _, id := range []string{w.Id, w.Id + "-r1"} {
			if r := getRun(id); r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || r.NodeId != "" {
				t.Errorf("%s of a waiting gang: %s on %q (%s), want pending on no node", id, r.State, r.NodeId, r.Reason)
			}
		}
		if !strings.Contains(getRun(w.Id).Reason, "waiting for a free node") {
			t.Errorf("waiting gang's reason %q", getRun(w.Id).Reason)
		}
		if b, err := gp("cancel", w.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		if r := getRun(w.Id + "-r1"); r.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
			t.Errorf("rank 1 of the cancelled gang: %s (%s), want cancelled with it", r.State, r.Reason)
		}
		if b, err := gp("cancel", busy.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		upstack.WaitFor(t, ctx, "the one-node run to end", func() bool { return terminal(getRun(busy.Id)) })

		three := filepath.Join(t.TempDir(), "three.yaml")
		b, err := os.ReadFile(filepath.Join(stack.Root, "examples", "ddp", "gpupass.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(bytes.Replace(b, []byte("count: 2"), []byte("count: 3"), 1), []byte("nodes: 2"), []byte("nodes: 3"), 1)
		if err := os.WriteFile(three, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := gp("train", "--spec", three, "--region", "us-west-2", "--workdir", "examples/ddp", "--name", "three", "--",
			py, "train_ddp.py").CombinedOutput()
		r := runNamed("three")
		if r == nil {
			t.Fatalf("train of 3 nodes: %v\n%s", err, out)
		}
		r = getRun(r.Id)
		const why = "no gang of 3 nodes in us-west-2: only 2 certified a100-80gb nodes, a gang needs 3"
		if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, why) {
			t.Errorf("3-node run: %s (%s), want failed: %s", r.State, r.Reason, why)
		}
		for i := 1; i < 3; i++ {
			if x := getRun(fmt.Sprintf("%s-r%d", r.Id, i)); x.NodeId != "" || !terminal(x) {
				t.Errorf("rank %d of the failed gang: %s on %q", i, x.State, x.NodeId)
			}
		}
	})

	t.Run("a rank killed mid-run fails the run naming it and stops the other", func(t *testing.T) {
		train := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "killed", "--", py, "train_ddp.py", "--steps", "100000000", "--timeout", "60")
		if b, err := train.CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		var run *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the gang to train", func() bool {
			run = runNamed("killed")
			return run != nil && run.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && run.HeldThrough > 5
		})
		rank1 := getRun(run.Id + "-r1")
		pid := 0
		upstack.WaitFor(t, ctx, "rank 1's process", func() bool {
			pid = jobProcess(run.Id+"-r1", "train_ddp.py")
			return pid > 0
		})
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d: %v", pid, err)
		}
		upstack.WaitFor(t, ctx, "the run to end", func() bool {
			run = getRun(run.Id)
			return terminal(run)
		})
		rank1 = getRun(rank1.Id)
		wantWhy := "rank 1 on " + rank1.NodeId + ":"
		if run.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(run.Reason, wantWhy) {
			t.Errorf("run after rank 1 was killed: %s (%s), want failed with %q", run.State, run.Reason, wantWhy)
		}
		t.Logf("run %s: %s", run.State, run.Reason)
		if rank1.State != gpupassv1.AllocState_ALLOC_STATE_FAILED {
			t.Errorf("rank 1: %s (%s), want failed", rank1.State, rank1.Reason)
		}
		if pid := jobProcess(run.Id, "train_ddp.py"); pid > 0 {
			t.Errorf("rank 0's process %d still runs after the run ended", pid)
		}
	})
}

// jobProcess is the pid of a process of the run alloc (its
// GPUPASS_ALLOC_ID) whose command line holds arg; 0 when none.
func jobProcess(alloc, arg string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(env, []byte("\x00GPUPASS_ALLOC_ID="+alloc+"\x00")) && !bytes.HasPrefix(env, []byte("GPUPASS_ALLOC_ID="+alloc+"\x00")) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		if bytes.Contains(cmd, []byte(arg)) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}
