//go:build e2e

package kubernetes_test

import (
	"bytes"
	"context"
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
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// restartSteps at restartSleep seconds a step keep the gang training
// long enough (20 s and more) for rank 1 to be killed after rank 0 has
// checkpointed (every 25 steps) and shipped the checkpoint.
const (
	restartSteps = 200
	restartSleep = "0.1"
)

// TestE2EKubernetesGangRestart (issue #34) is a gang that restarts whole
// on the local Kubernetes cluster, as local agents' and Slurm's do
// (TestGangRestart, TestE2ESlurmGang): examples/ddp across two pods with
// `--max-restarts 1`, rank 1's python killed -9 mid-run in its pod. The
// broker stops rank 0 and places the gang again; each rank's agent makes
// a fresh Job for it (a new pod for every rank), and both resume from
// rank 0's last shipped checkpoint, not step 0. The run succeeds after
// one restart; each rank's log is one gap-free, unrepeated sequence
// across both attempts, each attempt's steps come once and in order (the
// second's from the checkpoint on), and the curve (each step's last
// value) is one process's with the same global batch.
func TestE2EKubernetesGangRestart(t *testing.T) {
	c := k8stest.Require(t)
	py := upstack.RequireTorch(t)
	image, env, args := k8sUpRunImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := c.Namespace(t)
	const region = "k8s-restart"
	// As TestE2EKubernetesGang: a second agent stands for the one node.
	kube := []string{"--kube-namespace", ns, "--kube-refresh", "1m"}
	stack := upstack.Start(t, upstack.Options{Regions: []string{region}, Args: append(args, kube...), Env: []string{env}})
	stack.StartAgent(t, "k8s-second", region, append([]string{"--executor", "kubernetes", "--stack-dir", stack.State,
		"--kube-image", image, "--job-ports", "29500-29599"}, kube...)...)
	rc := stack.Runs(t)
	diag := &gangDiag{c: c, ns: ns, rc: rc, stack: stack}
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	b, err := os.ReadFile(filepath.Join(stack.Root, "examples", "ddp", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sp := filepath.Join(t.TempDir(), "gpupass.yaml")
	if err := os.WriteFile(sp, bytes.Replace(b, []byte("size_gb: 10"), []byte("size_gb: 1"), 1), 0o644); err != nil {
		t.Fatal(err)
	}

	// The reference: one process, uninterrupted, the same global batch.
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

	gangLine := regexp.MustCompile(`2 × agt-[0-9a-f]+, agt-[0-9a-f]+ in ` + region)
	diag.wait(t, ctx, "a gang of the two agents' nodes in validate --dry-run", "", func() bool {
		out, _ := gp("validate", "--spec", sp, "--dry-run", "--region", region).CombinedOutput()
		return gangLine.Match(out)
	})
	if out, err := gp("train", "--spec", sp, "--region", region, "--workdir", "examples/ddp", "--name", "krestart", "--max-restarts", "1",
		"--", py, "train_ddp.py", "--steps", strconv.Itoa(restartSteps), "--step-sleep", restartSleep, "--timeout", rendezvousWait).CombinedOutput(); err != nil {
		t.Fatalf("train: %v\n%s", err, out)
	}
	resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var run *gpupassv1.Run
	for _, r := range resp.Msg.Runs {
		if strings.HasPrefix(r.Name, "krestart-") {
			run = r
		}
	}
	if run == nil {
		t.Fatal("the run is not listed after train printed it")
	}
	gang := "gpupass.dev/gang=" + run.Id
	lastStep := func() int64 {
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
		if err != nil || len(mr.Msg.Points) == 0 {
			return 0
		}
		return mr.Msg.Points[len(mr.Msg.Points)-1].Step
	}
	diag.whileRuns(t, ctx, "rank 0 past step 60 (its checkpoint of step 50 shipped)", run.Id, func() bool { return lastStep() >= 60 })
	// The first attempt's pods, by rank.
	pods := func() map[string]string {
		out, _ := c.KubectlCmd(ctx, "-n", ns, "get", "pods", "-l", gang, "-o",
			`jsonpath={range .items[*]}{.metadata.uid} {.metadata.labels.gpupass\.dev/rank} {.status.phase}{"\n"}{end}`).Output()
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) == 3 {
				m[f[0]] = f[1] + " " + f[2]
			}
		}
		return m
	}
	first := pods()
	pid := jobProcess(run.Id+"-r1", "train_ddp.py")
	if pid == 0 {
		t.Fatalf("no train_ddp.py of rank 1 (%s-r1) to kill\n%s", run.Id, diag.dump(run.Id))
	}
	killedAt := lastStep()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	t.Logf("killed rank 1's python (pid %d) with rank 0 at step %d; the first attempt's pods: %v", pid, killedAt, first)
	diag.wait(t, ctx, "the run to end", run.Id, func() bool {
		run = upstack.GetRun(t, ctx, rc, run.Id)
		return ended(run)
	})
	rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
	t.Logf("run %s after %d restart(s): %s; rank 1 %s", run.State, run.Restarts, run.Reason, rank1.State)
	if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || run.Restarts != 1 {
		t.Fatalf("run %s (%s), rank 1 %s (%s), %d restart(s): want both succeeded after 1 restart\n%s",
			run.State, run.Reason, rank1.State, rank1.Reason, run.Restarts, diag.dump(run.Id))
	}

	// Every rank's pod was replaced: each rank has a pod of its own that
	// succeeded and is not one of the first attempt's.
	second := pods()
	for _, rank := range []string{"0", "1"} {
		fresh := false
		for uid, v := range second {
			if _, old := first[uid]; !old && v == rank+" Succeeded" {
				fresh = true
			}
		}
		if !fresh {
			t.Errorf("rank %s has no new pod that succeeded: first attempt's pods %v, now %v", rank, first, second)
		}
	}

	// Each rank's log: every record once (RunLog fails on a gap or a
	// repeat), all of it at the broker, the restart marked, and the
	// second attempt resumed from the checkpoint, not from step 0.
	resumed := regexp.MustCompile(`"msg":"rank (\d) resumed from [^"]* at step (\d+)"`)
	var from int64
	for rank, id := range []string{run.Id, rank1.Id} {
		text, n := upstack.RunLog(t, ctx, rc, id)
		r := upstack.GetRun(t, ctx, rc, id)
		if n != r.LastSeq || !r.LogComplete {
			t.Errorf("rank %d: %d records read, last seq %d, log complete %v: want every record once", rank, n, r.LastSeq, r.LogComplete)
		}
		if !strings.Contains(text, "the gang restarted: every rank resumes from rank 0's last shipped checkpoint") {
			t.Errorf("rank %d's log does not mark the gang's restart:\n%s", rank, upstack.Tail(text, 3000))
		}
		m := resumed.FindAllStringSubmatch(text, -1)
		if len(m) != 1 || m[0][1] != strconv.Itoa(rank) {
			t.Errorf("rank %d's log resumed %d time(s) (%q), want once:\n%s", rank, len(m), m, upstack.Tail(text, 3000))
			continue
		}
		step, _ := strconv.ParseInt(m[0][2], 10, 64)
		t.Logf("rank %d resumed at step %d", rank, step)
		if step <= 0 || step > killedAt {
			t.Errorf("rank %d resumed at step %d, want a checkpoint after step 0 and before the kill at step %d", rank, step, killedAt)
		}
		if rank == 0 {
			from = step
		} else if step != from {
			t.Errorf("rank 1 resumed at step %d, rank 0 at %d: want the same checkpoint", step, from)
		}
	}

	// Rank 0's metrics: one continuous curve, every step once: the
	// first attempt's steps after the checkpoint are replaced by the
	// second attempt's (events.Continuous), and each step's value is
	// the uninterrupted run's (below).
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	got := map[int64]float64{}
	for _, p := range mr.Msg.Points {
		steps = append(steps, p.Step)
		got[p.Step] = p.Values["loss"]
	}
	whole := len(steps) == restartSteps
	for i, st := range steps {
		whole = whole && st == int64(i+1)
	}
	if !whole {
		t.Errorf("rank 0's metric steps %v: want 1..%d, each once", steps, restartSteps)
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
}

// jobProcess is the pid of the process on this machine (a pod's
// container shares its kernel) whose environment is alloc's and whose
// command line holds arg; 0 if none.
func jobProcess(alloc, arg string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00GPUPASS_ALLOC_ID="+alloc+"\x00")) {
			continue
		}
		if cmd, _ := os.ReadFile(filepath.Join(d, "cmdline")); bytes.Contains(cmd, []byte(arg)) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}
