//go:build e2e

package gpupass_test

import (
	"context"
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
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	getRun := func(t testing.TB, id string) *gpupassv1.Run {
		t.Helper()
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
		return resp.Msg.Run
	}
	terminal := func(r *gpupassv1.Run) bool {
		switch r.State {
		case gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, gpupassv1.AllocState_ALLOC_STATE_FAILED, gpupassv1.AllocState_ALLOC_STATE_CANCELLED:
			return true
		}
		return false
	}
	submit := func(t testing.TB, name string, args ...string) *gpupassv1.Run {
		t.Helper()
		cmd := append([]string{"train", "--spec", "examples/ddp/gpupass.yaml", "--region", "us-west-2", "--workdir", "examples/ddp",
			"--name", name, "--max-restarts", "1", "--", py, "train_ddp.py", "--timeout", "60"}, args...)
		out, err := gp(cmd...).CombinedOutput()
		if err != nil {
			t.Fatalf("gpupass %s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Runs {
			if strings.HasPrefix(r.Name, name+"-") {
				return r
			}
		}
		t.Fatalf("run %s not listed after train printed:\n%s", name, out)
		return nil
	}
	// checkLog reads a rank's whole log (upstack.RunLog fails on a gap
	// or a repeated seq) and checks the broker holds all of it.
	checkLog := func(t testing.TB, id string) string {
		t.Helper()
		text, n := upstack.RunLog(t, ctx, rc, id)
		r := getRun(t, id)
		if n != r.LastSeq || !r.LogComplete {
			t.Errorf("%s: %d records read, last seq %d, log complete %v: want every record once", id, n, r.LastSeq, r.LogComplete)
		}
		return text
	}

	ref := filepath.Join(t.TempDir(), "metrics.jsonl")
	one := exec.CommandContext(ctx, py, filepath.Join(stack.Root, "examples", "ddp", "train_ddp.py"), "--steps", strconv.Itoa(restartSteps))
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

	t.Run("a rank killed -9 restarts the gang from the checkpoint", func(t *testing.T) {
		run := submit(t, "restart", "--steps", strconv.Itoa(restartSteps), "--step-sleep", restartSleep)
		upstack.WaitFor(t, ctx, "rank 0 past step 60", func() bool {
			mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
			return err == nil && len(mr.Msg.Points) > 0 && mr.Msg.Points[len(mr.Msg.Points)-1].Step >= 60
		})
		pid := jobProcess(run.Id+"-r1", "train_ddp.py")
		if pid == 0 {
			t.Fatalf("no process of rank 1 (%s-r1) to kill", run.Id)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d: %v", pid, err)
		}
		upstack.WaitFor(t, ctx, "the run to end", func() bool {
			run = getRun(t, run.Id)
			return terminal(run)
		})
		rank1 := getRun(t, run.Id+"-r1")
		t.Logf("run %s after %d restart(s): %s; rank 1 %s", run.State, run.Restarts, run.Reason, rank1.State)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded after 1 restart",
				run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts)
		}
		log0, log1 := checkLog(t, run.Id), checkLog(t, rank1.Id)
		for rank, l := range []string{log0, log1} {
			if !strings.Contains(l, "the gang restarted: every rank resumes from rank 0's last shipped checkpoint") ||
				!strings.Contains(l, `"msg":"rank `+strconv.Itoa(rank)+` resumed from`) {
				t.Errorf("rank %d's log does not mark the restart from the checkpoint:\n%s", rank, upstack.Tail(l, 3000))
			}
		}
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
		if err != nil {
			t.Fatal(err)
		}
		// The resumed attempt logs the steps after the checkpoint again:
		// the curve is each step's last value.
		got := map[int64]float64{}
		for _, p := range mr.Msg.Points {
			got[p.Step] = p.Values["loss"]
		}
		var worst float64
		for step, w := range want {
			if d := math.Abs(w - got[step]); d > worst || math.IsNaN(d) {
				worst = d
			}
		}
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
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var run *gpupassv1.Run
		for _, r := range resp.Msg.Runs {
			if strings.HasPrefix(r.Name, "nan-") {
				run = r
			}
		}
		if run == nil {
			t.Fatal("the NaN run is not listed")
		}
		t.Logf("run %s after %d restart(s): %s", run.State, run.Restarts, run.Reason)
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
			t.Fatalf("run %s (%s) after %d restart(s): want succeeded after 1", run.State, run.Reason, run.Restarts)
		}
		log1 := checkLog(t, run.Id+"-r1")
		checkLog(t, run.Id)
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
