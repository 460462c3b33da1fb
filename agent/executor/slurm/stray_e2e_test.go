//go:build e2e

package slurm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// strayScript is what a run's job leaves behind: a batch job of the
// agent's account that watches the node's runs dir and, as the runs after
// its own start, appends a fake log line and a fake loss to the first one
// and scancels the second one's job; it leaves later runs alone. Every job runs as the agent's one
// account, so nothing but the agent stops it.
const strayScript = `root=$(dirname "$PWD"); seen=$(ls "$root"); n=0; i=0
while [ $i -lt 900 ]; do
  for d in "$root"/alloc-*; do
    a=$(basename "$d")
    case " $(echo $seen) " in *" $a "*) continue;; esac
    [ -f "$d/.slurm/attempt-1.out" ] || continue
    seen="$seen $a"; n=$((n+1))
    if [ $n -eq 1 ]; then
      echo "FORGED by a stray job of an earlier run" >> "$d/.slurm/attempt-1.out"
      echo '{"step": 1000, "loss": 0.0001}' >> "$d/metrics.jsonl"
    elif [ $n -eq 2 ]; then
      scancel --name "gpupass-$a"
    fi
  done
  i=$((i+1)); sleep 0.2
done`

// TestE2ESlurmStrayJobs drives the real binaries (gpupass up's broker,
// gpupass-agent --executor slurm, the CLI) on the real cluster through
// the attacks a run's job can make as the agent's account: a job it
// sbatch-es must not outlive it to write the next run's log and metrics or
// scancel a later run's job, and what the shared dir shows changed after
// a job's end must not pass for the run's output.
func TestE2ESlurmStrayJobs(t *testing.T) {
	c := slurmtest.Shared(t)
	upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Env: []string{"SLURM_CONF=" + c.Conf}})
	cfg := stack.Config(t)
	rc, err := brokerclient.DialRuns(cfg.BrokerURL, brokerclient.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	// Where the stray outlives its run (the bug), it must not outlive
	// the test too.
	t.Cleanup(func() {
		stop := exec.Command("scancel", "--name", "stray-e2e")
		stop.Env = c.Env()
		_ = stop.Run()
	})
	// A refresh far off: only the sweeps at each submit and each
	// attempt's end can stop the stray.
	login := stack.StartAgent(t, "slurm-stray", "hpc-eu", "--executor", "slurm", "--slurm-partition", slurmtest.Partition,
		"--slurm-shared-dir", c.Shared, "--slurm-refresh", "10m", "--suite-interval", "2s")
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	upstack.WaitFor(t, ctx, "n1 certified", func() bool {
		out, _ := gp("validate", "--spec", "examples/train/gpupass.yaml", "--dry-run", "--region", "hpc-eu").CombinedOutput()
		return regexp.MustCompile(`slurm:gptest +hpc-eu +a100-80gb x4 .*online, simulated`).MatchString(string(out))
	})
	train := func(t *testing.T, name, script string) string {
		t.Helper()
		out, err := gp("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "hpc-eu",
			"--name", name, "--", "sh", "-c", script).Output()
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
		// The broker holds the whole log once the agent's uploader caught
		// up; complete says so.
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
	// A run's legitimate output: a line, a loss, a few seconds' work.
	const honest = `echo honest run started; echo '{"step": 1, "loss": 0.5}' >> "$GPUPASS_METRICS_FILE"; sleep 6; echo honest run done`

	t.Run("a job a run's job sbatch-es is cancelled at the run's end: the next runs are not forged or cancelled", func(t *testing.T) {
		// The run's job submits the stray (SLURM_CONF: where the cluster's
		// config is, as on any login node), waits for it to run, and
		// ends successfully.
		attack := fmt.Sprintf(`id=$(SLURM_CONF=%s sbatch --parsable --job-name stray-e2e --output /dev/null --wrap %s) || exit 3
echo "submitted stray job $id"
i=0; until [ "$(SLURM_CONF=%[1]s squeue -h -j $id -o %%T)" = RUNNING ]; do i=$((i+1)); [ $i -gt 100 ] && exit 4; sleep 0.2; done
echo stray running`, c.Conf, shellQuote("export SLURM_CONF="+c.Conf+"; "+strayScript))
		a := train(t, "stray-parent", attack)
		ra := ended(t, a)
		la := logOf(t, a)
		if ra.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || !strings.Contains(la, "stray running") {
			t.Fatalf("the attacking run %s: %s (%s), want succeeded having started its stray:\n%s", a, ra.State, ra.Reason, upstack.Tail(la, 3000))
		}
		stray := c.Command(t, "squeue", "-h", "-t", "all", "-n", "stray-e2e", "-o", "%i %T")
		t.Logf("the stray job once its run ended: %q", stray)
		if strings.Contains(stray, "RUNNING") || strings.Contains(stray, "PENDING") {
			t.Errorf("the stray job outlived the run that started it: %q", stray)
		}
		if !strings.Contains(la, "cancelled 1 slurm job(s) of the agent's account that no live run submitted (at the end of the attempt's job): job ") {
			t.Errorf("the attacking run's log does not say its stray was cancelled:\n%s", upstack.Tail(la, 3000))
		}

		// The next run: its log and metrics hold only what its own job
		// wrote.
		b := train(t, "after-stray", honest)
		rb := ended(t, b)
		lb := logOf(t, b)
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: b}))
		if err != nil {
			t.Fatal(err)
		}
		var losses []float64
		for _, p := range mr.Msg.Points {
			if v, ok := p.Values["loss"]; ok {
				losses = append(losses, v)
			}
		}
		t.Logf("the next run %s: %s, complete %v, disputed %v, losses %v", b, rb.State, rb.LogComplete, rb.LogDisputed, losses)
		if strings.Contains(lb, "FORGED") || len(losses) != 1 || losses[0] != 0.5 {
			t.Errorf("the next run's evidence holds what the stray wrote (complete: %v, disputed: %v, losses %v, want [0.5]):\n%s",
				rb.LogComplete, rb.LogDisputed, losses, upstack.Tail(lb, 3000))
		}
		if rb.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || !rb.LogComplete || rb.LogDisputed {
			t.Errorf("the next run: %s (%s), complete %v, disputed %v; want succeeded, complete, undisputed", rb.State, rb.Reason, rb.LogComplete, rb.LogDisputed)
		}

		// The run after: the stray would scancel its job.
		cr := train(t, "after-stray-2", honest)
		rcr := ended(t, cr)
		if rcr.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Errorf("the run after %s: %s (%s), want succeeded: a job of an ended run cancelled it", cr, rcr.State, rcr.Reason)
		}
	})

	t.Run("output changed in the shared dir after the job's end disputes the run", func(t *testing.T) {
		// $((0+1)): the line, not the command the run's log also shows.
		id := train(t, "written-after-end", `echo "short run at step $((0+1))"; sleep 1`)
		upstack.WaitFor(t, ctx, "the run's job to write its first line", func() bool {
			return strings.Contains(logOf(t, id), "short run at step 1")
		})
		// The agent is down (a crash, an upgrade) when the job ends; a
		// job of the account (here the test, which is that account)
		// appends to the run's output meanwhile. (Down for less than
		// the broker's 10 s heartbeat window, so the run is not lost.)
		login.Kill9(t)
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		upstack.WaitFor(t, wctx, "the run's job to end", func() bool {
			return regexp.MustCompile(`^[0-9]+ COMPLETED\n$`).MatchString(c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+id, "-o", "%i %T"))
		})
		// Past the end Slurm records (whole seconds) and its slack.
		time.Sleep(3 * time.Second)
		out := filepath.Join(c.Shared, "gpupass", slurmtest.ClusterName, "n1", "runs", id, ".slurm", "attempt-1.out")
		f, err := os.OpenFile(out, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteString("FORGED after the job ended\n")
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		login.Restart(t)
		r := ended(t, id)
		l := logOf(t, id)
		t.Logf("run %s: %s (%s)", id, r.State, r.Reason)
		if r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || !strings.Contains(r.Reason, "disputed: attempt-1.out changed at ") {
			t.Errorf("run %s: %s (%s), want failed as disputed: its output changed after its job ended:\n%s", id, r.State, r.Reason, upstack.Tail(l, 3000))
		}
	})
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
