//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
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
	rc := stack.Runs(t)
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }

	_, want := upstack.ReferenceCurve(t, ctx, py, stack.Root, ddpGangSteps)

	t.Run("two ranks give one rank's curve", func(t *testing.T) {
		train := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "gang", "--follow", "--", py, "train_ddp.py", "--steps", strconv.Itoa(ddpGangSteps), "--timeout", "60")
		out, err := train.CombinedOutput()
		if err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
		}
		run := upstack.RunNamed(ctx, rc, "gang")
		if run == nil {
			t.Fatal("the gang's run is not listed")
		}
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
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
		got, points := upstack.Loss(t, ctx, rc, run.Id)
		worst := upstack.MaxDelta(want, got)
		t.Logf("2 ranks on %s and %s: max |Δloss| %.3g over %d steps against 1 rank", run.NodeId, rank1.NodeId, worst, len(got))
		if len(got) != ddpGangSteps || points != ddpGangSteps || !(worst <= 1e-5) {
			t.Errorf("2 ranks: %d of %d steps (%d points), max |Δloss| %g against 1 rank with the same global batch; want every step once, within 1e-5", len(got), ddpGangSteps, points, worst)
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
		busy := upstack.WaitRun(t, ctx, rc, "busy", "the one-node run to hold a node", func(r *gpupassv1.Run) bool {
			return r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING
		})
		wait := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "waiting", "--", py, "train_ddp.py", "--steps", "10")
		if b, err := wait.CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		w := upstack.WaitRun(t, ctx, rc, "waiting", "the gang to wait in the queue", func(r *gpupassv1.Run) bool { return r.QueuedUnixNano > 0 })
		// Some time for a placement that would wrongly take the free
		// node: superviseRuns places pending runs every second.
		time.Sleep(3 * time.Second)
		for _, id := range []string{w.Id, w.Id + "-r1"} {
			if r := upstack.GetRun(t, ctx, rc, id); r.State != gpupassv1.AllocState_ALLOC_STATE_PENDING || r.NodeId != "" {
				t.Errorf("%s of a waiting gang: %s on %q (%s), want pending on no node", id, r.State, r.NodeId, r.Reason)
			}
		}
		if !strings.Contains(upstack.GetRun(t, ctx, rc, w.Id).Reason, "waiting for a free node") {
			t.Errorf("waiting gang's reason %q", upstack.GetRun(t, ctx, rc, w.Id).Reason)
		}
		if b, err := gp("cancel", w.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		if r := upstack.GetRun(t, ctx, rc, w.Id+"-r1"); r.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
			t.Errorf("rank 1 of the cancelled gang: %s (%s), want cancelled with it", r.State, r.Reason)
		}
		if b, err := gp("cancel", busy.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		upstack.WaitEnd(t, ctx, rc, busy.Id)

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
		r := upstack.RunNamed(ctx, rc, "three")
		if r == nil {
			t.Fatalf("train of 3 nodes: %v\n%s", err, out)
		}
		r = upstack.GetRun(t, ctx, rc, r.Id)
		const why = "no gang of 3 nodes in us-west-2: only 2 certified a100-80gb nodes, a gang needs 3"
		if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, why) {
			t.Errorf("3-node run: %s (%s), want failed: %s", r.State, r.Reason, why)
		}
		for i := 1; i < 3; i++ {
			if x := upstack.GetRun(t, ctx, rc, fmt.Sprintf("%s-r%d", r.Id, i)); x.NodeId != "" || !upstack.Terminal(x) {
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
		run := upstack.WaitRun(t, ctx, rc, "killed", "the gang to train", upstack.Training)
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
		upstack.WaitFor(t, ctx, "rank 1's process", func() bool { return upstack.JobProcess(run.Id+"-r1", "train_ddp.py") > 0 })
		upstack.Kill9JobProcess(t, run.Id+"-r1", "train_ddp.py")
		run = upstack.WaitEnd(t, ctx, rc, run.Id)
		rank1 = upstack.GetRun(t, ctx, rc, rank1.Id)
		wantWhy := "rank 1 on " + rank1.NodeId + ":"
		if run.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(run.Reason, wantWhy) {
			t.Errorf("run after rank 1 was killed: %s (%s), want failed with %q", run.State, run.Reason, wantWhy)
		}
		t.Logf("run %s: %s", run.State, run.Reason)
		if rank1.State != gpupassv1.AllocState_ALLOC_STATE_FAILED {
			t.Errorf("rank 1: %s (%s), want failed", rank1.State, rank1.Reason)
		}
		if pid := upstack.JobProcess(run.Id, "train_ddp.py"); pid > 0 {
			t.Errorf("rank 0's process %d still runs after the run ended", pid)
		}
	})
}
