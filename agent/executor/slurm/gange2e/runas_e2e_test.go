//go:build e2e

package gange2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
// (GPUPASS_RUN_AS, as `gpupass-agent --run-as` reads it): the gang's
// subtests of runAsGang, with that user as the only one a job may run as.
func TestE2ESlurmGangRunAs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	c := slurmtest.Shared(t)
	slurmtest.RunAccounts(t, c, runAsUID, 1)
	g := startGang(t, ctx, "GPUPASS_RUN_AS="+slurmtest.AccountName(runAsUID))
	runAsGang(t, ctx, g, []int{runAsUID}, "runas")
}

// runAsRangeFirst is the first of the two accounts of
// TestE2ESlurmGangRunAsRange's run-as uid range.
const runAsRangeFirst = 281110

// TestE2ESlurmGangRunAsRange (issue #34) is a gang under an agent that
// gives each run a uid of its own (GPUPASS_RUN_AS_RANGE, as
// `gpupass-agent --run-as-range` reads it, the setting the docs
// recommend): the ranks of one gang, which one batch job runs as one
// uid, share one uid of the range, so the gang trains, restarts,
// is followed on after a kill -9 of the agent (which claims the uid back
// for both ranks) and is cancelled as under one run-as user (runAsGang);
// the uid is held while the gang runs and given back once both ranks
// ended, never before, and the agent never reports a uid it could not
// give back.
func TestE2ESlurmGangRunAsRange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	c := slurmtest.Shared(t)
	rng := slurmtest.RunAccounts(t, c, runAsRangeFirst, 2)
	g := startGang(t, ctx, "GPUPASS_RUN_AS_RANGE="+rng)
	runAsGang(t, ctx, g, []int{runAsRangeFirst, runAsRangeFirst + 1}, "range")
	locks, _ := filepath.Glob(filepath.Join(g.stack.State, "slurm-ledger", "uid-*.lock"))
	if len(locks) == 0 {
		t.Fatalf("no uid lock in %s: the agent claimed no uid of its range", filepath.Join(g.stack.State, "slurm-ledger"))
	}
	// The broker has every rank's end before the agent gives the uid
	// back: its last rank cancels the uid's jobs and waits for them to
	// end first (up to slurm.SweepWait, a minute).
	for _, l := range locks {
		var held bool
		var err error
		start := time.Now()
		for held, err = flockHeld(l); err == nil && held && time.Since(start) < 90*time.Second; held, err = flockHeld(l) {
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || held {
			t.Errorf("%s %s after every run ended: held %v (%v); want every uid given back", l, time.Since(start).Round(time.Second), held, err)
		}
	}
	// up writes each agent's log to a file of its own, not to its output.
	logs, _ := filepath.Glob(filepath.Join(g.stack.State, "logs", "agent-*.log"))
	if len(logs) == 0 {
		t.Fatalf("no agent log in %s", filepath.Join(g.stack.State, "logs"))
	}
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"giving the run's uid back", "not reused", "taking the run's uid back"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s says %q:\n%s", filepath.Base(f), bad, upstack.Tail(string(b), 3000))
			}
		}
	}
}

// flockHeld says whether another process holds path's flock (a uid a run
// of the agent holds: slurm.UIDGuard.Claim).
func flockHeld(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return true, nil
		}
		return false, err
	}
	return false, nil
}

// runAsGang is the gang under an agent whose jobs run as other users
// than its own (uids: the ones a job may run as): the one sbatch -N2 job
// is submitted as one of them and runs both ranks' tasks as it, in each
// rank's work dir handed to it; both ranks train, both signed reports
// carry the link the job measured, and the loss is one rank's. A rank
// killed with a restart left restarts the gang from the checkpoints the
// job wrote as that uid. An agent killed -9 mid-run and started again by
// up follows the job on from its ledger; cancel scancels the job, ending
// both ranks' processes, which ran as one uid of uids. name prefixes the
// runs' names.
func runAsGang(t *testing.T, ctx context.Context, g *gangStack, uids []int, name string) {
	py, stack, rc, gp, c := g.py, g.stack, g.rc, g.gp, g.c
	_, want := upstack.ReferenceCurve(t, ctx, py, stack.Root, steps)
	allowed := func(uid int) bool { return slices.Contains(uids, uid) }

	t.Run("the gang's one job runs both ranks as one run-as user", func(t *testing.T) {
		run, rank1 := g.trainGang(t, ctx, name)
		job := run.GetSlurm().GetJobId()
		if job == "" || rank1.GetSlurm().GetJobId() != job || run.GetSlurm().GetNode() == rank1.GetSlurm().GetNode() {
			t.Fatalf("slurm placement of rank 0 %v, rank 1 %v: want one job, two nodes", run.GetSlurm(), rank1.GetSlurm())
		}
		// slurmctld keeps an ended job for MinJobAge (600 s here).
		show := c.Command(t, "scontrol", "show", "job", "-o", job)
		m := userID.FindStringSubmatch(show)
		uid := -1
		if m != nil {
			uid, _ = strconv.Atoi(m[2])
		}
		if m == nil || !allowed(uid) || m[1] != slurmtest.AccountName(uid) {
			t.Fatalf("scontrol show job %s: %s; want the UserId of one of uids %v", job, show, uids)
		}
		// The job's stderr file (rank 0's) was created by slurmd as the
		// job's user, in the dir the agent handed to it.
		if errFile := regexp.MustCompile(`\bStdErr=(\S+)`).FindStringSubmatch(show); errFile == nil {
			t.Errorf("no StdErr in %s", show)
		} else if fi, err := os.Lstat(errFile[1]); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
			t.Errorf("the job's stderr file %s: %v, want a file of uid %d", errFile[1], err, uid)
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
			if l.Error != "" || !(l.BusBWGbps > 0) || l.Backend != "gloo" || l.Ranks != 2 || l.Simulated || !r.Simulated || !l.InCommand {
				t.Errorf("rank %d's link: %+v (report simulated %v); want measured by gloo across 2 ranks by the job's own Python", rank, *l, r.Simulated)
			}
		}
		if links[0].Link != nil && links[1].Link != nil && links[0].Link.BusBWGbps != links[1].Link.BusBWGbps {
			t.Errorf("rank 0 measured %g Gbit/s, rank 1 %g: every rank signs the slowest rank's time", links[0].Link.BusBWGbps, links[1].Link.BusBWGbps)
		}
		got, points := upstack.Loss(t, ctx, rc, run.Id)
		worst := upstack.MaxDelta(want, got)
		t.Logf("2 ranks as uid %d on %s and %s: max |Δloss| %.3g over %d steps against 1 rank", uid, run.NodeId, rank1.NodeId, worst, len(got))
		if len(got) != steps || points != steps || !(worst <= 1e-5) {
			t.Errorf("2 ranks: %d of %d steps (%d points), max |Δloss| %g against 1 rank; want every step once, within 1e-5", len(got), steps, points, worst)
		}
		t.Logf("audit verify:\n%s", upstack.Tail(stack.CheckAudit(t, ctx, run.Id, "rank-1"), 1500))
	})

	gangRestart(t, ctx, g, name+"-restarted")

	t.Run("the run-as user's job is followed on after a kill -9 of the agent", func(t *testing.T) {
		const total = 150
		if b, err := gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", name+"-agentkill", "--", py, "train_ddp.py", "--steps", strconv.Itoa(total), "--step-sleep", "0.1",
			"--log-steps", "--timeout", "60").CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, b)
		}
		run := upstack.WaitRun(t, ctx, rc, name+"-agentkill", "rank 0 past step 30", func(r *gpupassv1.Run) bool {
			if upstack.Terminal(r) {
				t.Fatalf("run %s ended before step 30: %s (%s)", r.Id, r.State, r.Reason)
			}
			return upstack.StepAtLeast(ctx, rc, r.Id, 30)
		})
		jobOf := func() string {
			return strings.TrimSpace(c.Command(t, "squeue", "-h", "-n", "gpupass-"+run.Id, "-o", "%i %U"))
		}
		before := jobOf()
		pids := stack.Config(t).AgentPIDs
		if _, uid, _ := strings.Cut(before, " "); len(pids) != 1 || !allowed(atoi(uid)) {
			t.Fatalf("agents %v, squeue %q: want the one Slurm agent and the gang's one job of one of uids %v", pids, before, uids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 the Slurm agent (pid %d): %v", pids[0], err)
		}
		upstack.WaitFor(t, ctx, "gpupass up to start the agent again", func() bool {
			p := stack.Config(t).AgentPIDs
			return len(p) == 1 && p[0] != pids[0]
		})
		if after := jobOf(); after != before {
			t.Fatalf("after the agent's restart squeue shows %q for the gang, want %q running on", after, before)
		}
		run = upstack.WaitEnd(t, ctx, rc, run.Id)
		rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
		if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 0 {
			t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded, followed on without a restart",
				run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts)
		}
		// RunLog fails on a record lost or repeated across the restart.
		for rank, id := range []string{run.Id, rank1.Id} {
			l, _ := upstack.RunLog(t, ctx, rc, id)
			if n := strings.Count(l, "the agent restarted; following attempt 1 on"); n != 1 {
				t.Errorf("rank %d's log says %d time(s) that it was followed on, want once:\n%s", rank, n, upstack.Tail(l, 2000))
			}
			var bad []string
			for step := 1; step <= total; step++ {
				if n := strings.Count(l, fmt.Sprintf(`"msg":"rank %d step %d loss`, rank, step)); n != 1 {
					bad = append(bad, fmt.Sprintf("step %d ×%d", step, n))
				}
			}
			if len(bad) > 0 {
				t.Errorf("rank %d's log: %d of %d steps not there exactly once across the agent's restart: %s", rank, len(bad), total, strings.Join(bad[:min(len(bad), 12)], ", "))
			}
		}
		if got, points := upstack.Loss(t, ctx, rc, run.Id); len(got) != total || points != total {
			t.Errorf("followed-on gang: %d of %d steps (%d points), want every step once", len(got), total, points)
		}
	})

	gangCancel(t, ctx, g, name+"-cancelled", func(t *testing.T, run *gpupassv1.Run) {
		var ran []int
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			uid, err := processUID(upstack.JobProcess(id, "train_ddp.py"))
			if err != nil || !allowed(uid) {
				t.Errorf("%s's training process runs as uid %d (%v), want one of %v", id, uid, err, uids)
			}
			ran = append(ran, uid)
		}
		if ran[0] != ran[1] {
			t.Errorf("the ranks' training processes run as uids %v, want one", ran)
		}
		// Each rank trains in its own work dir, handed to that uid.
		for _, id := range []string{run.Id, run.Id + "-r1"} {
			cwd := fmt.Sprintf("/proc/%d/cwd", upstack.JobProcess(id, "train_ddp.py"))
			dir, _ := os.Readlink(cwd)
			if fi, err := os.Stat(cwd); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(ran[0]) || !strings.HasSuffix(dir, "/"+id) {
				t.Errorf("%s's training process works in %q (%v); want its own work dir, of uid %d", id, dir, err, ran[0])
			}
		}
		q := strings.TrimSpace(c.Command(t, "squeue", "-h", "-o", "%U %i", "-n", "gpupass-"+run.Id))
		if uid, _, _ := strings.Cut(q, " "); atoi(uid) != ran[0] {
			t.Errorf("squeue: %q, want the job of uid %d", q, ran[0])
		}
		// With a uid range, the uid's claim is held while the gang runs.
		if len(uids) > 1 {
			lock := filepath.Join(stack.State, "slurm-ledger", fmt.Sprintf("uid-%d.lock", ran[0]))
			if held, err := flockHeld(lock); err != nil || !held {
				t.Errorf("%s while the gang runs: held %v (%v); want held", lock, held, err)
			}
		}
	})
}

// atoi is s as a number, -1 when it is none.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
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
