//go:build e2e

package gpupass_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// restartSteps and restartSleep make a gang's run last long enough
// (about 150 × 50 ms) for one of its ranks to be killed mid-run, after
// rank 0 has checkpointed (every 25 steps) and shipped the checkpoint.
const (
	restartSteps = 150
	restartSleep = "0.05"
)

// TestGangRestart (issue #34) is a gang that restarts whole, as a user
// meets it: `gpupass up --agents-per-region 2` and `gpupass train
// --max-restarts 1` of examples/ddp across the two agents. A rank's
// process killed -9 mid-run stops the other rank, and the broker starts
// the gang again from rank 0's last shipped checkpoint, handed to both
// ranks: the run succeeds after one restart, its loss curve (the last
// value of each step) is the uninterrupted one-process curve, and each
// rank's log is one gap-free, unrepeated sequence across both attempts
// with the restart marked. A NaN on rank 1 restarts the gang as well.
func TestGangRestart(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Args: []string{"--agents-per-region", "2"}})
	rc := stack.Runs(t)
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	submit := func(t testing.TB, name string, args ...string) *gpupassv1.Run {
		t.Helper()
		cmd := append([]string{"train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", name, "--max-restarts", "1", "--", py, "train_ddp.py", "--timeout", "60"}, args...)
		out, err := gp(cmd...).CombinedOutput()
		if err != nil {
			t.Fatalf("gpupass %s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
		run := upstack.RunNamed(ctx, rc, name)
		if run == nil {
			t.Fatalf("run %s not listed after train printed:\n%s", name, out)
		}
		return run
	}
	ref, want := upstack.ReferenceCurve(t, ctx, py, stack.Root, restartSteps)

	t.Run("a rank killed -9 restarts the gang from the checkpoint", func(t *testing.T) {
		run := submit(t, "restart", "--steps", strconv.Itoa(restartSteps), "--step-sleep", restartSleep)
		upstack.WaitFor(t, ctx, "rank 0 past step 60", func() bool { return upstack.StepAtLeast(ctx, rc, run.Id, 60) })
		upstack.Kill9JobProcess(t, run.Id+"-r1", "train_ddp.py")
		run = upstack.WaitEnd(t, ctx, rc, run.Id)
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
		t.Logf("run %s after %d restart(s): %s; rank 1 %s", run.State, run.Restarts, run.Reason, rank1.State)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded after 1 restart",
				run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts)
		}
		log0, log1 := upstack.CheckLog(t, ctx, rc, run.Id), upstack.CheckLog(t, ctx, rc, rank1.Id)
		for rank, l := range []string{log0, log1} {
			if !strings.Contains(l, "the gang restarted: every rank resumes from rank 0's last shipped checkpoint") ||
				!strings.Contains(l, `"msg":"rank `+strconv.Itoa(rank)+` resumed from`) {
				t.Errorf("rank %d's log does not mark the restart from the checkpoint:\n%s", rank, upstack.Tail(l, 3000))
			}
		}
		// The resumed attempt logs the steps after the checkpoint again:
		// the curve is each step's last value.
		got, _ := upstack.Loss(t, ctx, rc, run.Id)
		worst := upstack.MaxDelta(want, got)
		t.Logf("after the restart: max |Δloss| %.3g over %d of %d steps against 1 uninterrupted rank", worst, len(got), restartSteps)
		if len(got) != restartSteps || !(worst <= 1e-5) {
			t.Errorf("restarted gang: %d of %d steps, max |Δloss| %g; want every step within 1e-5 of the uninterrupted run", len(got), restartSteps, worst)
		}

		// Per-rank views, as a user reads them.
		cli := func(args ...string) (string, error) {
			out, err := gp(args...).CombinedOutput()
			return string(out), err
		}
		all, err := cli("logs", run.Id)
		if err != nil || !strings.Contains(all, "us-west-2/0 | ") || !strings.Contains(all, "us-west-2/1 | ") {
			t.Errorf("gpupass logs %s (%v): want lines of both ranks marked us-west-2/0 and us-west-2/1:\n%s", run.Id, err, upstack.Tail(all, 2000))
		}
		for _, args := range [][]string{{"logs", run.Id, "--rank", "1"}, {"logs", rank1.Id}} {
			one, err := cli(args...)
			if err != nil || !strings.Contains(one, "us-west-2/1 | ") || strings.Contains(one, "us-west-2/0 | ") || !strings.Contains(one, "rank 1 resumed from") {
				t.Errorf("gpupass %s (%v): want rank 1's lines alone:\n%s", strings.Join(args, " "), err, upstack.Tail(one, 2000))
			}
		}
		if out, err := cli("logs", run.Id, "--rank", "2"); err == nil || !strings.Contains(out, "--rank 2: run "+run.Id+" has 2 ranks, 0 to 1") {
			t.Errorf("gpupass logs %s --rank 2 (%v): want the ranks there are named:\n%s", run.Id, err, out)
		}
		listed, err := cli("runs")
		if err != nil || strings.Contains(listed, rank1.Id) {
			t.Errorf("gpupass runs (%v) lists rank 1 without --ranks:\n%s", err, listed)
		}
		listed, err = cli("runs", "--ranks")
		if err != nil || !strings.Contains(listed, rank1.Id) || !strings.Contains(listed, rank1.NodeId) {
			t.Errorf("gpupass runs --ranks (%v): want rank 1 (%s on %s) listed:\n%s", err, rank1.Id, rank1.NodeId, listed)
		}
	})

	t.Run("a NaN on rank 1 restarts the gang from the checkpoint", func(t *testing.T) {
		// Rank 1 writes the metrics, so its agent's NaN guard sees the
		// NaN; the script makes it only on a fresh start, so a restart
		// that did not resume from the checkpoint would hit it again.
		// train --follow follows the gang through its restart to the end.
		out, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", "nan", "--max-restarts", "1", "--follow", "--", py, "train_ddp.py", "--timeout", "60",
			"--steps", "80", "--step-sleep", "0.02", "--nan-at-step", "60", "--metrics-rank", "1").CombinedOutput()
		if err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
		}
		if !strings.Contains(string(out), "us-west-2/1 | ") || !strings.Contains(string(out), "us-west-2/0 | ") {
			t.Errorf("train --follow of a gang: want both ranks' lines marked:\n%s", upstack.Tail(string(out), 3000))
		}
		run := upstack.RunNamed(ctx, rc, "nan")
		if run == nil {
			t.Fatal("the NaN run is not listed")
		}
		t.Logf("run %s after %d restart(s): %s", run.State, run.Restarts, run.Reason)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Fatalf("run %s (%s) after %d restart(s): want succeeded after 1", run.State, run.Reason, run.Restarts)
		}
		log1 := upstack.CheckLog(t, ctx, rc, run.Id+"-r1")
		upstack.CheckLog(t, ctx, rc, run.Id)
		if !strings.Contains(strings.ToLower(log1), "non-finite loss nan at step 60") || !strings.Contains(log1, `"msg":"rank 1 resumed from`) {
			t.Errorf("rank 1's log has no NaN at step 60 followed by a resume:\n%s", upstack.Tail(log1, 3000))
		}
		// Rank 1 logged the metrics: compare reads them with
		// --metrics-rank 1, and they follow the uninterrupted curve.
		cmp, err := gp("compare", ref, run.Id, "--metrics-rank", "1", "--tolerance", "0.00001", "--fail-on-divergence", "--post", "none").CombinedOutput()
		if err != nil {
			t.Errorf("gpupass compare %s %s --metrics-rank 1: %v\n%s", ref, run.Id, err, upstack.Tail(string(cmp), 3000))
		}
		if b, err := gp("compare", ref, run.Id, "--metrics-rank", "2", "--post", "none").CombinedOutput(); err == nil ||
			!strings.Contains(string(b), "--metrics-rank is 2, but run "+run.Id+" has 2 ranks, 0 to 1") {
			t.Errorf("compare --metrics-rank 2 (%v): want the ranks there are named:\n%s", err, b)
		}
	})
}
