package slurm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
)

// BenchmarkSubmitToFirstLine times submit → first output line, through
// the Runner (what the agent does for a run) and through sbatch plus
// reading the output file directly at the same poll interval, alternated
// in one run. Reported: p50 and p95 of each, in ms, and their ratio.
func BenchmarkSubmitToFirstLine(b *testing.B) {
	c := slurmtest.Shared(b)
	const poll = 20 * time.Millisecond
	n := 10
	if b.N > n {
		n = b.N
	}
	var viaRunner, direct []time.Duration
	work, err := os.MkdirTemp(c.Shared, "bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(work)
	for i := 0; i < n; i++ {
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
		viaRunner = append(viaRunner, first)

		// sbatch, then poll the output file.
		out := filepath.Join(work, fmt.Sprintf("d%d.out", i))
		start = time.Now()
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
		direct = append(direct, time.Since(start))
	}
	p := func(d []time.Duration, q float64) float64 {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[int(q*float64(len(s)-1)+0.5)]) / 1e6
	}
	b.ReportMetric(p(viaRunner, 0.5), "gpupass-p50-ms")
	b.ReportMetric(p(viaRunner, 0.95), "gpupass-p95-ms")
	b.ReportMetric(p(direct, 0.5), "sbatch-p50-ms")
	b.ReportMetric(p(direct, 0.95), "sbatch-p95-ms")
	b.ReportMetric(0, "ns/op")
}
