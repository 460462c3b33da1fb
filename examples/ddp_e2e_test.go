//go:build e2e

package examples_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
)

func TestMain(m *testing.M) { os.Exit(slurmtest.Run(m)) }

// ddpSteps keeps each run to a few seconds of training on a shared
// 2-core machine; the curve still falls by two orders of magnitude.
const ddpSteps = 60

// torchPython is Debian's interpreter with python3-torch (the first
// python3 on PATH may lack it).
func torchPython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testutil.Missing(t, "%s (python3-torch)", py)
	}
	if out, err := exec.Command(py, "-c", "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()").CombinedOutput(); err != nil {
		testutil.Missing(t, "torch.distributed with gloo in %s: %v: %s", py, err, out)
	}
	return py
}

func ddpScript(t *testing.T) string {
	return filepath.Join(testutil.RepoRoot(t), "examples", "ddp", "train_ddp.py")
}

// loss reads a metrics file as the agent's metrics watch and compare do.
func loss(t *testing.T, path string) []float64 {
	t.Helper()
	s, err := metrics.ReadFile(path, metrics.Options{})
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	v := make([]float64, len(s.Points))
	for i, p := range s.Points {
		if p.Step != int64(i+1) {
			t.Fatalf("%s: point %d is step %d, want %d", path, i, p.Step, i+1)
		}
		v[i] = p.Value
	}
	return v
}

// sameCurve fails the test unless got has ddpSteps points, each within
// 1e-5 of want's, and says the largest difference.
func sameCurve(t *testing.T, what string, want, got []float64) {
	t.Helper()
	if len(want) != ddpSteps || len(got) != ddpSteps {
		t.Fatalf("%s: %d and %d points, want %d each", what, len(want), len(got), ddpSteps)
	}
	var worst float64
	for i := range want {
		if d := math.Abs(want[i] - got[i]); d > worst || math.IsNaN(d) {
			worst = d
		}
	}
	t.Logf("%s: max |Δloss| %.3g over %d steps (1 rank: %.6f → %.6f)", what, worst, ddpSteps, want[0], want[ddpSteps-1])
	if !(worst <= 1e-5) {
		t.Errorf("%s: max |Δloss| %g against 1 rank with the same global batch, want ≤ 1e-5", what, worst)
	}
	if !(want[ddpSteps-1] < want[0]/10) {
		t.Errorf("1 rank did not learn: loss %g → %g", want[0], want[ddpSteps-1])
	}
}

var (
	oneRankOnce sync.Once
	oneRank     []float64
	oneRankErr  string
)

// single is the reference: one process, no rendezvous, global batch 64.
func single(t *testing.T, py string) []float64 {
	t.Helper()
	oneRankOnce.Do(func() {
		dir := t.TempDir()
		m := filepath.Join(dir, "metrics.jsonl")
		cmd := exec.Command(py, ddpScript(t), "--steps", strconv.Itoa(ddpSteps))
		cmd.Env = append(os.Environ(), "GPUPASS_METRICS_FILE="+m)
		if out, err := cmd.CombinedOutput(); err != nil {
			oneRankErr = fmt.Sprintf("1 rank: %v\n%s", err, out)
			return
		}
		oneRank = loss(t, m)
	})
	if oneRankErr != "" {
		t.Fatal(oneRankErr)
	}
	return oneRank
}

func command(ctx context.Context, py string, t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, py, append([]string{ddpScript(t), "--steps", strconv.Itoa(ddpSteps), "--timeout", "30"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// TestDDPTorchrun: `python3 -m torch.distributed.run` with 2 ranks over
// loopback (gloo) gives the loss curve of 1 rank with the same global
// batch; only rank 0 writes metrics.
func TestDDPTorchrun(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	want := single(t, py)
	m := filepath.Join(t.TempDir(), "metrics.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Debian's torchrun 1.13 crashes on Python 3.11 without --redirects
	// and --tee (the README says so too).
	cmd := exec.CommandContext(ctx, py, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
		"--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(testutil.FreePort(t)),
		ddpScript(t), "--steps", strconv.Itoa(ddpSteps))
	cmd.Env = append(os.Environ(), "GPUPASS_METRICS_FILE="+m)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torchrun: %v\n%s", err, out)
	}
	for _, r := range []string{"rank 0/2", "rank 1/2"} {
		if !strings.Contains(string(out), "ddp: "+r) {
			t.Errorf("no first line from %s:\n%s", r, out)
		}
	}
	sameCurve(t, "torchrun, 2 ranks", want, loss(t, m))
}

// TestDDPTorchrunFromGangEnv: with nothing but the environment a
// launcher per node gets from the rendezvous (rendezvous.Gang.Node: the
// PET_* defaults of torchrun's flags), `python3 -m torch.distributed.run
// train_ddp.py` on two simulated nodes runs one gang of 4 ranks.
func TestDDPTorchrunFromGangEnv(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	want := single(t, py)
	dir := t.TempDir()
	port := testutil.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := make([]error, 2)
	outs := make([][]byte, 2)
	var wg sync.WaitGroup
	for node := 0; node < 2; node++ {
		env, err := rendezvous.Gang{NodeRank: node, Nodes: 2, LocalRanks: 2, MasterAddr: "127.0.0.1", MasterPort: port}.Node()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, py, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
			ddpScript(t), "--steps", strconv.Itoa(ddpSteps))
		cmd.Env = append(append(os.Environ(), env...), "GPUPASS_METRICS_FILE="+filepath.Join(dir, fmt.Sprintf("node%d.jsonl", node)))
		wg.Add(1)
		go func(node int) {
			defer wg.Done()
			outs[node], errs[node] = cmd.CombinedOutput()
		}(node)
	}
	wg.Wait()
	for node, err := range errs {
		if err != nil {
			t.Fatalf("torchrun on node %d: %v\n%s", node, err, outs[node])
		}
	}
	if !strings.Contains(string(outs[1]), "ddp: rank 3/4 (local rank 1, node 1)") {
		t.Errorf("node 1 did not start global rank 3:\n%s", outs[1])
	}
	if _, err := os.Stat(filepath.Join(dir, "node1.jsonl")); err == nil {
		t.Error("node 1 wrote metrics: only rank 0 should")
	}
	sameCurve(t, "torchrun from the gang's env, 2 nodes × 2 ranks", want, loss(t, filepath.Join(dir, "node0.jsonl")))
}

// startRanks starts the ranks of a 2-node gang as plain processes, each
// with the environment rendezvous.Gang.Rank gives it (what an executor
// that starts every rank sets), and returns their commands.
func startRanks(t *testing.T, ctx context.Context, py string, extraEnv []string, args ...string) []*exec.Cmd {
	t.Helper()
	port := testutil.FreePort(t)
	var cmds []*exec.Cmd
	for node := 0; node < 2; node++ {
		env, err := rendezvous.Gang{NodeRank: node, Nodes: 2, LocalRanks: 1, MasterAddr: "127.0.0.1", MasterPort: port}.Rank(0)
		if err != nil {
			t.Fatal(err)
		}
		cmd := command(ctx, py, t, append(env, extraEnv...), args...)
		cmd.Stdout = &testutil.Buffer{}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

// TestDDPEnvProcesses: two plain processes with init_process_group
// ("env://") and the rendezvous package's variables, no torchrun.
func TestDDPEnvProcesses(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	want := single(t, py)
	m := filepath.Join(t.TempDir(), "metrics.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, cmd := range startRanks(t, ctx, py, []string{"GPUPASS_METRICS_FILE=" + m}) {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d: %v\n%s", i, err, cmd.Stdout)
		}
	}
	sameCurve(t, "env://, 2 processes", want, loss(t, m))
}

// TestDDPResume: 2 ranks stop at a NaN at step 40 (every rank sees it
// and exits 3, as gpupass's NaN guard expects); started again with
// GPUPASS_RESUME_FROM at the step-25 checkpoint rank 0 wrote, they
// continue on 1 rank's curve from step 26 to the end.
func TestDDPResume(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	want := single(t, py)
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "checkpoints")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := filepath.Join(dir, "first.jsonl")
	for i, cmd := range startRanks(t, ctx, py, []string{"GPUPASS_METRICS_FILE=" + first, "GPUPASS_CHECKPOINT_DIR=" + ckpt}, "--nan-at-step", "40") {
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("rank %d at a NaN: %v, want exit status 3\n%s", i, err, cmd.Stdout)
		}
	}
	s, err := metrics.ReadFile(first, metrics.Options{})
	if err != nil || len(s.Points) != 40 || !math.IsNaN(s.Points[39].Value) {
		t.Fatalf("first attempt's metrics: %v, %d points, want 40 ending in NaN", err, len(s.Points))
	}
	resume := filepath.Join(ckpt, "ckpt-00000025.pt")
	second := filepath.Join(dir, "second.jsonl")
	cmds := startRanks(t, ctx, py, []string{"GPUPASS_METRICS_FILE=" + second, "GPUPASS_CHECKPOINT_DIR=" + ckpt, "GPUPASS_RESUME_FROM=" + resume}, "--nan-at-step", "40")
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d resumed: %v\n%s", i, err, cmd.Stdout)
		}
		if !strings.Contains(cmd.Stdout.(*testutil.Buffer).String(), "resumed from "+resume+" at step 25") {
			t.Errorf("rank %d does not say it resumed:\n%s", i, cmd.Stdout)
		}
	}
	s, err = metrics.ReadFile(second, metrics.Options{})
	if err != nil || len(s.Points) != ddpSteps-25 {
		t.Fatalf("resumed metrics: %v, %d points, want %d", err, len(s.Points), ddpSteps-25)
	}
	var worst float64
	for i, p := range s.Points {
		if p.Step != int64(26+i) {
			t.Fatalf("resumed point %d is step %d, want %d", i, p.Step, 26+i)
		}
		worst = max(worst, math.Abs(p.Value-want[25+i]))
	}
	t.Logf("resumed at 25 after a NaN at 40: max |Δloss| %.3g against 1 rank over steps 26-%d", worst, ddpSteps)
	if !(worst <= 1e-5) {
		t.Errorf("resumed curve: max |Δloss| %g against 1 rank, want ≤ 1e-5", worst)
	}
}

// TestDDPFailedRank: a rank that exits non-zero fails its peer too: the
// peer's collective errors out (gloo sees the closed connection) rather
// than hanging or finishing as if it had trained alone.
func TestDDPFailedRank(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	m := filepath.Join(t.TempDir(), "metrics.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	cmds := startRanks(t, ctx, py, []string{"GPUPASS_METRICS_FILE=" + m}, "--fail-rank", "1", "--fail-at-step", "10")
	for i, cmd := range cmds {
		err := cmd.Wait()
		if err == nil {
			t.Errorf("rank %d succeeded though rank 1 failed at step 10:\n%s", i, cmd.Stdout)
		}
		if ctx.Err() != nil {
			t.Fatalf("rank %d still ran after %s", i, time.Since(start))
		}
	}
	t.Logf("both ranks failed %s after start", time.Since(start).Round(time.Millisecond))
	if got := loss(t, m); len(got) >= ddpSteps {
		t.Errorf("rank 0 logged %d steps after its peer failed at step 10", len(got))
	}
}

// slurmGang is the cluster's two nodes as one gang: Slurm's env goes
// through rendezvous.SlurmTask, the wrapper the Slurm executor will put
// around a gang's command.
func slurmCommand(t *testing.T, py string, args ...string) []string {
	t.Helper()
	argv, err := rendezvous.SlurmTask(testutil.FreePort(t), append([]string{py, ddpScript(t), "--steps", strconv.Itoa(ddpSteps), "--timeout", "30"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	return argv
}

func quote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// sbatch submits a batch script of `srun -N2` over the gang wrapper and
// waits for it (sbatch --wait: its exit status is the job's).
func sbatch(t *testing.T, c *slurmtest.Cluster, dir string, argv []string) (string, error) {
	t.Helper()
	script := filepath.Join(dir, "job.sh")
	body := "#!/bin/sh\n# a gang: one task per node, a failed task ends the job (-K)\nexec srun -N2 --ntasks-per-node=1 -K " + quote(argv) + "\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sbatch", "--wait", "-N2", "--ntasks-per-node=1", "-p", slurmtest.Partition, "--job-name", "ddp-"+filepath.Base(dir),
		"--chdir", dir, "--output", filepath.Join(dir, "job.out"), script)
	cmd.Env = c.Env()
	out, err := cmd.CombinedOutput()
	log, _ := os.ReadFile(filepath.Join(dir, "job.out"))
	return string(out) + string(log), err
}

// TestDDPSlurm: on the two-node Slurm test cluster, `sbatch -N2` with
// `srun` tasks and `srun -N2` alone each run the example as a gang of
// one rank per node, the ranks' variables derived from SLURM_* by
// rendezvous.SlurmTask, and give 1 rank's curve; a failed rank fails
// the job.
func TestDDPSlurm(t *testing.T) {
	py := torchPython(t)
	c := slurmtest.Shared(t)
	want := single(t, py)

	t.Run("sbatch -N2", func(t *testing.T) {
		dir, err := os.MkdirTemp(c.Shared, "sbatch-")
		if err != nil {
			t.Fatal(err)
		}
		m := filepath.Join(dir, "metrics.jsonl")
		out, err := sbatch(t, c, dir, append([]string{"env", "GPUPASS_METRICS_FILE=" + m}, slurmCommand(t, py)...))
		if err != nil {
			t.Fatalf("sbatch: %v\n%s", err, out)
		}
		for _, r := range []string{"rank 0/2 (local rank 0, node 0)", "rank 1/2 (local rank 0, node 1)"} {
			if !strings.Contains(out, "ddp: "+r) {
				t.Errorf("no first line from %s:\n%s", r, out)
			}
		}
		sameCurve(t, "sbatch -N2", want, loss(t, m))
	})

	t.Run("srun -N2", func(t *testing.T) {
		dir, err := os.MkdirTemp(c.Shared, "srun-")
		if err != nil {
			t.Fatal(err)
		}
		m := filepath.Join(dir, "metrics.jsonl")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "srun", append([]string{"-N2", "--ntasks-per-node=1", "-K", "-p", slurmtest.Partition,
			"--chdir", dir, "--export=ALL,GPUPASS_METRICS_FILE=" + m}, slurmCommand(t, py)...)...)
		cmd.Env = c.Env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("srun: %v\n%s", err, out)
		}
		sameCurve(t, "srun -N2", want, loss(t, m))
	})

	t.Run("a failed rank fails the job", func(t *testing.T) {
		dir, err := os.MkdirTemp(c.Shared, "fail-")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := sbatch(t, c, dir, slurmCommand(t, py, "--fail-rank", "1", "--fail-at-step", "10"))
		if err == nil {
			t.Fatalf("sbatch --wait succeeded though rank 1 failed:\n%s", out)
		}
		t.Logf("the job failed %s after submit: %v", time.Since(start).Round(time.Millisecond), err)
		if !strings.Contains(out, "rank 1 failing at step 10") {
			t.Errorf("the job's output does not show rank 1 failing:\n%s", out)
		}
		if strings.Contains(out, "trainer: done") {
			t.Errorf("rank 0 finished though its peer failed:\n%s", out)
		}
	})
}

// BenchmarkDDPSrunFirstLine is the peer figure of issue #34's bench:
// `srun -N2 --ntasks-per-node=1` of examples/ddp on the two-node Slurm
// test cluster, through the rank wrapper (rendezvous.SlurmTask), timed
// from submit to the first output line of every rank (srun -l labels
// each line with its task). Reported: p50 and p95 in ms; the gang
// placement's own figure is to be set beside it in the same run.
func BenchmarkDDPSrunFirstLine(b *testing.B) {
	c := slurmtest.Shared(b)
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch.distributed").Run(); err != nil {
		testutil.Missing(b, "torch.distributed in %s: %v", py, err)
	}
	testutil.Alternate(b, testutil.Timed{Name: "srun", Run: srunFirstLine(b, c, py)})
}

// srunFirstLine is one round of BenchmarkDDPSrunFirstLine: `srun -N2`
// of examples/ddp (5 steps), the time from its start to the first output
// line of both tasks.
func srunFirstLine(b *testing.B, c *slurmtest.Cluster, py string) func(i int) time.Duration {
	script := filepath.Join(testutil.RepoRoot(b), "examples", "ddp", "train_ddp.py")
	return func(i int) time.Duration {
		argv, err := rendezvous.SlurmTask(testutil.FreePort(b), []string{py, script, "--steps", "5", "--timeout", "30"})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "srun", append([]string{"-N2", "--ntasks-per-node=1", "-K", "-l", "-p", slurmtest.Partition, "--chdir", c.Shared}, argv...)...)
		cmd.Env = c.Env()
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		seen := map[string]bool{}
		lines := bufio.NewScanner(out)
		for len(seen) < 2 && lines.Scan() {
			if task, _, ok := strings.Cut(lines.Text(), ":"); ok {
				seen[strings.TrimSpace(task)] = true
			}
		}
		all := time.Since(start)
		if len(seen) < 2 {
			b.Fatalf("srun round %d: lines from %d task(s), want 2", i, len(seen))
		}
		// Drain, so the job ends before the next round takes the nodes.
		_, _ = io.Copy(io.Discard, out)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("srun round %d: %v", i, err)
		}
		return all
	}
}
