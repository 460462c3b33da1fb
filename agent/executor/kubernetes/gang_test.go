package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// asRank makes the attempt rank's of a 2-node gang whose run is
// alloc-abc, as the agent's run loop gives it (rendezvous.Gang.Rank).
func asRank(t *testing.T, rank int) func(*executor.Attempt) {
	return func(a *executor.Attempt) {
		env, err := rendezvous.Gang{NodeRank: rank, Nodes: 2, LocalRanks: 1, MasterAddr: rendezvous.PodAddress, MasterPort: 29517}.Rank(0)
		if err != nil {
			t.Fatal(err)
		}
		if rank > 0 {
			for i, kv := range a.Env {
				if strings.HasPrefix(kv, executor.EnvAllocID+"=") {
					a.Env[i] = executor.EnvAllocID + "=alloc-abc-r1"
				}
			}
		}
		a.Env = append(a.Env, env...)
	}
}

func envOf(pod corev1.PodSpec) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range pod.Containers[0].Env {
		m[e.Name] = e
	}
	return m
}

// TestRunnerGangRendezvous (issue #34): each rank of a gang is a Job of
// its own, labelled with the gang and rank. Rank 0's pod reads its own IP
// for MASTER_ADDR (the downward API); rank 1's Job is made only once rank
// 0's pod has an IP, with that IP as MASTER_ADDR: the cluster may have no
// DNS, and the broker's placeholder address never reaches a job.
func TestRunnerGangRendezvous(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	shared := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r0 := startRun(t, ctx, api, newRunner(shared), filepath.Join(shared, "alloc-abc"), asRank(t, 0))
	var job0 = getJob(api, "gpupass-alloc-abc-1")
	waitFor(t, "rank 0's job", func() bool { job0 = getJob(api, "gpupass-alloc-abc-1"); return job0 != nil })
	env0 := envOf(job0.Spec.Template.Spec)
	for _, k := range []string{"MASTER_ADDR", "PET_MASTER_ADDR", "GPUPASS_MASTER_ADDR"} {
		e := env0[k]
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
			t.Errorf("rank 0's %s = %+v, want its pod's IP (status.podIP)", k, e)
		}
	}
	if env0["MASTER_PORT"].Value != "29517" || env0["RANK"].Value != "0" || env0["WORLD_SIZE"].Value != "2" {
		t.Errorf("rank 0's rendezvous env %v", env0)
	}
	if l := job0.Spec.Template.Labels; l[LabelGang] != "alloc-abc" || l[LabelRank] != "0" {
		t.Errorf("rank 0's pod labels %v", l)
	}

	r1 := startRun(t, ctx, api, newRunner(shared), filepath.Join(shared, "alloc-abc-r1"), asRank(t, 1))
	time.Sleep(100 * time.Millisecond)
	if j := getJob(api, "gpupass-alloc-abc-r1-1"); j != nil {
		t.Fatal("rank 1's job was made before rank 0's pod had an IP")
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-abc-1-x", Namespace: "gpupass", Labels: job0.Spec.Template.Labels,
		Annotations: job0.Spec.Template.Annotations}, Spec: job0.Spec.Template.Spec, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	if _, err := api.CoreV1().Pods("gpupass").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if j := getJob(api, "gpupass-alloc-abc-r1-1"); j != nil {
		t.Fatal("rank 1's job was made before rank 0's pod had an IP")
	}
	pod.Status.PodIP, pod.Status.Phase = "10.244.0.7", corev1.PodRunning
	if _, err := api.CoreV1().Pods("gpupass").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var job1 = getJob(api, "gpupass-alloc-abc-r1-1")
	waitFor(t, "rank 1's job", func() bool { job1 = getJob(api, "gpupass-alloc-abc-r1-1"); return job1 != nil })
	env1 := envOf(job1.Spec.Template.Spec)
	for _, k := range []string{"MASTER_ADDR", "PET_MASTER_ADDR", "GPUPASS_MASTER_ADDR"} {
		if e := env1[k]; e.Value != "10.244.0.7" || e.ValueFrom != nil {
			t.Errorf("rank 1's %s = %+v, want rank 0's pod IP 10.244.0.7", k, e)
		}
	}
	if env1["RANK"].Value != "1" || env1["NODE_RANK"].Value != "1" || env1["MASTER_PORT"].Value != "29517" {
		t.Errorf("rank 1's rendezvous env %v", env1)
	}
	if l := job1.Spec.Template.Labels; l[LabelGang] != "alloc-abc" || l[LabelRank] != "1" || l[LabelAlloc] != "alloc-abc-r1" {
		t.Errorf("rank 1's pod labels %v", l)
	}
	cancel()
	<-r0.done
	<-r1.done
}

// TestRunnerGangRankZeroEnded: a rank whose rank 0 (of this attempt:
// its rendezvous port) ended before it had started fails to start, saying so, instead of waiting for a
// rendezvous nobody hosts.
func TestRunnerGangRankZeroEnded(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-abc-1-x", Namespace: "gpupass",
		Labels:      map[string]string{LabelManagedBy: managedBy, LabelKind: "run", LabelAlloc: "alloc-abc", LabelRendezvous: "29517"},
		Annotations: map[string]string{AnnotationAlloc: "alloc-abc"}}, Status: corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.244.0.7"}}
	api := fake.NewClientset(pod)
	shared := t.TempDir()
	r1 := startRun(t, context.Background(), api, newRunner(shared), filepath.Join(shared, "alloc-abc-r1"), asRank(t, 1))
	ex := <-r1.done
	if ex.StartErr == nil || !strings.Contains(ex.StartErr.Error(), "rank 0's pod gpupass-alloc-abc-1-x ended before this rank started") {
		t.Errorf("exit %+v, want a start error naming rank 0's ended pod", ex)
	}
	if j := getJob(api, "gpupass-alloc-abc-r1-1"); j != nil {
		t.Error("rank 1's job was made")
	}
}

// TestMeasureForRun (issue #34): at a run's start (agent.ForRun) the
// node is measured in a check Job asking for the run's GPUs, beside the
// run Jobs already on the node (a gang's other rank there); the node's
// own suite still asks for all its GPUs and waits for no run Job.
func TestMeasureForRun(t *testing.T) {
	t.Parallel()
	running := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-abc-1", Namespace: "gpupass",
		Labels: map[string]string{LabelManagedBy: managedBy, LabelKind: "run", LabelNode: "gpu-1"}}}
	api := fake.NewClientset(running)
	shared := t.TempDir()
	n := &kubeNode{client: &Client{API: api, Namespace: "gpupass", Image: "localhost/run@sha256:" + strings.Repeat("a", 64), Poll: 5 * time.Millisecond,
		Volume: SharedDir{Path: shared}}, cluster: "kind", name: "gpu-1", flags: Flags{SharedDir: shared, AgentBinary: "gpupass-agent"}, log: slog.Default()}
	n.node.Set(Node{Name: "gpu-1", GPUs: 4})

	if _, err := n.Measure(context.Background(), &agent.Options{}); err == nil || !strings.Contains(err.Error(), "not measured: the node runs kubernetes job gpupass-alloc-abc-1") {
		t.Errorf("the node's own suite beside a run: %v, want it not measured", err)
	}

	ctx, cancel := context.WithCancel(agent.ForRun(context.Background(), 1))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := n.Measure(ctx, &agent.Options{})
		done <- err
	}()
	var check *batchv1.Job
	waitFor(t, "the check job", func() bool {
		jobs, _ := api.BatchV1().Jobs("gpupass").List(context.Background(), metav1.ListOptions{LabelSelector: LabelKind + "=check"})
		if len(jobs.Items) == 1 {
			check = &jobs.Items[0]
		}
		return check != nil
	})
	if q := check.Spec.Template.Spec.Containers[0].Resources.Limits[GPUResource]; q.Value() != 1 {
		t.Errorf("a run's check asks for %s GPUs, want the run's 1", q.String())
	}
	cancel()
	<-done
}

// TestRunnerGangRestartLeftoverJob (issue #34): a gang's restart places
// every rank again, and each rank's attempts count from 1 again, so the
// Job its first placement left (ended, kept for its TTL) has the new
// attempt's name. A fresh attempt deletes it and makes its own rather
// than following the old one to its old end; rank 1 waits for the pod of
// this attempt's rank 0 (its rendezvous port), not the one that ended.
func TestRunnerGangRestartLeftoverJob(t *testing.T) {
	t.Parallel()
	failed := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}
	old := func(name, alloc string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpupass", UID: "first-placement",
			Labels: map[string]string{LabelManagedBy: managedBy, LabelKind: "run", LabelAlloc: alloc, LabelAttempt: "1", LabelGang: "alloc-abc"}},
			Status: batchv1.JobStatus{Failed: 1, Conditions: []batchv1.JobCondition{failed}}}
	}
	// Rank 0's pod of the first placement ended, with the old port.
	oldPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-abc-1-old", Namespace: "gpupass",
		Labels:      map[string]string{LabelManagedBy: managedBy, LabelKind: "run", LabelAlloc: "alloc-abc", LabelAttempt: "1", LabelRendezvous: "29500"},
		Annotations: map[string]string{AnnotationAlloc: "alloc-abc"}}, Status: corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.244.0.5"}}
	api := fake.NewClientset(old("gpupass-alloc-abc-1", "alloc-abc"), old("gpupass-alloc-abc-r1-1", "alloc-abc-r1"), oldPod)
	shared := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r1 := startRun(t, ctx, api, newRunner(shared), filepath.Join(shared, "alloc-abc-r1"), asRank(t, 1))
	r0 := startRun(t, ctx, api, newRunner(shared), filepath.Join(shared, "alloc-abc"), asRank(t, 0))
	var job0 *batchv1.Job
	waitFor(t, "rank 0's new job", func() bool {
		job0 = getJob(api, "gpupass-alloc-abc-1")
		return job0 != nil && job0.UID != "first-placement"
	})
	if l := job0.Spec.Template.Labels; l[LabelRendezvous] != "29517" {
		t.Errorf("rank 0's pod labels %v, want the attempt's rendezvous port 29517", l)
	}
	select {
	case ex := <-r1.done:
		t.Fatalf("rank 1 ended before this attempt's rank 0 had a pod: %+v", ex)
	case ex := <-r0.done:
		t.Fatalf("rank 0 ended with the first placement's job: %+v", ex)
	case <-time.After(100 * time.Millisecond):
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-abc-1-new", Namespace: "gpupass", Labels: job0.Spec.Template.Labels,
		Annotations: job0.Spec.Template.Annotations}, Spec: job0.Spec.Template.Spec, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.9"}}
	if _, err := api.CoreV1().Pods("gpupass").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var job1 *batchv1.Job
	waitFor(t, "rank 1's new job", func() bool {
		job1 = getJob(api, "gpupass-alloc-abc-r1-1")
		return job1 != nil && job1.UID != "first-placement"
	})
	if e := envOf(job1.Spec.Template.Spec)["MASTER_ADDR"]; e.Value != "10.244.0.9" {
		t.Errorf("rank 1's MASTER_ADDR %+v, want this attempt's rank 0 pod IP 10.244.0.9", e)
	}
	cancel()
	<-r0.done
	<-r1.done
}

// TestRunnerGangLinkStep (issue #34): a gang rank's pod measures the
// link before its command, at the gang's rendezvous (MASTER_ADDR, the
// pod IP; a port of its own beside MASTER_PORT, so the command's
// rendezvous is never the step's), and the agent hears the step's
// result from the shared dir once. The pod's command is run here as the
// kubelet would run it, with a stand-in for the measurement (the real
// one is torch's, run by TestE2EKubernetesGang): a pod with no such
// Python records why and runs the command, an earlier placement's result
// is never taken for this one's, and --require-bandwidth ends the pod
// with status 3 and both figures before the command.
func TestRunnerGangLinkStep(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	// The stand-in writes what it saw of the rendezvous as allreduce.py
	// writes its result: into its last argument, through a renamed file.
	const standIn = `import json, os, sys
r = {"backend": "gloo", "ranks": 2, "busbw_gbps": 4.5, "master_addr": os.environ["MASTER_ADDR"], "port": os.environ["MASTER_PORT"], "rank": os.environ["NODE_RANK"]}
open(sys.argv[-1] + ".tmp", "w").write(json.dumps(r) + "\n")
os.replace(sys.argv[-1] + ".tmp", sys.argv[-1])
`
	for _, tc := range []struct {
		name    string
		python  string
		min     float64
		stale   bool
		code    int
		wantOut string
		wantWhy string
		wantLog string
	}{
		{name: "measured", python: py, code: 0, wantOut: `"master_addr": "10.244.0.7", "port": "29518", "rank": "0"`, wantLog: "COMMAND at 10.244.0.7:29517"},
		{name: "no python in the image", python: "/nonexistent/python3", stale: true, code: 0, wantWhy: "the link step printed no result: ", wantLog: "COMMAND at 10.244.0.7:29517"},
		{name: "required, below", python: py, min: 25, code: 3, wantOut: `"busbw_gbps": 4.5`,
			wantLog: "gpupass: the link measured 4.500 Gbit/s, below the declared 25 Gbit/s (--require-bandwidth): the command does not start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := fake.NewClientset()
			shared := t.TempDir()
			dir := filepath.Join(shared, "alloc-abc")
			base := filepath.Join(dir, ".kube", "attempt-1")
			if tc.stale {
				// An earlier placement's result under this attempt's name.
				if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(executor.LinkResultFile(base), []byte(`{"backend": "gloo", "ranks": 2, "busbw_gbps": 99}`+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var calls int
			var heard, why string
			var notes []string
			step := &executor.LinkStep{Python: tc.python, Script: standIn, Args: []string{"1", "2"}, MinGbps: tc.min, DeclaredGbps: 25,
				Measured: func(out []byte, err error) (string, error) {
					calls++
					heard = strings.TrimSpace(string(out))
					if err != nil {
						why = err.Error()
						return "link not measured", nil
					}
					if tc.min > 0 {
						return "link measured", errors.New("network.allreduce_gbps: measured 4.5 Gbit/s, below the declared 25 Gbit/s (--require-bandwidth)")
					}
					return "link measured", nil
				}}
			fr := startRun(t, context.Background(), api, newRunner(shared), dir, asRank(t, 0), func(a *executor.Attempt) {
				a.Link = step
				a.Command = []string{"/bin/sh", "-c", `echo "COMMAND at $MASTER_ADDR:$MASTER_PORT"`}
				a.Note = func(msg string, _ map[string]string) { notes = append(notes, msg) }
			})
			var job *batchv1.Job
			waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
			if _, err := os.Stat(executor.LinkResultFile(base)); err == nil {
				t.Error("an earlier placement's link result is still there when the pod is made")
			}
			// The pod's command, as the kubelet runs it: its env, rank
			// 0's MASTER_ADDR its pod IP (the downward API).
			ctr := job.Spec.Template.Spec.Containers[0]
			cmd := exec.Command(ctr.Command[0], ctr.Command[1:]...)
			cmd.Dir = ctr.WorkingDir
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			for _, e := range ctr.Env {
				v := e.Value
				if e.ValueFrom != nil {
					v = "10.244.0.7"
				}
				cmd.Env = append(cmd.Env, e.Name+"="+v)
			}
			b, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || len(b) != 0 {
				t.Errorf("the pod's command: status %d, printed %q outside its files; want status %d", code, b, tc.code)
			}
			pod := createPod(t, api, job)
			if code == 0 {
				setEnd(t, api, job, pod, cond(batchv1.JobComplete, ""), corev1.PodSucceeded, 0)
			} else {
				setEnd(t, api, job, pod, cond(batchv1.JobFailed, "BackoffLimitExceeded"), corev1.PodFailed, int32(code))
			}
			ex := <-fr.done
			log := strings.Join(fr.texts(), "\n")
			t.Logf("exit %+v; log %q; notes %q", ex, log, notes)
			if calls != 1 || !strings.Contains(heard, tc.wantOut) || !strings.Contains(why, tc.wantWhy) || (why == "") != (tc.wantWhy == "") {
				t.Errorf("Measured called %d time(s), heard %q, why %q; want once, %q, why %q", calls, heard, why, tc.wantOut, tc.wantWhy)
			}
			if !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, "link ") }) {
				t.Errorf("the run's notes %q lack what Measured said", notes)
			}
			if !strings.Contains(log, tc.wantLog) || (tc.code != 0) == strings.Contains(log, "COMMAND") {
				t.Errorf("the run's log %q; want %q, the command run only without --require-bandwidth's failure", log, tc.wantLog)
			}
			if tc.code == 0 && (ex.Code != 0 || ex.Reason != "") {
				t.Errorf("exit %+v, want success", ex)
			}
			if tc.code != 0 && (ex.Code != 3 || !strings.Contains(ex.Reason, "measured 4.5 Gbit/s, below the declared 25 Gbit/s (--require-bandwidth)")) {
				t.Errorf("exit %+v, want status 3 naming both figures", ex)
			}
		})
	}
}

// TestRunnerGangLinkFollowedOn: rank 0's attempt followed on after its
// agent restarted (Attempt.From) keeps the result its pod's step wrote
// already, and the agent hears it: only a fresh attempt clears an
// earlier placement's.
func TestRunnerGangLinkFollowedOn(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	shared := t.TempDir()
	dir := filepath.Join(shared, "alloc-abc")
	base := filepath.Join(dir, ".kube", "attempt-1")
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	const result = `{"backend": "gloo", "ranks": 2, "busbw_gbps": 4.5, "master_addr": "10.244.0.7"}`
	if err := os.WriteFile(executor.LinkResultFile(base), []byte(result+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var heard []string
	step := &executor.LinkStep{Python: "/usr/bin/python3", Script: "pass", DeclaredGbps: 25,
		Measured: func(out []byte, err error) (string, error) {
			heard = append(heard, fmt.Sprintf("%s %v", strings.TrimSpace(string(out)), err))
			return "link measured", nil
		}}
	fr := startRun(t, context.Background(), api, newRunner(shared), dir, asRank(t, 0), func(a *executor.Attempt) {
		a.Link, a.From = step, &executor.Offsets{}
	})
	var job *batchv1.Job
	waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
	pod := createPod(t, api, job)
	setEnd(t, api, job, pod, cond(batchv1.JobComplete, ""), corev1.PodSucceeded, 0)
	ex := <-fr.done
	if len(heard) != 1 || heard[0] != result+" <nil>" {
		t.Errorf("Measured heard %q, want once the result the pod's step wrote before the restart, %q (exit %+v)", heard, result, ex)
	}
}
