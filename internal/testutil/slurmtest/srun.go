package slurmtest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SrunFirstLines runs argv as `srun -N nodes --ntasks-per-node=1 -K -l`
// in dir on the cluster's partition, the peer of a gang's benchmark, and
// returns how long it took from starting srun to the first output line of
// every task (srun -l labels each line with its task). It waits for the
// step to end, so the next round finds the nodes free. With as set, srun
// runs as that user: a gpupass Slurm agent on the cluster cancels the
// jobs of its own account that it did not submit.
func (c *Cluster) SrunFirstLines(tb testing.TB, dir string, nodes int, argv []string, as *syscall.Credential) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := strconv.Itoa(nodes)
	cmd := exec.CommandContext(ctx, "srun", append([]string{"-N" + n, "--ntasks-per-node=1", "-K", "-l", "-p", Partition, "--chdir", dir}, argv...)...)
	cmd.Env = c.Env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if as != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	seen := map[string]bool{}
	lines := bufio.NewScanner(out)
	for len(seen) < nodes && lines.Scan() {
		if task, _, ok := strings.Cut(lines.Text(), ":"); ok {
			seen[strings.TrimSpace(task)] = true
		}
	}
	all := time.Since(start)
	if len(seen) < nodes {
		_ = cmd.Wait()
		tb.Fatalf("srun -N%d: lines from %d task(s), want %d; stderr:\n%s", nodes, len(seen), nodes, stderr.String())
	}
	// Drain, so the step ends before the next round takes the nodes.
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		tb.Fatalf("srun -N%d: %v; stderr:\n%s", nodes, err, stderr.String())
	}
	return all
}
