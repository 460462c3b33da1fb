package slurm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
)

// BenchmarkSubmitToFirstLine times submit → first output line, through
// the Runner (what the agent does for a run) and through sbatch plus
// reading the output file directly at the same poll interval, alternated
// in one run. Reported: p50 and p95 of each, in ms.
func BenchmarkSubmitToFirstLine(b *testing.B) {
	c := slurmtest.Shared(b)
	const poll = 20 * time.Millisecond
	work, err := os.MkdirTemp(c.Shared, "bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(work)
	testutil.Alternate(b, testutil.Timed{Name: "gpupass", Run: func(i int) time.Duration {
		// gpupass's Runner.
		dir := filepath.Join(work, fmt.Sprintf("r%d", i))
		_ = os.Mkdir(dir, 0o755)
		r := runner(c, "n1")
		r.Poll = poll
		var once sync.Once
		start := time.Now()
		var first time.Duration
		r.Run(context.Background(), executor.Attempt{Dir: dir, Command: []string{"echo", "first"},
			Env: append(os.Environ(), executor.EnvAllocID+"=alloc-bench", executor.EnvAttempt+fmt.Sprint("=", i+1))},
			func(executor.Line) { once.Do(func() { first = time.Since(start) }) })
		return first
	}}, testutil.Timed{Name: "sbatch", Run: func(i int) time.Duration {
		// sbatch, then poll the output file.
		out := filepath.Join(work, fmt.Sprintf("d%d.out", i))
		start := time.Now()
		cmd := exec.Command("sbatch", "--parsable", "-w", "n1", "--gres=gpu:a100:4", "-o", out, "--wrap", "echo first")
		cmd.Env = c.Env()
		if b, err := cmd.CombinedOutput(); err != nil {
			panic(fmt.Sprintf("sbatch: %v %s", err, b))
		}
		for {
			bs, _ := os.ReadFile(out)
			if strings.Contains(string(bs), "\n") {
				break
			}
			time.Sleep(poll)
		}
		return time.Since(start)
	}})
}
