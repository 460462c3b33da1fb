//go:build e2e

package gange2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2ESlurmGangAgentKilled (issue #34: "nothing is lost or duplicated
// across a kill -9 of an agent of the gang") kills the Slurm agent of a
// `gpupass up --executor slurm` stack with -9 while a gang of two ranks
// trains, twice, and lets up start it again as it does a crashed agent
// (the same flags and state dir). The one agent stands for n1 and n2,
// so each kill is a kill of the agent of rank 0 and of the agent of rank
// 1. The restarted agent follows the one `sbatch -N2` job on: the job
// keeps running (squeue shows the same id, and no second job is ever
// submitted), the run succeeds without a restart, each rank's log has
// every step's line exactly once and each rank still names the one job
// and its own node, and the loss curve is one process's. The first kill
// lands as soon as the job is queued, before its link step has a result:
// the restarted agent reads the figure still, and both ranks' signed
// reports carry it, not "not measured yet".
func TestE2ESlurmGangAgentKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	g := startGang(t, ctx)
	c, py, stack, rc, gp, getRun, runNamed := g.c, g.py, g.stack, g.rc, g.gp, g.getRun, g.runNamed
	const total, sleep = 400, "0.1"

	ref := filepath.Join(t.TempDir(), "metrics.jsonl")
	one := exec.CommandContext(ctx, py, filepath.Join(stack.Root, "examples", "ddp", "train_ddp.py"), "--steps", strconv.Itoa(total))
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

	if b, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
		"--name", "agentkill", "--", py, "train_ddp.py", "--steps", strconv.Itoa(total), "--step-sleep", sleep,
		"--log-steps", "--timeout", "60").CombinedOutput(); err != nil {
		t.Fatalf("train: %v\n%s", err, b)
	}
	var run *gpupassv1.Run
	lastStep := func() int64 {
		if run = runNamed("agentkill"); run == nil {
			return 0
		}
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
		if err != nil || len(mr.Msg.Points) == 0 {
			return 0
		}
		return mr.Msg.Points[len(mr.Msg.Points)-1].Step
	}
	defer func() {
		if t.Failed() && run != nil {
			for _, id := range []string{run.Id, run.Id + "-r1"} {
				l, _ := upstack.RunLog(t, ctx, rc, id)
				t.Logf("%s's log (tail):\n%s", id, upstack.Tail(l, 4000))
			}
		}
	}()
	jobOf := func() string {
		return strings.TrimSpace(c.Command(t, "squeue", "-h", "-n", "gpupass-"+run.Id, "-o", "%i"))
	}
	var jobID string
	for i, at := range []int64{0, 160} {
		if at == 0 {
			upstack.WaitFor(t, ctx, "the gang's slurm job", func() bool { run = runNamed("agentkill"); return run != nil && jobOf() != "" })
		} else {
			upstack.WaitFor(t, ctx, fmt.Sprintf("rank 0 past step %d", at), func() bool { return lastStep() >= at })
		}
		id := jobOf()
		if id == "" || strings.Contains(id, "\n") {
			t.Fatalf("before kill %d: squeue shows %q for the gang, want its one job", i+1, id)
		}
		if jobID != "" && id != jobID {
			t.Fatalf("before kill %d: squeue shows job %s for the gang, it was %s before the restart", i+1, id, jobID)
		}
		jobID = id
		pids := stack.Config(t).AgentPIDs
		if len(pids) != 1 {
			t.Fatalf("the stack has agents %v, want the one Slurm agent", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 the Slurm agent (pid %d): %v", pids[0], err)
		}
		t.Logf("kill %d: the Slurm agent (pid %d) killed -9 at step %d of %d, slurm job %s", i+1, pids[0], lastStep(), total, jobID)
		upstack.WaitFor(t, ctx, "gpupass up to start the agent again", func() bool {
			p := stack.Config(t).AgentPIDs
			return len(p) == 1 && p[0] != pids[0]
		})
		if id := jobOf(); id != jobID {
			t.Fatalf("after kill %d: squeue shows %q for the gang, want job %s running on", i+1, id, jobID)
		}
	}
	if s := lastStep(); s >= total {
		t.Fatalf("the run was over (step %d) by the second kill: it did not land mid-run", s)
	}
	upstack.WaitFor(t, ctx, "the run to end", func() bool {
		run = getRun(run.Id)
		return terminal(run)
	})
	rank1 := getRun(run.Id + "-r1")
	t.Logf("run %s (%s) after %d restart(s); rank 1 %s (%s)", run.State, run.Reason, run.Restarts, rank1.State, rank1.Reason)
	if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 0 {
		t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded, followed on without a restart",
			run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts)
	}
	s0, s1 := run.GetSlurm(), rank1.GetSlurm()
	if s0.GetJobId() != jobID || s1.GetJobId() != jobID || s0.GetNode() == "" || s1.GetNode() == "" || s0.GetNode() == s1.GetNode() {
		t.Errorf("slurm placement after the restarts: rank 0 %v, rank 1 %v; want job %s on each rank's own node", s0, s1, jobID)
	}
	if jobs := c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+run.Id, "-o", "%i %T"); jobs != jobID+" COMPLETED\n" {
		t.Errorf("the gang's slurm jobs: %q, want one, %s, completed (no second sbatch)", jobs, jobID)
	}
	// RunLog fails on a record lost or repeated (its seq); the lines say
	// whether the follow read a line twice or skipped one.
	stepLine := regexp.MustCompile(`"msg":"rank ([01]) step ([0-9]+) loss`)
	for rank, id := range []string{run.Id, rank1.Id} {
		l, _ := upstack.RunLog(t, ctx, rc, id)
		count := map[int]int{}
		for _, m := range stepLine.FindAllStringSubmatch(l, -1) {
			if m[1] != strconv.Itoa(rank) {
				t.Errorf("rank %d's log has rank %s's line", rank, m[1])
				continue
			}
			s, _ := strconv.Atoi(m[2])
			count[s]++
		}
		var bad []string
		for s := 1; s <= total; s++ {
			if count[s] != 1 {
				bad = append(bad, fmt.Sprintf("step %d ×%d", s, count[s]))
			}
		}
		if len(bad) > 0 {
			t.Errorf("rank %d's log: %d of %d steps not there exactly once (lost or duplicated across the agent's restarts): %s",
				rank, len(bad), total, strings.Join(bad[:min(len(bad), 12)], ", "))
		}
		if n := strings.Count(l, "the agent restarted; following attempt 1 on"); n != 2 {
			t.Errorf("rank %d's log says %d time(s) that it was followed on after the agent restarted, want 2", rank, n)
		}
		if !strings.Contains(l, "rank "+strconv.Itoa(rank)+" of 2: slurm job "+jobID) {
			t.Errorf("rank %d's log does not name slurm job %s", rank, jobID)
		}
		// The link step's result was read by the agent that followed the
		// rank on: the first kill came before it.
		followed, measured := strings.Index(l, "the agent restarted; following attempt 1 on"), strings.Index(l, "link measured by the gang's job on this node")
		if measured < 0 || followed < 0 || measured < followed {
			t.Errorf("rank %d's log: the link read at byte %d, the first follow-on at %d; want the link read by the agent restarted before the step's result", rank, measured, followed)
		}
	}
	for rank, r := range upstack.RankLinks(t, ctx, rc, run.Id) {
		if r.Link == nil || r.Link.Error != "" || !(r.Link.BusBWGbps > 0) || r.Link.Ranks != 2 {
			t.Errorf("rank %d's signed report (%s): link %+v; want the figure the gang's job measured, read after the agent restarted", rank, r.AllocID, r.Link)
		}
	}
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
	if err != nil {
		t.Fatal(err)
	}
	count := map[int64]int{}
	var worst float64
	for _, p := range mr.Msg.Points {
		count[p.Step]++
		if d := math.Abs(want[p.Step] - p.Values["loss"]); d > worst || math.IsNaN(d) {
			worst = d
		}
	}
	t.Logf("2 ranks followed on across 2 kills of their agent: max |Δloss| %.3g over %d points against 1 rank", worst, len(mr.Msg.Points))
	for s := int64(1); s <= total; s++ {
		if count[s] != 1 {
			t.Errorf("metric point of step %d is there %d times, want once", s, count[s])
			break
		}
	}
	if !(worst <= 1e-5) {
		t.Errorf("max |Δloss| %g against 1 rank with the same global batch, want ≤ 1e-5", worst)
	}
}
