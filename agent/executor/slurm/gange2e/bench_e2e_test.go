//go:build e2e

package gange2e

import (
	"context"
	"fmt"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// BenchmarkE2ESlurmGangFirstLine (issue #34): submit -> the first output
// line of every rank of examples/ddp on the two-node test cluster,
// alternated in one run: `gpupass train` of a 2-node spec (the broker
// places the gang, the agent submits one sbatch -N2 job, each rank's
// line is read from its log through the broker) against `srun -N2` of
// the same script wrapped by rendezvous.SlurmTask (the peer, as
// examples' BenchmarkDDPSrunFirstLine runs it). Reported: p50 and p95 in
// ms of each (gpupass-…, srun-…), and of Slurm's own batch job start
// against srun's (slurm-sbatch-…, slurm-srun-…).
func BenchmarkE2ESlurmGangFirstLine(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	g := startGang(b, ctx)
	script := filepath.Join(g.stack.Root, "examples", "ddp", "train_ddp.py")
	// srun runs as nobody: the agent cancels the jobs of its own account
	// (root here) that it did not submit.
	u, err := user.Lookup("nobody")
	if err != nil {
		b.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	nobody := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	testutil.Alternate(b, testutil.Timed{Name: "gpupass", Run: func(i int) time.Duration {
		name := fmt.Sprintf("bench%d", i)
		start := time.Now()
		if out, err := g.gp("train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
			"--name", name, "--", g.py, "train_ddp.py", "--steps", "5", "--timeout", "30").CombinedOutput(); err != nil {
			b.Fatalf("train: %v\n%s", err, out)
		}
		run := g.runNamed(name)
		if run == nil {
			b.Fatalf("round %d: the run is not listed", i)
		}
		first := map[string]string{run.Id: `"rank 0/2 (local rank`, run.Id + "-r1": `"rank 1/2 (local rank`}
		for len(first) > 0 {
			for id, line := range first {
				if log, _ := upstack.RunLog(b, ctx, g.rc, id); strings.Contains(log, line) {
					delete(first, id)
				} else if r := g.getRun(id); terminal(r) {
					b.Fatalf("round %d: %s ended %s (%s) before its first line", i, id, r.State, r.Reason)
				}
			}
			if len(first) > 0 {
				time.Sleep(50 * time.Millisecond)
			}
		}
		took := time.Since(start)
		upstack.WaitFor(b, ctx, "the gang to end", func() bool { return terminal(g.getRun(run.Id)) && terminal(g.getRun(run.Id+"-r1")) })
		return took
	}, Phase: time.Second}, testutil.Timed{Name: "srun", Phase: time.Second, Run: func(i int) time.Duration {
		argv, err := rendezvous.SlurmTask(testutil.FreePort(b), []string{g.py, script, "--steps", "5", "--timeout", "30"})
		if err != nil {
			b.Fatal(err)
		}
		return g.c.SrunFirstLines(b, g.c.Shared, 2, argv, nobody)
	}})
	// What Slurm itself adds by running a gang as a batch job (the agent
	// submits one so that the gang outlives it): sbatch -N2 of a script
	// whose srun starts a task a node that does nothing, against srun -N2
	// of such a task, alternated (slurm-sbatch-…, slurm-srun-…). Every
	// round starts at a random phase of slurmctld's once-a-second pass
	// (testutil.Timed.Phase), here and above.
	testutil.Alternate(b, testutil.Timed{Name: "slurm-sbatch", Phase: time.Second, Run: func(int) time.Duration {
		return g.c.SbatchTasksStarted(b, g.c.Shared, 2, nobody)
	}}, testutil.Timed{Name: "slurm-srun", Phase: time.Second, Run: func(int) time.Duration {
		return g.c.SrunFirstLines(b, g.c.Shared, 2, []string{"echo", "started"}, nobody)
	}})
}
