package slurm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/slurm"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
)

const helperEnv = "GPUPASS_SLURM_HELPER_LINES"

const reattachLines = 40

func reattachAttempt(dir string) executor.Attempt {
	return executor.Attempt{Dir: dir, Grace: time.Second,
		Command: []string{"sh", "-c", fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; i=$((i+1)); sleep 0.05; done`, reattachLines)},
		Env:     append(os.Environ(), executor.EnvAllocID+"=alloc-reattach1", executor.EnvAttempt+"=1")}
}

// helperAgent is the "agent" the reattach test kills: it follows the
// attempt and stores each line it is handed with its offset, in one
// write, as the agent's spool stores a record.
func helperAgent() int {
	f, err := os.OpenFile(os.Getenv(helperEnv), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return 1
	}
	r := &slurm.Runner{Client: &slurm.Client{}, Node: "n1", Gres: "gpu:a100:1", Poll: 50 * time.Millisecond}
	ex := r.Run(context.Background(), reattachAttempt(os.Getenv("GPUPASS_SLURM_HELPER_DIR")), func(l executor.Line) {
		fmt.Fprintf(f, "%d\t%d\t%s\n", l.Offset, l.Stream, l.Text)
	})
	// The test kills this process mid-run; getting here means the follow
	// ended on its own, which the test reports with this line.
	fmt.Fprintf(os.Stderr, "helper agent: the follow ended: %+v\n", ex)
	return 0
}

// TestAgentKilledMidRunFindsTheJobAgain: an agent killed -9 while
// following a job leaves the job running; the next one finds it again
// (no second sbatch) and reads on from where the consumer's store ends,
// so that no line is lost or stored twice.
func TestAgentKilledMidRunFindsTheJobAgain(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	dir := filepath.Join(workRoot(t, c), "alloc-reattach1")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	linesFile := filepath.Join(t.TempDir(), "lines")
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(c.Env(), helperEnv+"="+linesFile, "GPUPASS_SLURM_HELPER_DIR="+dir)
	var stderr strings.Builder
	agent.Stderr = &stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	// The job shares n1 with the package's other tests, which take all its
	// GPUs at times; it may wait in the queue for a while under a loaded CI.
	// So the minute for the first lines counts from the job's start, and
	// the queue wait has a bound of its own.
	queued, started := time.Now().Add(5*time.Minute), time.Time{}
	state, asked := "", time.Time{}
	for {
		b, _ := os.ReadFile(linesFile)
		if strings.Count(string(b), "\n") >= 5 && !strings.Contains(string(b), "line 40") {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the first agent exited before it was killed (%v), having handed over %q; its stderr:\n%s", err, b, stderr.String())
		default:
		}
		if started.IsZero() && time.Since(asked) > 500*time.Millisecond {
			asked = time.Now()
			if jobs, err := client(c).JobsNamed(context.Background(), slurm.JobName("alloc-reattach1")); err == nil && len(jobs) == 1 {
				state = jobs[0].State
				if jobs[0].Phase() != slurm.Pending {
					started = time.Now()
				}
			}
		}
		if now := time.Now(); (started.IsZero() && now.After(queued)) || (!started.IsZero() && now.After(started.Add(time.Minute))) {
			_ = agent.Process.Kill()
			<-exited
			t.Fatalf("the first agent handed over %q (job state %q, started %v); its stderr:\n%s", b, state, !started.IsZero(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = agent.Process.Kill()
	<-exited

	stored, _ := os.ReadFile(linesFile)
	var before []string
	var offs [2]int64
	for _, rec := range strings.Split(strings.TrimSuffix(string(stored), "\n"), "\n") {
		f := strings.SplitN(rec, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("torn record %q: the store's writes are not whole", rec)
		}
		off, _ := strconv.ParseInt(f[0], 10, 64)
		s, _ := strconv.Atoi(f[1])
		offs[s] = off
		before = append(before, f[2])
	}
	var after []string
	r := runner(c, "n1")
	again := reattachAttempt(dir)
	again.From = &executor.Offsets{Stdout: offs[events.Stdout], Stderr: offs[events.Stderr]}
	ex := r.Run(context.Background(), again, func(l executor.Line) { after = append(after, l.Text) })
	if ex.StartErr != nil || ex.Code != 0 {
		t.Fatalf("the second agent's follow ended %+v", ex)
	}
	got := append(before, after...)
	if len(after) == 0 || len(after) == len(got) {
		t.Fatalf("the kill did not land mid-run: %d lines before, %d after", len(got)-len(after), len(after))
	}
	for i, l := range got {
		if want := fmt.Sprintf("line %d", i+1); l != want {
			t.Fatalf("line %d is %q, want %q (lost or duplicated across the restart): %q", i+1, l, want, got)
		}
	}
	if len(got) != reattachLines {
		t.Fatalf("%d lines, want %d", len(got), reattachLines)
	}
	jobs, err := client(c).JobsNamed(context.Background(), slurm.JobName("alloc-reattach1"))
	if err != nil || len(jobs) != 1 {
		t.Fatalf("jobs named for the run: %+v, %v; want exactly one (no second sbatch)", jobs, err)
	}
}
