//go:build e2e

// Package gange2e runs a gang on a Slurm test cluster of two nodes with
// the same GRES (gpu:a100:4 each), which the shared cluster of package
// slurm's tests, whose n2 differs, cannot give: a test binary of its own.
package gange2e

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

func TestMain(m *testing.M) {
	slurmtest.Nodes = []slurmtest.Node{{Name: "n1", GPUType: "a100", GPUs: 4}, {Name: "n2", GPUType: "a100", GPUs: 4}}
	os.Exit(slurmtest.Run(m))
}

// steps keeps the gang's run to seconds on a shared 2-core machine.
const steps = 60

// TestE2ESlurmGang (issue #34) is a run across two Slurm nodes as a user
// makes one: `gpupass up --executor slurm` (the agent stands for n1 and
// n2, same GRES) and `gpupass train` of examples/ddp with resources.nodes:
// 2. The broker places both ranks on the cluster's nodes, the agent
// submits one `sbatch -N2` job whose srun starts a task per node, each
// rank's log holds its own task's output with no record lost or
// repeated, and the loss curve of the 2 ranks is one process's with the
// same global batch. Then a rank's python killed (kill -9) mid-run ends
// the job and fails the run naming the rank, with no job left in squeue.
func TestE2ESlurmGang(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	g := startGang(t, ctx)
	c, py, stack, rc, gp := g.c, g.py, g.stack, g.rc, g.gp

	_, want := upstack.ReferenceCurve(t, ctx, py, stack.Root, steps)

	t.Run("two ranks in one sbatch -N2 job give one rank's curve", func(t *testing.T) {
		run, rank1 := g.trainGang(t, ctx, "gang")
		if run.NodeId == "" || run.NodeId == rank1.NodeId {
			t.Errorf("rank 0 on %q, rank 1 on %q: want two nodes", run.NodeId, rank1.NodeId)
		}
		// Both ranks name the one job, each its own node.
		s0, s1 := run.GetSlurm(), rank1.GetSlurm()
		if s0.GetJobId() == "" || s1.GetJobId() != s0.GetJobId() || s0.GetNode() == s1.GetNode() || s1.GetNode() == "" {
			t.Errorf("slurm placement of rank 0 %v, rank 1 %v: want one job id, two nodes", s0, s1)
		}
		// RunLog fails on a record lost or repeated (its seq).
		log0, _ := upstack.RunLog(t, ctx, rc, run.Id)
		log1, _ := upstack.RunLog(t, ctx, rc, rank1.Id)
		for _, w := range []struct {
			log, line string
			n         int
		}{
			{log0, `"rank 0/2 (local rank 0, node 0)`, 1},
			{log0, `"step 50 loss`, 1},
			{log0, `"done in`, 1},
			{log0, `"rank 1/2`, 0},
			{log1, `"rank 1/2 (local rank 0, node 1)`, 1},
			{log1, `"rank 0/2`, 0},
			{log1, `"step 50 loss`, 0},
		} {
			if got := strings.Count(w.log, w.line); got != w.n {
				t.Errorf("%q %d time(s) in a rank's log, want %d:\n%s", w.line, got, w.n, upstack.Tail(w.log, 2000))
			}
		}
		if !strings.Contains(log0, "slurm job") || !strings.Contains(log1, "rank 1 of 2: slurm job") {
			t.Errorf("the ranks' logs do not name the one slurm job:\n%s\n---\n%s", upstack.Tail(log0, 1500), upstack.Tail(log1, 1500))
		}
		got, points := upstack.Loss(t, ctx, rc, run.Id)
		worst := upstack.MaxDelta(want, got)
		t.Logf("2 ranks on %s and %s: max |Δloss| %.3g over %d steps against 1 rank", run.NodeId, rank1.NodeId, worst, len(got))
		if len(got) != steps || points != steps || !(worst <= 1e-5) {
			t.Errorf("2 ranks: %d of %d steps (%d points), max |Δloss| %g against 1 rank with the same global batch; want every step once, within 1e-5", len(got), steps, points, worst)
		}
		// The "each audit verified with every node's report".
		t.Logf("audit verify:\n%s", upstack.Tail(stack.CheckAudit(t, ctx, run.Id, "rank-1"), 2000))
	})

	gangLink(t, ctx, g) // link_e2e_test.go

	t.Run("a rank killed mid-run fails the run naming it and ends the job", func(t *testing.T) {
		if b, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", "killed", "--", py, "train_ddp.py", "--steps", "100000000", "--timeout", "60").CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		run := upstack.WaitRun(t, ctx, rc, "killed", "the gang to train", func(r *gpupassv1.Run) bool {
			return r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING
		})
		upstack.WaitFor(t, ctx, "rank 1's process", func() bool { return upstack.JobProcess(run.Id+"-r1", "train_ddp.py") > 0 })
		time.Sleep(2 * time.Second) // training, not starting
		upstack.Kill9JobProcess(t, run.Id+"-r1", "train_ddp.py")
		run = upstack.WaitEnd(t, ctx, rc, run.Id)
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
		wantWhy := "rank 1 on " + rank1.NodeId + ": its task on slurm node "
		t.Logf("run %s: %s", run.State, run.Reason)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(run.Reason, wantWhy) || strings.Contains(run.Reason, "rank 0 on") {
			t.Errorf("run after rank 1 was killed: %s (%s), want failed naming rank 1 (%q) only", run.State, run.Reason, wantWhy)
		}
		if rank1.State != gpupassv1.AllocState_ALLOC_STATE_FAILED {
			t.Errorf("rank 1: %s (%s), want failed", rank1.State, rank1.Reason)
		}
		noJob(t, c, run.Id, "the run ended")
		if pid := upstack.JobProcess(run.Id, "train_ddp.py"); pid > 0 {
			t.Errorf("rank 0's process %d still runs after the run ended", pid)
		}
	})

	gangRestart(t, ctx, g, "restarted")
	gangCancel(t, ctx, g, "cancelled", nil)
}

// region is the stack's one region, of the cluster's two nodes.
const region = "hpc-gang"

// gangStack is `gpupass up --executor slurm` on the test cluster, once
// the broker would place a gang of its two nodes.
type gangStack struct {
	c     *slurmtest.Cluster
	py    string
	stack *upstack.Stack
	rc    *client.RunClients
	// gp, getRun and runNamed are upstack's, for the tests of this
	// package written before it had them.
	gp       func(args ...string) *exec.Cmd
	getRun   func(id string) *gpupassv1.Run
	runNamed func(name string) *gpupassv1.Run
}

func startGang(t testing.TB, ctx context.Context, env ...string) *gangStack {
	c := slurmtest.Shared(t)
	py := upstack.RequireTorch(t)
	// env: more of up's environment, which its agent reads its flags
	// from (GPUPASS_RUN_AS).
	stack := upstack.Start(t, upstack.Options{Regions: []string{region},
		Args: []string{"--executor", "slurm", "--slurm-partition", slurmtest.Partition, "--slurm-shared-dir", c.Shared},
		Env:  append([]string{"SLURM_CONF=" + c.Conf, "GPUPASS_SLURM_REFRESH=2s"}, env...)})
	dry := stack.WaitGang(t, ctx, "examples/ddp/gpupass.yaml", region, 2)
	t.Logf("dry-run:\n%s", upstack.Tail(dry, 1500))
	g := &gangStack{c: c, py: py, stack: stack, rc: stack.Runs(t)}
	g.gp = func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	g.getRun = func(id string) *gpupassv1.Run { return upstack.GetRun(t, ctx, g.rc, id) }
	g.runNamed = func(name string) *gpupassv1.Run { return upstack.RunNamed(ctx, g.rc, name) }
	return g
}

// terminal is upstack.Terminal, for the tests of this package written
// before upstack had it.
var terminal = upstack.Terminal

// noJob fails t when a job of the gang whose run is id is still in
// squeue after what ended it.
func noJob(t *testing.T, c *slurmtest.Cluster, id, after string) {
	t.Helper()
	if q := strings.TrimSpace(c.Command(t, "squeue", "-h", "-n", "gpupass-"+id)); q != "" {
		t.Errorf("a job of the gang is still in squeue after %s:\n%s", after, q)
	}
}

// gangRestart is the subtest of a gang whose rank 1 is killed -9 mid-run
// with a restart left (--max-restarts 1): a fresh gang resumes every
// rank from its checkpoint, the run succeeds after 1 restart with every
// step's point, and no job of the gang is left.
func gangRestart(t *testing.T, ctx context.Context, g *gangStack, name string) {
	t.Run("a rank killed with a restart left restarts the gang from the checkpoint", func(t *testing.T) {
		const total = 150
		if b, err := g.gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", name, "--max-restarts", "1", "--", g.py, "train_ddp.py", "--steps", strconv.Itoa(total),
			"--step-sleep", "0.05", "--timeout", "60").CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		run := upstack.WaitRun(t, ctx, g.rc, name, "rank 0 past step 60", func(r *gpupassv1.Run) bool {
			if upstack.Terminal(r) {
				t.Fatalf("run %s ended before step 60: %s (%s)", r.Id, r.State, r.Reason)
			}
			return upstack.StepAtLeast(ctx, g.rc, r.Id, 60)
		})
		upstack.Kill9JobProcess(t, run.Id+"-r1", "train_ddp.py")
		run = upstack.WaitEnd(t, ctx, g.rc, run.Id)
		rank1 := upstack.GetRun(t, ctx, g.rc, run.Id+"-r1")
		t.Logf("run %s after %d restart(s): %s; rank 1 %s", run.State, run.Restarts, run.Reason, rank1.State)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded after 1 restart",
				run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts)
		}
		// RunLog fails on a record lost or repeated across the restart.
		for rank, id := range []string{run.Id, rank1.Id} {
			l, _ := upstack.RunLog(t, ctx, g.rc, id)
			if !strings.Contains(l, `"msg":"rank `+strconv.Itoa(rank)+` resumed from`) {
				t.Errorf("rank %d's log does not show it resumed from the checkpoint:\n%s", rank, upstack.Tail(l, 3000))
			}
		}
		if got, _ := upstack.Loss(t, ctx, g.rc, run.Id); len(got) != total {
			t.Errorf("restarted gang: %d of %d steps", len(got), total)
		}
		noJob(t, g.c, run.Id, "the run ended")
	})
}

// gangCancel is the subtest of `gpupass cancel` of a gang that trains:
// the one job is scancelled, every rank ends cancelled, no job or
// training process is left. training, when set, checks the run once
// every rank's process runs, before the cancel.
func gangCancel(t *testing.T, ctx context.Context, g *gangStack, name string, training func(t *testing.T, run *gpupassv1.Run)) {
	t.Run("cancel scancels the one job and ends every rank", func(t *testing.T) {
		if b, err := g.gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", name, "--", g.py, "train_ddp.py", "--steps", "100000000", "--timeout", "60").CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		run := upstack.WaitRun(t, ctx, g.rc, name, "every rank's process", func(r *gpupassv1.Run) bool {
			if upstack.Terminal(r) {
				t.Fatalf("run %s ended before every rank trained: %s (%s)", r.Id, r.State, r.Reason)
			}
			return r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && upstack.JobProcess(r.Id, "train_ddp.py") > 0 &&
				upstack.JobProcess(r.Id+"-r1", "train_ddp.py") > 0
		})
		if training != nil {
			training(t, run)
		}
		if b, err := g.gp("cancel", run.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			if r := upstack.WaitEnd(t, ctx, g.rc, id); r.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
				t.Errorf("%s after cancel: %s (%s), want cancelled", id, r.State, r.Reason)
			}
		}
		noJob(t, g.c, run.Id, "cancel")
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			if pid := upstack.JobProcess(id, "train_ddp.py"); pid > 0 {
				t.Errorf("%s's process %d still runs after cancel", id, pid)
			}
		}
	})
}

// trainGang runs `train --follow` of examples/ddp as a gang of two named
// name (steps steps) and returns its two ranks, both of which must have
// succeeded.
func (g *gangStack) trainGang(t *testing.T, ctx context.Context, name string) (run, rank1 *gpupassv1.Run) {
	t.Helper()
	out, err := g.gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
		"--name", name, "--follow", "--", g.py, "train_ddp.py", "--steps", strconv.Itoa(steps), "--timeout", "60").CombinedOutput()
	run = upstack.RunNamed(ctx, g.rc, name)
	if err != nil || run == nil {
		t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
	}
	rank1 = upstack.GetRun(t, ctx, g.rc, run.Id+"-r1")
	if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		t.Fatalf("run %s %s (%s), rank 1 %s (%s): want both succeeded", run.Id, run.State, run.Reason, rank1.State, rank1.Reason)
	}
	return run, rank1
}
