//go:build e2e

package executor_test

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/testutil"
)

// torchPython is Debian's interpreter with python3-torch (the first
// python3 on PATH may lack it).
func torchPython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testutil.Missing(t, "%s (python3-torch)", py)
	}
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "torch in %s: %v", py, err)
	}
	return py
}

// TestTrainExampleNaNRestart runs the real PyTorch example with a NaN
// injected at step 60: the guard stops it, restarts it from the step-50
// checkpoint, the run finishes, and its metrics are one continuous
// series equal to an undisturbed run's.
func TestTrainExampleNaNRestart(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	script := filepath.Join(testutil.RepoRoot(t), "examples", "train", "train.py")
	args := []string{py, script, "--steps", "100", "--checkpoint-every", "25"}
	clean, nan := make(chan runOut, 1), make(chan runOut, 1)
	go func() {
		clean <- execute(t, context.Background(), executor.Job{AllocID: "alloc-clean", Command: args, MaxRestarts: 3}, nil)
	}()
	go func() {
		nan <- execute(t, context.Background(), executor.Job{AllocID: "alloc-nan", Command: append(args, "--nan-at-step", "60"), MaxRestarts: 3, Grace: 30 * time.Second}, nil)
	}()
	c, n := <-clean, <-nan
	if c.res.State != executor.Succeeded {
		t.Fatalf("clean run: %+v\n%s", c.res, dump(c))
	}
	if n.res.State != executor.Succeeded || n.res.Restarts != 1 || n.res.Attempts != 2 {
		t.Fatalf("NaN run: %+v\n%s", n.res, dump(n))
	}
	ckpt := filepath.Join(n.res.WorkDir, "checkpoints", "ckpt-00000050.pt")
	var restart *events.Event
	for _, e := range n.find(events.NaNGuard) {
		if e.Level == events.Error {
			e := e
			restart = &e
		}
	}
	if restart == nil || restart.Fields["step"] != "60" || restart.Fields["resume_from"] != ckpt || !strings.Contains(restart.Text(), "ERROR nan-guard non-finite loss NaN at step 60") {
		t.Fatalf("restart event %+v, want an ERROR naming step 60 and %s", restart, ckpt)
	}
	var resumed bool
	for _, e := range n.find("checkpoint") {
		resumed = resumed || strings.Contains(e.Message, "resumed from "+ckpt+" at step 50")
	}
	if !resumed {
		t.Error("the example did not report resuming from the checkpoint")
	}

	want, got := events.Continuous(c.metrics), events.Continuous(n.metrics)
	if len(want) != 100 || len(got) != 100 {
		t.Fatalf("series lengths %d and %d, want 100", len(want), len(got))
	}
	for i := range got {
		g, w := got[i], want[i]
		gl, _ := g.Loss()
		wl, _ := w.Loss()
		if g.Step != int64(i+1) || math.IsNaN(gl) || math.IsInf(gl, 0) {
			t.Fatalf("point %d: step %d loss %v", i, g.Step, gl)
		}
		if wantAttempt := map[bool]int{true: 1, false: 2}[g.Step <= 50]; g.Attempt != wantAttempt {
			t.Errorf("step %d comes from attempt %d, want %d", g.Step, g.Attempt, wantAttempt)
		}
		if math.Abs(gl-wl) > 1e-6*math.Max(1, math.Abs(wl)) {
			t.Errorf("step %d: loss %v after the restart, %v undisturbed", g.Step, gl, wl)
		}
	}
}

// wlmNaN trains a small torch model and logs as PyTorch's
// word_language_model example does (its format string), with no
// gpupass:metric line and no metrics file; the first attempt's loss is
// NaN at batch 25. It saves a checkpoint every 10 batches and resumes
// from $GPUPASS_RESUME_FROM.
const wlmNaN = `import math, os, time, torch
torch.manual_seed(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
ckdir = os.environ["GPUPASS_CHECKPOINT_DIR"]
resume = os.environ.get("GPUPASS_RESUME_FROM")
start = 0
if resume:
    st = torch.load(resume)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    start = st["batch"]
    print("checkpoint: resumed from %s at batch %d" % (resume, start), flush=True)
nb = 40
for batch in range(start + 1, nb + 1):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if batch == 25 and not resume:
        loss = loss * float("nan")
    cur_loss = loss.item()
    if batch % 5 == 0:
        ppl = math.exp(cur_loss) if cur_loss < 700 else float("inf")
        print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
              'loss {:5.2f} | ppl {:8.2f}'.format(1, batch, nb, 0.05, 1.0, cur_loss, ppl), flush=True)
    if not math.isfinite(cur_loss):
        time.sleep(60)  # a careless trainer: the guard has to stop it
    loss.backward()
    opt.step()
    if batch % 10 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "batch": batch}, os.path.join(ckdir, "ckpt-%03d.pt" % batch))
        time.sleep(0.05)
`

// TestScriptLogNaNRestart: a real torch trainer that prints its own log
// lines (`| loss   nan |`) gets the NaN restart a JSONL NaN gets, and its
// printed losses are the run's metrics.
func TestScriptLogNaNRestart(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	script := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(script, []byte(wlmNaN), 0o644); err != nil {
		t.Fatal(err)
	}
	n := execute(t, context.Background(), executor.Job{AllocID: "alloc-wlm", Command: []string{py, script}, MaxRestarts: 3, Grace: 10 * time.Second}, nil)
	if n.res.State != executor.Succeeded || n.res.Restarts != 1 || n.res.Attempts != 2 {
		t.Fatalf("run: %+v\n%s", n.res, dump(n))
	}
	ckpt := filepath.Join(n.res.WorkDir, "checkpoints", "ckpt-020.pt")
	var restart *events.Event
	for _, e := range n.find(events.NaNGuard) {
		if e.Level == events.Error {
			e := e
			restart = &e
		}
	}
	if restart == nil || restart.Fields["step"] != "25" || restart.Fields["resume_from"] != ckpt {
		t.Fatalf("restart event %+v, want an ERROR naming step 25 and %s\n%s", restart, ckpt, dump(n))
	}
	got := events.Continuous(n.metrics)
	var steps []int64
	for _, m := range got {
		l, _ := m.Loss()
		if m.Source != executor.SourceText || math.IsNaN(l) || math.IsInf(l, 0) {
			t.Errorf("point %+v", m)
		}
		if wantAttempt := map[bool]int{true: 1, false: 2}[m.Step <= 20]; m.Attempt != wantAttempt {
			t.Errorf("step %d from attempt %d, want %d", m.Step, m.Attempt, wantAttempt)
		}
		steps = append(steps, m.Step)
	}
	if len(steps) != 8 || steps[0] != 5 || steps[7] != 40 {
		t.Errorf("steps %v, want 5, 10, …, 40", steps)
	}
}

func dump(o runOut) string {
	var b strings.Builder
	for _, e := range o.events {
		b.WriteString(e.Text() + "\n")
	}
	return b.String()
}

// TestTorchSharedMemoryInPrivateTmp (testdata/torch_shm.py): PyTorch's DataLoader workers and
// torch.multiprocessing hand tensors over in /dev/shm; with a run's own
// /dev/shm (a tmpfs in its mount namespace), as --run-as nobody in a
// cgroup, they still work.
func TestTorchSharedMemoryInPrivateTmp(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	testutil.NeedRoot(t)
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{Cgroups: cgroups(t), PrivateTmp: &local.PrivateTmp{ShmSize: "512m"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	code, err := os.ReadFile(filepath.Join("testdata", "torch_shm.py"))
	if err != nil {
		t.Fatal(err)
	}
	out := execute(t, ctx, executor.Job{AllocID: "alloc-torch-shm", Command: []string{py, "-c", string(code)},
		WorkRoot: filepath.Join(testutil.TempDirMode(t, 0o711), "runs"), RunAs: nobody}, x)
	if out.res.State != executor.Succeeded {
		t.Fatalf("run %s: %s\n%s", out.res.State, out.res.Reason, dump(out))
	}
	if said := lines(out.find("stdout")); !strings.Contains(said, "dataloader-sum=499500 shared=1000/1000 shm=131072") {
		t.Errorf("job said %q, want the DataLoader's sum 499500 and the shared tensor bumped to 1000, in a /dev/shm of 512 MiB (131072 blocks)", said)
	}
}
