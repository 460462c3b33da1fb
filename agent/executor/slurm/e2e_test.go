//go:build e2e

package slurm_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2ESlurmCluster drives the binaries against the real two-node
// cluster: one gpupass-agent --executor slurm stands for both compute
// nodes (n1 gpu:a100:4, n2 gpu:h100:2) in region hpc-eu next to up's
// local agent in us-west-2.
func TestE2ESlurmCluster(t *testing.T) {
	c := slurmtest.Shared(t)
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Env: []string{"SLURM_CONF=" + c.Conf}})
	cfg := stack.Config(t)
	rc, err := brokerclient.DialRuns(cfg.BrokerURL, brokerclient.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	// n2 simulates the built-in h100-sxm5-8x profile with the 2 GPUs its
	// GRES gives jobs, so it is certified (for the time-limit subtest)
	// and still no candidate for the a100 spec the other subtests train.
	h100x2 := filepath.Join(t.TempDir(), "h100-sxm5-2x.json")
	prof, err := os.ReadFile(filepath.Join(stack.Root, "internal", "probe", "profiles", "h100-sxm5-8x.json"))
	if err != nil {
		t.Fatal(err)
	}
	prof = regexp.MustCompile(`"count": *8`).ReplaceAll(prof, []byte(`"count": 2`))
	prof = regexp.MustCompile(`"name": *"h100-sxm5-8x"`).ReplaceAll(prof, []byte(`"name": "h100-sxm5-2x"`))
	if err := os.WriteFile(h100x2, prof, 0o644); err != nil {
		t.Fatal(err)
	}
	login := stack.StartAgent(t, "slurm-login", "hpc-eu", "--executor", "slurm", "--slurm-partition", slurmtest.Partition,
		"--slurm-shared-dir", c.Shared, "--slurm-simulate", "n2="+h100x2, "--slurm-refresh", "1s", "--suite-interval", "2s")
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	dryRun := func() string {
		out, _ := gp("validate", "--spec", "examples/train/gpupass.yaml", "--dry-run", "--region", "hpc-eu").CombinedOutput()
		return string(out)
	}

	t.Run("dry-run lists both nodes with their accelerators", func(t *testing.T) {
		var out string
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("last dry-run:\n%s", out)
			}
		}()
		upstack.WaitFor(t, wctx, "both slurm nodes in dry-run", func() bool {
			out = dryRun()
			return regexp.MustCompile(`slurm:gptest +hpc-eu +a100-80gb x4 .*online, simulated`).MatchString(out) &&
				regexp.MustCompile(`\(hpc-eu, score [0-9.]+\): .*resources.accelerator: expected a100-80gb, measured h100-sxm5`).MatchString(out)
		})
		t.Logf("dry-run:\n%s", out)
		nodes, _ := gp("--output", "json", "nodes").CombinedOutput()
		for _, want := range []string{`"provider":"slurm:gptest"`, `"hostname":"n1"`, `"hostname":"n2"`, `"accelerator":"h100-sxm5"`, `"accelerator":"a100-80gb"`} {
			if !strings.Contains(strings.ReplaceAll(string(nodes), " ", ""), want) {
				t.Errorf("gpupass nodes lacks %s:\n%s", want, nodes)
			}
		}
		t.Logf("nodes:\n%s", nodes)
	})

	// A run with the spec's 1-minute limit on n2 (the only node its
	// h100-sxm5 spec matches) that sleeps past it. Slurm counts limits in
	// whole minutes and checks them periodically, so it is submitted here
	// and checked last: it runs while the subtests below use n1.
	timeoutID := ""
	// h100Spec is examples/train's spec for n2's accelerator, with a time
	// limit when limit is set.
	h100Spec := func(t *testing.T, limit string) string {
		b, err := os.ReadFile(filepath.Join(stack.Root, "examples", "train", "gpupass.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		h100 := strings.Replace(string(b), "accelerator: a100-80gb", "accelerator: h100-sxm5", 1)
		if limit != "" {
			h100 = strings.Replace(h100, "resources:\n", "resources:\n  time-limit: "+limit+"\n", 1)
		}
		p := filepath.Join(t.TempDir(), "gpupass.yaml")
		if err := os.WriteFile(p, []byte(h100), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("a spec's time limit reaches sbatch --time", func(t *testing.T) {
		specPath := h100Spec(t, "1m")
		upstack.WaitFor(t, ctx, "n2 certified for the h100 spec", func() bool {
			out, _ := gp("validate", "--spec", specPath, "--dry-run", "--region", "hpc-eu").CombinedOutput()
			return strings.Contains(string(out), "1 candidate(s)")
		})
		out, err := gp("--output", "json", "train", "--spec", specPath, "--region", "hpc-eu", "--name", "slurm-timeout",
			"--", "sh", "-c", "echo started; exec sleep 600").Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		timeoutID = regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		if timeoutID == "" || !strings.Contains(string(out), `"time_limit_seconds": 60`) {
			t.Fatalf("train printed %s, want a run with time_limit_seconds 60", out)
		}
	})

	t.Run("train through sbatch equals the local executor's curve, with a NaN restart", func(t *testing.T) {
		var out upstack.Buffer
		train := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--region", "hpc-eu",
			"--workdir", "examples/train", "--name", "slurm-e2e", "--follow", "--",
			py, "train.py", "--steps", "30", "--checkpoint-every", "10", "--nan-at-step", "15")
		train.Stdout, train.Stderr = &out, &out
		if err := train.Run(); err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(out.String(), 4000))
		}
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		series := map[string][]float64{}
		for _, r := range resp.Msg.Runs {
			if r.Id == timeoutID {
				continue
			}
			if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.Restarts != 1 {
				t.Errorf("%s (%s): %s restarts %d reason %q; want succeeded after 1 NaN restart", r.Id, r.Region, r.State, r.Restarts, r.Reason)
			}
			ls, err := rc.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: r.Id, IncludeMetrics: true}))
			if err != nil {
				t.Fatal(err)
			}
			var n uint64
			var sbatch bool
			for ls.Receive() {
				for _, rec := range ls.Msg().Records {
					n++
					if rec.Seq != n {
						t.Fatalf("%s: record %d has seq %d (gap or repeat)", r.Region, n, rec.Seq)
					}
					sbatch = sbatch || strings.Contains(string(rec.Data), "gpupass-"+r.Id)
				}
			}
			if err := ls.Err(); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Errorf("%s: empty log", r.Region)
			}
			if r.Region == "hpc-eu" && !sbatch {
				t.Errorf("the hpc-eu run's log names no slurm job gpupass-%s", r.Id)
			}
			mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: r.Id}))
			if err != nil {
				t.Fatal(err)
			}
			byStep := map[int64]float64{}
			for _, p := range mr.Msg.Points {
				if v, ok := p.Values["loss"]; ok && !math.IsNaN(v) {
					byStep[p.Step] = v
				}
			}
			for s := int64(1); s <= 30; s++ {
				if v, ok := byStep[s]; ok {
					series[r.Region] = append(series[r.Region], v)
				}
			}
		}
		if len(series["hpc-eu"]) != 30 || len(series["us-west-2"]) != 30 {
			t.Fatalf("loss series lengths: %d through slurm, %d local; want 30", len(series["hpc-eu"]), len(series["us-west-2"]))
		}
		for i := range series["hpc-eu"] {
			if series["hpc-eu"][i] != series["us-west-2"][i] {
				t.Fatalf("step %d: loss %v through slurm, %v local", i+1, series["hpc-eu"][i], series["us-west-2"][i])
			}
		}
	})

	t.Run("gpupass cancel scancels the running job", func(t *testing.T) {
		out, err := gp("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "hpc-eu",
			"--workdir", "examples/train", "--name", "slurm-cancel", "--", py, "train.py", "--steps", "100000", "--sleep", "0.2").Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		if id == "" {
			t.Fatalf("no allocation id in %s", out)
		}
		run := func() *gpupassv1.Run {
			resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
			if err != nil {
				t.Fatal(err)
			}
			return resp.Msg.Run
		}
		upstack.WaitFor(t, ctx, "the run to train", func() bool {
			return run().State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && run().HeldThrough > 5
		})
		// The run is "running" from its lease check on, before the agent
		// has submitted the batch job (runtime-init's records count in
		// HeldThrough): wait for the job itself, so that the cancel
		// reaches a Slurm job and not a run still in runtime-init.
		upstack.WaitFor(t, ctx, "the run's slurm job to run", func() bool {
			jobs := c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+id, "-o", "%i %T")
			return regexp.MustCompile(`^[0-9]+ RUNNING\n$`).MatchString(jobs)
		})
		if b, err := gp("cancel", id).CombinedOutput(); err != nil {
			t.Fatalf("gpupass cancel: %v\n%s", err, b)
		}
		upstack.WaitFor(t, ctx, "the run to end cancelled", func() bool {
			return run().State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
		})
		// SIGTERM ends the trainer: Slurm says FAILED (it exited on the
		// signal) or CANCELLED (it outlived the grace period). The run's
		// state can reach the broker before slurmctld has moved the job
		// on from COMPLETING, so wait for it.
		var jobs string
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("the run's slurm job after gpupass cancel: %q, want one job, ended; every job: %q", jobs,
					c.Command(t, "squeue", "-h", "-t", "all", "-o", "%i %j %T %r"))
			}
		}()
		upstack.WaitFor(t, wctx, "the run's slurm job to end", func() bool {
			jobs = c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+id, "-o", "%i %T")
			return regexp.MustCompile(`^[0-9]+ (FAILED|CANCELLED)\n$`).MatchString(jobs)
		})
	})

	t.Run("kill -9 of the agent mid-run: the restarted agent follows the job to its end, every record once", func(t *testing.T) {
		const steps = 60
		// Run alone (-run .../kill), the subtest waits for n1 itself.
		upstack.WaitFor(t, ctx, "n1 certified", func() bool {
			return regexp.MustCompile(`slurm:gptest +hpc-eu +a100-80gb x4 .*online, simulated`).MatchString(dryRun())
		})
		out, err := gp("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "hpc-eu",
			"--workdir", "examples/train", "--name", "slurm-kill9", "--", py, "train.py", "--steps", strconv.Itoa(steps),
			"--checkpoint-every", "1", "--sleep", "0.1").Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		run := func() *gpupassv1.Run {
			resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
			if err != nil {
				t.Fatal(err)
			}
			return resp.Msg.Run
		}
		logText := func() (string, uint64) { return upstack.RunLog(t, ctx, rc, id) }
		// Mid-run: the job runs and the broker holds some of its
		// checkpoint lines, not the last.
		upstack.WaitFor(t, ctx, "the run's job to be a few steps in", func() bool {
			l, _ := logText()
			return strings.Contains(l, "ckpt-00000003.pt")
		})
		login.Kill9(t)
		if l, _ := logText(); strings.Contains(l, fmt.Sprintf("/ckpt-%08d.pt\"}", steps)) {
			t.Fatalf("the run was over before the kill")
		}
		restarted := time.Now()
		login.Restart(t)
		// The restarted agent reports n1 with its last measurement while
		// the run's job holds the node (a job step would wait for the
		// job), not "not measured".
		rep := filepath.Join(stack.State, "test-agents", "slurm-login", "slurm", "gptest-n1", "report.json")
		upstack.WaitFor(t, ctx, "n1's first report after the restart", func() bool {
			st, err := os.Stat(rep)
			return err == nil && st.ModTime().After(restarted)
		})
		if b, _ := os.ReadFile(rep); strings.Contains(string(b), "not measured") {
			t.Errorf("n1's report after the restart says not measured:\n%s", upstack.Tail(string(b), 2000))
		}
		defer func() {
			if t.Failed() {
				l, _ := logText()
				t.Logf("the run's log:\n%s", upstack.Tail(l, 6000))
			}
		}()
		var r *gpupassv1.Run
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		defer wcancel()
		upstack.WaitFor(t, wctx, "the run to end", func() bool {
			r = run()
			return r.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING && r.State != gpupassv1.AllocState_ALLOC_STATE_STARTING
		})
		if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %s: %s (%s), want succeeded: the restarted agent follows the job on", id, r.State, r.Reason)
		}
		upstack.CheckFollowedOn(t, ctx, rc, id, steps)
		if jobs := c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+id, "-o", "%i %T"); !regexp.MustCompile(`^[0-9]+ COMPLETED\n$`).MatchString(jobs) {
			t.Errorf("the run's slurm jobs: %q, want one, completed (no second sbatch)", jobs)
		}
	})

	t.Run("a job past its time limit ends failed with TIMEOUT", func(t *testing.T) {
		if timeoutID == "" {
			t.Skip("no run was submitted (see the subtest that submits it)")
		}
		var runs string
		upstack.WaitFor(t, ctx, "the time-limited run to end", func() bool {
			b, _ := gp("runs").CombinedOutput()
			runs = string(b)
			return regexp.MustCompile(timeoutID + `.* (failed|succeeded|cancelled)`).MatchString(runs)
		})
		if !regexp.MustCompile(timeoutID + `.* failed.* 1m +slurm job [0-9]+ on n2 .*: TIMEOUT \(TimeLimit, time limit 00:01:00\)`).MatchString(runs) {
			t.Errorf("gpupass runs does not show the run failed with its 1m limit and Slurm's TIMEOUT:\n%s", runs)
		}
		ls, err := rc.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: timeoutID}))
		if err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		for ls.Receive() {
			for _, rec := range ls.Msg().Records {
				log.Write(rec.Data)
			}
		}
		if !strings.Contains(log.String(), "sbatch --time=1: the run's time limit (1m left)") {
			t.Errorf("the run's log does not say which sbatch --time it got:\n%s", upstack.Tail(log.String(), 3000))
		}
	})

	t.Run("drain takes the node out of dry-run with Slurm's reason", func(t *testing.T) {
		c.Command(t, "scontrol", "update", "nodename=n1", "state=drain", "reason=gpu 2 xid 79")
		defer c.Command(t, "scontrol", "update", "nodename=n1", "state=resume")
		var out string
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("last dry-run:\n%s", out)
			}
		}()
		upstack.WaitFor(t, wctx, "the drain reason in dry-run", func() bool {
			// Slurm's reason is in the node's signed report, and the node
			// is out of dry-run.
			rep, _ := os.ReadFile(filepath.Join(stack.State, "test-agents", "slurm-login", "slurm", "gptest-n1", "report.json"))
			if !strings.Contains(string(rep), `"name":"slurm.node"`) || !strings.Contains(string(rep), "slurm node n1 is drain: gpu 2 xid 79") {
				return false
			}
			out = dryRun()
			return strings.Contains(out, "0 candidate(s)") && strings.Contains(out, "failed check slurm.node: slurm node n1 is drain: gpu 2 xid 79")
		})
		t.Logf("dry-run after drain:\n%s", out)
	})

	t.Run("a node Slurm marks down under a run: NODE_FAIL, handled as a lost node", func(t *testing.T) {
		// On n2, free again once the time-limited run ended.
		if timeoutID != "" {
			upstack.WaitFor(t, ctx, "the time-limited run to end", func() bool {
				resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: timeoutID}))
				return err == nil && resp.Msg.Run.State == gpupassv1.AllocState_ALLOC_STATE_FAILED
			})
		}
		specPath := h100Spec(t, "")
		upstack.WaitFor(t, ctx, "n2 certified for the h100 spec", func() bool {
			out, _ := gp("validate", "--spec", specPath, "--dry-run", "--region", "hpc-eu").CombinedOutput()
			return strings.Contains(string(out), "1 candidate(s)")
		})
		out, err := gp("--output", "json", "train", "--spec", specPath, "--region", "hpc-eu", "--name", "slurm-nodefail",
			"--", "sh", "-c", "echo started; exec sleep 600").Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		upstack.WaitFor(t, ctx, "the run's slurm job to run on n2", func() bool {
			jobs := c.Command(t, "squeue", "-h", "-t", "all", "-n", "gpupass-"+id, "-o", "%i %T %N")
			return regexp.MustCompile(`^[0-9]+ RUNNING n2\n$`).MatchString(jobs)
		})
		c.Command(t, "scontrol", "update", "nodename=n2", "state=down", "reason=gpupass e2e: node lost")
		defer func() {
			// The cluster is shared with the package's other tests. With
			// ReturnToService=2 n2 may be back already when slurmd
			// registers again (then resume is refused as "Invalid node
			// state"): resume until sinfo shows it in service.
			rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
			defer rcancel()
			upstack.WaitFor(t, rctx, "n2 back in service", func() bool {
				if regexp.MustCompile(`^(idle|mixed|allocated)\n$`).MatchString(c.Command(t, "sinfo", "-h", "-n", "n2", "-o", "%T")) {
					return true
				}
				resume := exec.Command("scontrol", "update", "nodename=n2", "state=resume")
				resume.Env = c.Env()
				_ = resume.Run()
				return false
			})
		}()
		var r *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the run to end", func() bool {
			resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
			if err != nil {
				t.Fatal(err)
			}
			r = resp.Msg.Run
			return r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED ||
				r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
		})
		if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.HasPrefix(r.Reason, "node lost: ") || !strings.Contains(r.Reason, "NODE_FAIL") {
			t.Errorf("run %s: %s (%s), want failed with node lost: … NODE_FAIL", id, r.State, r.Reason)
		}
	})
}
