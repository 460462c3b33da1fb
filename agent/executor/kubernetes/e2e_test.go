//go:build e2e

package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2EKubernetesCluster drives the binaries against the real one-node
// cluster: one gpupass-agent --executor kubernetes stands for its GPU
// node in region k8s-eu, next to up's local agent in us-west-2.
func TestE2EKubernetesCluster(t *testing.T) {
	c := k8stest.Require(t)
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"},
		Env: []string{"GPUPASS_RUN_LOG_LINES_PER_SECOND=-1", "GPUPASS_RUN_MAX_RECORDS_PER_SECOND=-1"}})
	cfg := stack.Config(t)
	rc, err := brokerclient.DialRuns(cfg.BrokerURL, brokerclient.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(t)
	image := c.RunImage(t, filepath.Join(stack.Bin, "gpupass-agent"))
	// The shared dir is a hostPath on the one node, which is this
	// machine: the agent and the pods see it at the same path.
	shared, err := os.MkdirTemp("", "gpupass-k8s-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	kubeArgs := func(extra ...string) []string {
		return append([]string{"--executor", "kubernetes", "--kubeconfig", c.Kubeconfig, "--kube-namespace", ns, "--kube-image", image,
			"--kube-cluster", "gptest", "--kube-shared-dir", shared, "--kube-refresh", "1s", "--suite-interval", "2s"}, extra...)
	}
	agent := stack.StartAgent(t, "k8s", "k8s-eu", kubeArgs()...)
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }
	dryRun := func(region string) string {
		out, _ := gp("validate", "--spec", "examples/train/gpupass.yaml", "--dry-run", "--region", region).CombinedOutput()
		return string(out)
	}
	getRun := func(id string) *gpupassv1.Run {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Run
	}
	submit := func(t *testing.T, name string, args ...string) string {
		out, err := gp(append([]string{"--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "k8s-eu",
			"--workdir", "examples/train", "--name", name, "--", py, "train.py"}, args...)...).Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		if id == "" {
			t.Fatalf("no allocation id in %s", out)
		}
		return id
	}
	jobsOf := func(id string) string {
		return c.Kubectl(t, "-n", ns, "get", "jobs", "-l", "gpupass.dev/alloc="+id, "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[*].type}{\"\\n\"}{end}")
	}

	t.Run("dry-run lists the node with its GPUs", func(t *testing.T) {
		var out string
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("last dry-run:\n%s", out)
			}
		}()
		upstack.WaitFor(t, wctx, "the kubernetes node in dry-run", func() bool {
			out = dryRun("k8s-eu")
			return regexp.MustCompile(`kubernetes:gptest +k8s-eu +a100-80gb x4 .*online, simulated`).MatchString(out)
		})
		nodes, _ := gp("--output", "json", "nodes").CombinedOutput()
		for _, want := range []string{`"provider":"kubernetes:gptest"`, `"hostname":"` + c.NodeName + `"`} {
			if !strings.Contains(strings.ReplaceAll(string(nodes), " ", ""), want) {
				t.Errorf("gpupass nodes lacks %s:\n%s", want, nodes)
			}
		}
		rep, _ := os.ReadFile(filepath.Join(agent.State, "kubernetes", "gptest-"+c.NodeName, "report.json"))
		if !strings.Contains(string(rep), `"name":"kubernetes.node"`) || !strings.Contains(string(rep), image) {
			t.Errorf("the signed report names neither the kubernetes node check nor the image %s:\n%s", image, rep)
		}
	})

	t.Run("train as a Job equals the local executor's curve", func(t *testing.T) {
		var out upstack.Buffer
		train := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--region", "k8s-eu",
			"--workdir", "examples/train", "--name", "k8s-e2e", "--follow", "--", py, "train.py", "--steps", "30", "--checkpoint-every", "10")
		train.Stdout, train.Stderr = &out, &out
		if err := train.Run(); err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(out.String(), 4000))
		}
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		series := map[string][]float64{}
		lines := map[string][]string{}
		for _, r := range resp.Msg.Runs {
			if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
				t.Errorf("%s (%s): %s reason %q", r.Id, r.Region, r.State, r.Reason)
			}
			text, _ := upstack.RunLog(t, ctx, rc, r.Id)
			// The trainer's own lines (the executor's events differ:
			// a Job's states, the local process), less what differs
			// by nature: the work dir in checkpoint paths, the time.
			for _, l := range strings.Split(text, "\n") {
				var ev struct{ Component, Msg string }
				if json.Unmarshal([]byte(l), &ev) != nil || !slices.Contains([]string{"dataloader", "trainer", "checkpoint"}, ev.Component) {
					continue
				}
				if strings.HasPrefix(ev.Msg, "done in ") || strings.Contains(ev.Msg, "shipped for resuming elsewhere") {
					// The time; the agent's shipping of the newest
					// checkpoint, which depends on when it looked.
					continue
				}
				if i := strings.LastIndex(ev.Msg, "/"); i >= 0 {
					ev.Msg = ev.Msg[:strings.LastIndex(ev.Msg[:i], " ")+1] + ev.Msg[i+1:]
				}
				lines[r.Region] = append(lines[r.Region], ev.Component+": "+ev.Msg)
			}
			if r.Region == "k8s-eu" && !strings.Contains(text, "kubernetes job gpupass-"+r.Id) {
				t.Errorf("the k8s-eu run's log names no kubernetes job gpupass-%s", r.Id)
			}
			if r.Region == "k8s-eu" {
				// The spec asks for one accelerator (resources.count 1): the
				// pod asks for one of the node's four, not all of them.
				got := c.Kubectl(t, "-n", ns, "get", "jobs", "-l", "gpupass.dev/alloc="+r.Id,
					"-o", `jsonpath={.items[*].spec.template.spec.containers[0].resources.requests.nvidia\.com/gpu}`)
				if got != "1" {
					t.Errorf("the run's Job asks for %q %s, want 1 (the spec's resources.count, of the node's %d)", got, k8stest.GPUResource, k8stest.GPUs)
				}
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
		if len(lines["k8s-eu"]) == 0 {
			t.Errorf("no trainer lines through kubernetes")
		}
		if d := cmp.Diff(lines["us-west-2"], lines["k8s-eu"]); d != "" {
			t.Errorf("the trainer's lines through kubernetes differ from the local run's (-local +kubernetes):\n%s", d)
		}
		if len(series["k8s-eu"]) != 30 || len(series["us-west-2"]) != 30 {
			t.Fatalf("loss series lengths: %d through kubernetes, %d local; want 30", len(series["k8s-eu"]), len(series["us-west-2"]))
		}
		for i := range series["k8s-eu"] {
			if series["k8s-eu"][i] != series["us-west-2"][i] {
				t.Fatalf("step %d: loss %v through kubernetes, %v local", i+1, series["k8s-eu"][i], series["us-west-2"][i])
			}
		}
	})

	t.Run("a run's pod has no capabilities, no token, no_new_privs and the runtime's seccomp filter", func(t *testing.T) {
		// What the job itself sees, from inside its pod: the kernel's
		// view of the process (/proc/self/status), not the pod spec.
		probe := `import os, re
s = open("/proc/self/status").read()
f = dict(re.findall(r"^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):\s*(\S+)", s, re.M))
print("confinement " + " ".join(k + "=" + f.get(k, "?") for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")) +
      " token=" + ("present" if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount") else "absent"), flush=True)`
		out, err := gp("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "k8s-eu",
			"--workdir", "examples/train", "--name", "k8s-confined", "--", py, "-c", probe).Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		var r *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the run to end", func() bool {
			r = getRun(id)
			return r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
		})
		text, _ := upstack.RunLog(t, ctx, rc, id)
		if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %s: %s (%s)\n%s", id, r.State, r.Reason, upstack.Tail(text, 3000))
		}
		got := regexp.MustCompile(`confinement CapEff=[^"\\]*`).FindString(text)
		const want = "confinement CapEff=0000000000000000 CapPrm=0000000000000000 CapBnd=0000000000000000 NoNewPrivs=1 Seccomp=2 token=absent"
		if got != want {
			t.Errorf("inside the run's pod:\n got %s\nwant %s\nlog:\n%s", got, want, upstack.Tail(text, 3000))
		}
	})

	t.Run("gpupass cancel deletes the Job", func(t *testing.T) {
		id := submit(t, "k8s-cancel", "--steps", "100000", "--sleep", "0.2")
		upstack.WaitFor(t, ctx, "the run's job to run", func() bool {
			if r := getRun(id); r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
				t.Fatalf("the run ended %v before its job ran: %s", r.State, r.Reason)
			}
			return strings.Contains(c.Kubectl(t, "-n", ns, "get", "pods", "-l", "gpupass.dev/alloc="+id, "-o", "jsonpath={.items[*].status.phase}"), "Running")
		})
		if b, err := gp("cancel", id).CombinedOutput(); err != nil {
			t.Fatalf("gpupass cancel: %v\n%s", err, b)
		}
		upstack.WaitFor(t, ctx, "the run to end cancelled", func() bool {
			return getRun(id).State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
		})
		// The run ends once its Job and pod are gone (deleted in the
		// foreground with the grace period).
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		upstack.WaitFor(t, wctx, "the run's job to go", func() bool { return jobsOf(id) == "" })
	})

	t.Run("cordon takes the node out of dry-run with the reason", func(t *testing.T) {
		c.Kubectl(t, "cordon", c.NodeName)
		defer c.Kubectl(t, "uncordon", c.NodeName)
		var out string
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("last dry-run:\n%s", out)
			}
		}()
		upstack.WaitFor(t, wctx, "the cordon in dry-run", func() bool {
			rep, _ := os.ReadFile(filepath.Join(agent.State, "kubernetes", "gptest-"+c.NodeName, "report.json"))
			if !strings.Contains(string(rep), "kubernetes node "+c.NodeName+" is cordoned") {
				return false
			}
			out = dryRun("k8s-eu")
			return strings.Contains(out, "0 candidate(s)") && strings.Contains(out, "failed checks")
		})
		t.Logf("dry-run after cordon:\n%s", out)
	})

	t.Run("kill -9 of the agent mid-run: the restarted agent finds the Job by name and follows it on, every record once", func(t *testing.T) {
		const steps = 40
		upstack.WaitFor(t, ctx, "the node back in dry-run", func() bool {
			return regexp.MustCompile(`kubernetes:gptest +k8s-eu .*online`).MatchString(dryRun("k8s-eu"))
		})
		id := submit(t, "k8s-kill9", "--steps", strconv.Itoa(steps), "--checkpoint-every", "1", "--sleep", "0.1")
		logText := func() string { l, _ := upstack.RunLog(t, ctx, rc, id); return l }
		// Mid-run: the Job runs and the broker holds some of its
		// checkpoint lines, not the last.
		upstack.WaitFor(t, ctx, "the run's job to be a few steps in", func() bool {
			return strings.Contains(logText(), "ckpt-00000003.pt")
		})
		agent.Kill9(t)
		if strings.Contains(logText(), fmt.Sprintf("/ckpt-%08d.pt\"}", steps)) {
			t.Fatalf("the run was over before the kill")
		}
		agent.Restart(t)
		defer func() {
			if t.Failed() {
				t.Logf("the run's log:\n%s", upstack.Tail(logText(), 6000))
			}
		}()
		var r *gpupassv1.Run
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		defer wcancel()
		upstack.WaitFor(t, wctx, "the run to end", func() bool {
			r = getRun(id)
			return r.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING && r.State != gpupassv1.AllocState_ALLOC_STATE_STARTING
		})
		if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %s: %s (%s), want succeeded: the restarted agent follows the Job on", id, r.State, r.Reason)
		}
		upstack.CheckFollowedOn(t, ctx, rc, id, steps)
		// The Job controller writes Complete a moment after the pod ended.
		oneComplete := regexp.MustCompile(`^gpupass-` + id + `-1 [A-Za-z ]*\bComplete\b[A-Za-z ]*\n$`)
		var j string
		jctx, jcancel := context.WithTimeout(ctx, 30*time.Second)
		defer jcancel()
		upstack.WaitFor(t, jctx, "the run's one job Complete (found again, not created twice): "+j, func() bool {
			j = jobsOf(id)
			return oneComplete.MatchString(j) || strings.Count(j, "\n") > 1
		})
		if !oneComplete.MatchString(j) {
			t.Errorf("the run's jobs: %q, want one, Complete (found again, not created twice)", j)
		}
	})

	t.Run("a Job past its deadline ends failed with the reason", func(t *testing.T) {
		// The run's own limit (train --time-limit, over the spec's
		// resources.time-limit) reaches the Job as activeDeadlineSeconds:
		// Kubernetes, not the agent, ends the pod. The node is a candidate
		// again once its agent measured it after the last case's Job.
		upstack.WaitFor(t, ctx, "the node back in dry-run", func() bool {
			return regexp.MustCompile(`kubernetes:gptest +k8s-eu .*online`).MatchString(dryRun("k8s-eu"))
		})
		out, err := gp("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "k8s-eu", "--time-limit", "5s",
			"--workdir", "examples/train", "--name", "k8s-deadline", "--", py, "train.py", "--steps", "100000", "--sleep", "0.2").Output()
		if err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(string(out))
		var r *gpupassv1.Run
		upstack.WaitFor(t, ctx, "the run to fail", func() bool {
			r = getRun(id)
			return r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED
		})
		if !strings.HasPrefix(r.Reason, "TIMEOUT: ") || !strings.Contains(r.Reason, "DeadlineExceeded (activeDeadlineSeconds 5)") {
			t.Errorf("reason %q, want TIMEOUT with Kubernetes' DeadlineExceeded", r.Reason)
		}
	})
}
