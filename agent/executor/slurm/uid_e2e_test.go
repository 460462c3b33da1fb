//go:build e2e

package slurm_test

import (
	"context"
	"fmt"
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
	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// uidFirst..uidFirst+uidCount-1 is the test's --run-as-range: uids no
// account of this machine has (checked), made accounts for the test only
// (slurmtest.RunAccounts).
const (
	uidFirst = 281000
	uidCount = 4
)

// TestE2ESlurmRunUIDs drives the real binaries on the real cluster with
// --run-as-range: two runs live at once on the agent's two nodes, each
// submitted as a uid of its own (sbatch --uid). Run A's job knows run B's
// allocation and tries what a job of one shared account could do: append
// to B's output and metrics, scancel B's job; and it sbatch-es a job of
// its own that must not outlive it. Every attempt must fail, B must end
// succeeded with only its own loss, and A's log must show the refusals.
func TestE2ESlurmRunUIDs(t *testing.T) {
	c := slurmtest.Shared(t)
	upstack.RequireTorch(t)
	rng := slurmtest.RunAccounts(t, c, uidFirst, uidCount)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Env: []string{"SLURM_CONF=" + c.Conf}})
	cfg := stack.Config(t)
	rc, err := brokerclient.DialRuns(cfg.BrokerURL, brokerclient.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop := exec.Command("scancel", "--name", "uid-stray-e2e")
		stop.Env = c.Env()
		_ = stop.Run()
	})
	// n2 simulates an h100 profile with the 2 GPUs its GRES has (as in
	// TestE2ESlurmCluster): B runs there with an h100 spec while A runs
	// on n1 with the a100 one.
	h100x2 := filepath.Join(t.TempDir(), "h100-sxm5-2x.json")
	prof, err := os.ReadFile(filepath.Join(stack.Root, "internal", "probe", "profiles", "h100-sxm5-8x.json"))
	if err != nil {
		t.Fatal(err)
	}
	prof = regexp.MustCompile(`"count": *8`).ReplaceAll(prof, []byte(`"count": 2`))
	prof = regexp.MustCompile(`"name": *"h100-sxm5-8x"`).ReplaceAll(prof, []byte(`"name": "h100-sxm5-2x"`))
	if err := os.WriteFile(h100x2, prof, 0o644); err != nil {
		t.Fatal(err)
	}
	h100Spec := filepath.Join(t.TempDir(), "gpupass.yaml")
	b, err := os.ReadFile(filepath.Join(stack.Root, "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h100Spec, []byte(strings.Replace(string(b), "accelerator: a100-80gb", "accelerator: h100-sxm5", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--executor", "slurm", "--slurm-partition", slurmtest.Partition, "--slurm-shared-dir", c.Shared,
		"--slurm-simulate", "n2=" + h100x2, "--slurm-refresh", "10m", "--suite-interval", "2s"}
	if os.Getenv("GPUPASS_E2E_SHARED_ACCOUNT") == "" {
		args = append(args, "--run-as-range", rng)
	} else {
		// Both runs as the agent's one account, as before the range:
		// the test must fail so.
		t.Log("GPUPASS_E2E_SHARED_ACCOUNT set: no --run-as-range")
	}
	login := stack.StartAgent(t, "slurm-uids", "hpc-eu", args...)
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	for _, spec := range []string{"examples/train/gpupass.yaml", h100Spec} {
		upstack.WaitFor(t, ctx, "a node certified for "+spec, func() bool {
			out, _ := gp("validate", "--spec", spec, "--dry-run", "--region", "hpc-eu").CombinedOutput()
			return strings.Contains(string(out), "1 candidate(s)")
		})
	}
	train := func(t *testing.T, spec, name, script string) string {
		t.Helper()
		out, err := gp("--output", "json", "train", "--spec", spec, "--region", "hpc-eu", "--name", name, "--", "sh", "-c", script).Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		if id == "" {
			t.Fatalf("no allocation id in %s", out)
		}
		return id
	}
	getRun := func(t *testing.T, id string) *gpupassv1.Run {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Run
	}
	ended := func(t *testing.T, id string) *gpupassv1.Run {
		t.Helper()
		var r *gpupassv1.Run
		upstack.WaitFor(t, ctx, "run "+id+" to end", func() bool {
			r = getRun(t, id)
			return r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED ||
				r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
		})
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		upstack.WaitFor(t, wctx, "run "+id+"'s whole log at the broker", func() bool {
			r = getRun(t, id)
			return r.LogComplete || r.LogDisputed
		})
		return r
	}
	logOf := func(t *testing.T, id string) string {
		l, _ := upstack.RunLog(t, ctx, rc, id)
		return l
	}

	// B: a line, its loss, time for A to attack, another line.
	runB := train(t, h100Spec, "uid-victim", `echo "victim uid $(id -u) step $((0+1))"; echo '{"step": 1, "loss": 0.5}' >> "$GPUPASS_METRICS_FILE"; sleep 15; echo victim done`)
	// $((0+1)): the job's line, not the command the run's log also shows.
	upstack.WaitFor(t, ctx, "run B's job to run", func() bool { return strings.Contains(logOf(t, runB), " step 1") })
	runsOf := func(node string) string {
		return filepath.Join(c.Shared, "gpupass", slurmtest.ClusterName, node, "runs")
	}
	bDir := filepath.Join(runsOf("n2"), runB)

	// A, on n1: it knows B's dir and job name.
	// $no and $((0+1)): the job's lines, not the command the run's log
	// also shows, say what happened (and no "word: " prefix, which the
	// log takes for a component).
	attack := fmt.Sprintf(`export SLURM_CONF=%s; b=%s; no=refused; echo "attacker uid $(id -u)"
if echo "FORGED by run A" >> "$b/.slurm/attempt-1.out"; then echo "attack on B's output appended"; else echo "attack on B's output $no"; fi
if echo '{"step": 1000, "loss": 0.0001}' >> "$b/metrics.jsonl"; then echo "attack on B's metrics appended"; else echo "attack on B's metrics $no"; fi
j=$(squeue -h -n gpupass-%s -o %%i); echo "B's job: $j"
if [ -n "$j" ] && scancel "$j"; then echo "attack on B's job cancelled"; else echo "attack on B's job not cancelled, $no"; fi
s=$(sbatch --parsable --job-name uid-stray-e2e --output /dev/null --wrap 'sleep 300') && echo "attack on stray $s submitted"
echo "attacker finished $((0+1))"`, c.Conf, shellQuote(bDir), runB)
	runA := train(t, "examples/train/gpupass.yaml", "uid-attacker", attack)

	ra, rb := ended(t, runA), ended(t, runB)
	la, lb := logOf(t, runA), logOf(t, runB)
	t.Logf("run A %s: %s (%s)\n%s", runA, ra.State, ra.Reason, upstack.Tail(la, 2000))
	for _, want := range []string{"attack on B's output refused", "attack on B's metrics refused", "attack on B's job not cancelled, refused", "attacker finished 1"} {
		if !strings.Contains(la, want) {
			t.Errorf("run A's log lacks %q", want)
		}
	}
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: runB}))
	if err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for _, p := range mr.Msg.Points {
		if v, ok := p.Values["loss"]; ok {
			losses = append(losses, v)
		}
	}
	t.Logf("run B %s: %s (%s), complete %v, disputed %v, losses %v", runB, rb.State, rb.Reason, rb.LogComplete, rb.LogDisputed, losses)
	if strings.Contains(lb, "FORGED") || len(losses) != 1 || losses[0] != 0.5 {
		t.Errorf("run B's evidence holds what run A's job wrote (losses %v, want [0.5]):\n%s", losses, upstack.Tail(lb, 3000))
	}
	if rb.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || !rb.LogComplete || rb.LogDisputed || !strings.Contains(lb, "victim done") {
		t.Errorf("run B: %s (%s), complete %v, disputed %v; want succeeded, complete, undisputed, to its last line", rb.State, rb.Reason, rb.LogComplete, rb.LogDisputed)
	}
	uidA, uidB := regexp.MustCompile(`attacker uid ([0-9]+)`).FindStringSubmatch(la), regexp.MustCompile(`victim uid ([0-9]+)`).FindStringSubmatch(lb)
	if uidA == nil || uidB == nil || uidA[1] == uidB[1] {
		t.Errorf("runs A and B ran as uids %v and %v, want two different uids of %s", uidA, uidB, rng)
	} else {
		for _, u := range []string{uidA[1], uidB[1]} {
			if n, _ := strconv.Atoi(u); n < uidFirst || n >= uidFirst+uidCount {
				t.Errorf("a run ran as uid %s, outside %s", u, rng)
			}
		}
	}
	// Each run's files are its uid's, in a dir no other run may enter,
	// under dirs no run may write.
	for _, p := range []string{filepath.Join(bDir, ".slurm", "attempt-1.out"), filepath.Join(bDir, "metrics.jsonl")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Error(err)
		} else if uidB != nil && strconv.Itoa(int(st.Uid)) != uidB[1] {
			t.Errorf("%s belongs to uid %d, want run B's %s", p, st.Uid, uidB[1])
		}
	}
	for _, d := range []string{runsOf("n1"), runsOf("n2")} {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err != nil {
			t.Error(err)
		} else if st.Uid != 0 || st.Mode&0o022 != 0 {
			t.Errorf("%s: uid %d mode %04o, want root's and writable by no run", d, st.Uid, st.Mode&0o7777)
		}
	}
	// What A's job submitted did not outlive A.
	stray := c.Command(t, "squeue", "-h", "-t", "all", "-n", "uid-stray-e2e", "-o", "%i %T %U")
	t.Logf("A's stray once A ended: %q", stray)
	if !regexp.MustCompile(`attack on stray [0-9]+ submitted`).MatchString(la) {
		t.Errorf("run A's job could not submit its stray (the test proves nothing of its end):\n%s", upstack.Tail(la, 2000))
	}
	if strings.Contains(stray, "RUNNING") || strings.Contains(stray, "PENDING") {
		t.Errorf("the job run A's job submitted outlived run A: %q", stray)
	}

	if t.Failed() {
		return
	}

	// An agent killed under a run and started again follows it on as
	// the uid its job runs as, and does not kill the job (this test's
	// login node is its compute node too).
	runC := train(t, "examples/train/gpupass.yaml", "uid-reattach",
		`echo "run C uid $(id -u) step $((0+1))"; sleep 8; echo '{"step": 1, "loss": 0.25}' >> "$GPUPASS_METRICS_FILE"; echo "run C done uid $(id -u)"`)
	upstack.WaitFor(t, ctx, "run C's job to run", func() bool { return strings.Contains(logOf(t, runC), " step 1") })
	login.Kill9(t)
	time.Sleep(time.Second)
	login.Restart(t)
	rcr := ended(t, runC)
	lc := logOf(t, runC)
	uidC := regexp.MustCompile(`run C uid ([0-9]+)`).FindStringSubmatch(lc)
	t.Logf("run C %s: %s (%s)", runC, rcr.State, rcr.Reason)
	if rcr.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || uidC == nil || !strings.Contains(lc, "run C done uid "+uidC[1]) {
		t.Errorf("run C across an agent restart: %s (%s), want succeeded as one uid to its end:\n%s", rcr.State, rcr.Reason, upstack.Tail(lc, 3000))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(runsOf("n1"), runC, ".slurm", "attempt-1.out"), &st); err != nil || uidC == nil || strconv.Itoa(int(st.Uid)) != uidC[1] {
		t.Errorf("run C's output: uid %d (%v), want run C's uid %v", st.Uid, err, uidC)
	}
	if b, _ := os.ReadFile(login.Log); strings.Contains(string(b), "taking the run's uid back") {
		t.Errorf("the restarted agent could not take run C's uid back:\n%s", upstack.Tail(string(b), 3000))
	}
}
