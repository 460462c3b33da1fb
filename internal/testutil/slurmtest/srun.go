package slurmtest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
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

// SbatchTasksStarted submits `sbatch -N nodes` of a batch script whose
// `srun --ntasks-per-node=1` task on each node only says it started, the
// way a gpupass Slurm gang's job starts its ranks, and returns how long
// it took from starting sbatch until every task had started. It waits
// for the job to end (sbatch --wait). Beside SrunFirstLines of a command
// as short, it is what Slurm itself adds to a gang's start by running it
// as a batch job. srun's allocation is made as it asks; a batch job is
// only tested at submit (job_allocate with allocate=0 in Slurm 22.05) and
// started by schedule(), which slurmctld's background thread calls in
// its pass once a second: a wait spread evenly over 0-1 s, then the
// batch script's own launch.
func (c *Cluster) SbatchTasksStarted(tb testing.TB, dir string, nodes int, as *syscall.Credential) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mark, err := os.MkdirTemp(dir, "sbatch-started-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(mark)
	if as != nil {
		if err := os.Chown(mark, int(as.Uid), int(as.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	n := strconv.Itoa(nodes)
	script := "#!/bin/sh\nexec srun -N " + n + " --ntasks-per-node=1 -K sh -c 'touch \"$0/$SLURM_PROCID\"' " + mark + "\n"
	cmd := exec.CommandContext(ctx, "sbatch", "--wait", "-N"+n, "--ntasks-per-node=1", "-p", Partition, "--chdir", dir, "--output", "/dev/null")
	cmd.Env = c.Env()
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if as != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var all time.Duration
	for all == 0 && ctx.Err() == nil {
		if ents, _ := os.ReadDir(mark); len(ents) >= nodes {
			all = time.Since(start)
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := cmd.Wait(); err != nil || all == 0 {
		tb.Fatalf("sbatch -N%d: %v, tasks started after %s; output:\n%s", nodes, err, all, out.String())
	}
	return all
}
