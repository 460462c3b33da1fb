//go:build e2e

package gange2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// runAsUID is the account TestE2ESlurmGangRunAs makes for the agent's
// run-as user: apart from package slurm's range (281000-281003), whose
// test binary may run at the same time.
const runAsUID = 281100

var userID = regexp.MustCompile(`\bUserId=(\S+)\((\d+)\)`)

// TestE2ESlurmGangRunAs (issue #34) is a gang under `gpupass up
// --executor slurm` whose agent runs every job as one run-as user
// (GPUPASS_RUN_AS, as `gpupass-agent --run-as` reads it): the one
// sbatch -N2 job is submitted as that uid and runs both ranks' tasks as
// it, in each rank's work dir handed to it; both ranks train, both
// signed reports carry the link the job measured, and the loss is one
// rank's. Cancel scancels the job, ending both ranks' processes, which
// ran as that uid.
func TestE2ESlurmGangRunAs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	c := slurmtest.Shared(t)
	slurmtest.RunAccounts(t, c, runAsUID, 1)
	user := slurmtest.AccountName(runAsUID)
	g := startGang(t, ctx, "GPUPASS_RUN_AS="+user)
	py, stack, rc, gp := g.py, g.stack, g.rc, g.gp
	_, want := upstack.ReferenceCurve(t, ctx, py, stack.Root, steps)

	t.Run("the gang's one job runs both ranks as the run-as user", func(t *testing.T) {
		out, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", "runas", "--follow", "--", py, "train_ddp.py", "--steps", strconv.Itoa(steps), "--timeout", "60").CombinedOutput()
		run := upstack.RunNamed(ctx, rc, "runas")
		if err != nil || run == nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
		}
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %s %s (%s), rank 1 %s (%s): want both succeeded", run.Id, run.State, run.Reason, rank1.State, rank1.Reason)
		}
		job := run.GetSlurm().GetJobId()
		if job == "" || rank1.GetSlurm().GetJobId() != job || run.GetSlurm().GetNode() == rank1.GetSlurm().GetNode() {
			t.Fatalf("slurm placement of rank 0 %v, rank 1 %v: want one job, two nodes", run.GetSlurm(), rank1.GetSlurm())
		}
		// slurmctld keeps an ended job for MinJobAge (600 s here).
		show := c.Command(t, "scontrol", "show", "job", "-o", job)
		m := userID.FindStringSubmatch(show)
		if m == nil || m[1] != user || m[2] != strconv.Itoa(runAsUID) {
			t.Errorf("scontrol show job %s: %s; want UserId=%s(%d)", job, show, user, runAsUID)
		}
		// The job's stderr file (rank 0's) was created by slurmd as the
		// job's user, in the dir the agent handed to it.
		if errFile := regexp.MustCompile(`\bStdErr=(\S+)`).FindStringSubmatch(show); errFile == nil {
			t.Errorf("no StdErr in %s", show)
		} else if fi, err := os.Lstat(errFile[1]); err != nil || fi.Sys().(*syscall.Stat_t).Uid != runAsUID {
			t.Errorf("the job's stderr file %s: %v, want a file of uid %d", errFile[1], err, runAsUID)
		}
		log0, _ := upstack.RunLog(t, ctx, rc, run.Id)
		log1, _ := upstack.RunLog(t, ctx, rc, rank1.Id)
		for _, w := range []struct {
			log, line string
			n         int
		}{
			{log0, `"rank 0/2 (local rank 0, node 0)`, 1},
			{log0, `"step 50 loss`, 1},
			{log0, `"done in`, 1},
			{log1, `"rank 1/2 (local rank 0, node 1)`, 1},
			{log1, `"rank 0/2`, 0},
		} {
			if got := strings.Count(w.log, w.line); got != w.n {
				t.Errorf("%q %d time(s) in a rank's log, want %d:\n%s", w.line, got, w.n, upstack.Tail(w.log, 2000))
			}
		}
		links := upstack.RankLinks(t, ctx, rc, run.Id)
		if len(links) != 2 {
			t.Fatalf("%d rank report(s), want 2", len(links))
		}
		for rank, r := range links {
			l := r.Link
			if l == nil {
				t.Errorf("rank %d's signed report (%s) records no link", rank, r.AllocID)
				continue
			}
			t.Logf("rank %d (%s): %g Gbit/s bus bandwidth over %s at %s, declared %g, error %q", rank, r.AllocID, l.BusBWGbps, l.Backend, l.MasterAddr, l.DeclaredGbps, l.Error)
			if l.Error != "" || !(l.BusBWGbps > 0) || l.Backend != "gloo" || l.Ranks != 2 || l.Simulated || !r.Simulated {
				t.Errorf("rank %d's link: %+v (report simulated %v); want measured by gloo across 2 ranks by the job", rank, *l, r.Simulated)
			}
		}
		if links[0].Link != nil && links[1].Link != nil && links[0].Link.BusBWGbps != links[1].Link.BusBWGbps {
			t.Errorf("rank 0 measured %g Gbit/s, rank 1 %g: every rank signs the slowest rank's time", links[0].Link.BusBWGbps, links[1].Link.BusBWGbps)
		}
		got, points := upstack.Loss(t, ctx, rc, run.Id)
		worst := upstack.MaxDelta(want, got)
		t.Logf("2 ranks as %s on %s and %s: max |Δloss| %.3g over %d steps against 1 rank", user, run.NodeId, rank1.NodeId, worst, len(got))
		if len(got) != steps || points != steps || !(worst <= 1e-5) {
			t.Errorf("2 ranks: %d of %d steps (%d points), max |Δloss| %g against 1 rank; want every step once, within 1e-5", len(got), steps, points, worst)
		}
		t.Logf("audit verify:\n%s", upstack.Tail(stack.CheckAudit(t, ctx, run.Id, "rank-1"), 1500))
	})

	t.Run("cancel scancels the run-as user's job and ends both ranks", func(t *testing.T) {
		if b, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", "runas-cancelled", "--", py, "train_ddp.py", "--steps", "100000000", "--timeout", "60").CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		run := upstack.WaitRun(t, ctx, rc, "runas-cancelled", "both ranks' processes", func(r *gpupassv1.Run) bool {
			if upstack.Terminal(r) {
				t.Fatalf("run %s ended before both ranks trained: %s (%s)", r.Id, r.State, r.Reason)
			}
			return r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && upstack.JobProcess(r.Id, "train_ddp.py") > 0 &&
				upstack.JobProcess(r.Id+"-r1", "train_ddp.py") > 0
		})
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			if uid, err := processUID(upstack.JobProcess(id, "train_ddp.py")); err != nil || uid != runAsUID {
				t.Errorf("%s's training process runs as uid %d (%v), want %d", id, uid, err, runAsUID)
			}
		}
		if q := strings.TrimSpace(c.Command(t, "squeue", "-h", "-o", "%u %i", "-n", "gpupass-"+run.Id)); !strings.HasPrefix(q, user+" ") {
			t.Errorf("squeue: %q, want the job of %s", q, user)
		}
		if b, err := gp("cancel", run.Id).CombinedOutput(); err != nil {
			t.Fatalf("cancel: %v\n%s", err, b)
		}
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			if r := upstack.WaitEnd(t, ctx, rc, id); r.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
				t.Errorf("%s after cancel: %s (%s), want cancelled", id, r.State, r.Reason)
			}
		}
		noJob(t, c, run.Id, "cancel")
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			if pid := upstack.JobProcess(id, "train_ddp.py"); pid > 0 {
				t.Errorf("%s's process %d still runs after cancel", id, pid)
			}
		}
	})
}

// processUID is the real uid of process pid.
func processUID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1, err
	}
	m := regexp.MustCompile(`(?m)^Uid:\s+(\d+)`).FindSubmatch(b)
	if m == nil {
		return -1, fmt.Errorf("no Uid line in /proc/%d/status", pid)
	}
	return strconv.Atoi(string(m[1]))
}
