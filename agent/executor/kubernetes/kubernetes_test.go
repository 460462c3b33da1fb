package kubernetes

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpupass/gpupass/agent/executor"
)

func gpuNode(name string, mod func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", LabelGPUCount: "8"}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{GPUResource: resource.MustParse("8")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	if mod != nil {
		mod(n)
	}
	return n
}

func TestNodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mod  func(*corev1.Node)
		want string // Unavailable(); "-" for not a GPU node
	}{
		{"ready", nil, ""},
		{"gpu taint is tolerated", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"cordoned", func(n *corev1.Node) {
			n.Spec.Unschedulable = true
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}}
		}, "kubernetes node n is cordoned"},
		{"not ready", func(n *corev1.Node) {
			n.Status.Conditions[0].Status, n.Status.Conditions[0].Reason = corev1.ConditionFalse, "KubeletNotReady"
		}, "kubernetes node n is not ready: Ready=False (KubeletNotReady)"},
		{"memory pressure", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue})
		}, "kubernetes node n is under MemoryPressure"},
		{"pressure taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/disk-pressure", Effect: corev1.TaintEffectNoSchedule}}
		}, "kubernetes node n is tainted node.kubernetes.io/disk-pressure:NoSchedule"},
		{"device plugin gone, labels stay", func(n *corev1.Node) {
			delete(n.Status.Allocatable, GPUResource)
		}, "kubernetes node n is no allocatable nvidia.com/gpu"},
		{"no gpus", func(n *corev1.Node) {
			n.Labels = nil
			delete(n.Status.Allocatable, GPUResource)
		}, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &Client{API: fake.NewClientset(gpuNode("n", tt.mod)), Namespace: "gpupass"}
			nodes, err := c.Nodes(context.Background(), "")
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "-" {
				if len(nodes) != 0 {
					t.Fatalf("a node without GPUs was listed: %+v", nodes)
				}
				return
			}
			if len(nodes) != 1 {
				t.Fatalf("got %d nodes, want 1", len(nodes))
			}
			if got := nodes[0].Unavailable(); got != tt.want {
				t.Errorf("Unavailable() = %q, want %q", got, tt.want)
			}
			if nodes[0].Product != "NVIDIA-H100-80GB-HBM3" {
				t.Errorf("product %q", nodes[0].Product)
			}
		})
	}
}

func TestCheckImage(t *testing.T) {
	t.Parallel()
	for ref, ok := range map[string]bool{
		"localhost/gpupass-run@sha256:" + strings.Repeat("a", 64):    true,
		"localhost/gpupass-run:v1@sha256:" + strings.Repeat("0", 64): true,
		"localhost/gpupass-run:v1":                                   false,
		"localhost/gpupass-run@sha256:" + strings.Repeat("A", 64):    false,
		"gpupass-run@sha256:abc":                                     false,
		"x@sha256:" + strings.Repeat("a", 64) + " --privileged":      false,
	} {
		if err := CheckImage(ref); (err == nil) != ok {
			t.Errorf("CheckImage(%q) = %v, want ok %v", ref, err, ok)
		}
	}
}

func jobWith(conds ...batchv1.JobCondition) *batchv1.Job {
	d := int64(60)
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-alloc-1-1"}, Spec: batchv1.JobSpec{ActiveDeadlineSeconds: &d},
		Status: batchv1.JobStatus{Conditions: conds}}
}

func cond(t batchv1.JobConditionType, reason string) batchv1.JobCondition {
	return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason}
}

func podIn(phase corev1.PodPhase, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: phase}}
	if mod != nil {
		mod(p)
	}
	return p
}

func exited(code int32, reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "run", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		job   *batchv1.Job
		pod   *corev1.Pod
		phase Phase
		exit  executor.Exit
		fatal bool
	}{
		{"no pod yet", jobWith(), nil, Pending, executor.Exit{}, false},
		{"unschedulable", jobWith(), podIn(corev1.PodPending, func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available"}}
		}), Pending, executor.Exit{}, false},
		{"bad image never starts", jobWith(), podIn(corev1.PodPending, func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "run", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "InvalidImageName"}}}}
		}), Pending, executor.Exit{}, true},
		{"running", jobWith(), podIn(corev1.PodRunning, nil), Running, executor.Exit{}, false},
		{"complete", jobWith(cond(batchv1.JobComplete, "")), podIn(corev1.PodSucceeded, exited(0, "Completed")), Ended, executor.Exit{Code: 0}, false},
		{"exit 3", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(3, "Error")), Ended,
			executor.Exit{Code: 3, Reason: "kubernetes job gpupass-alloc-1-1 on n1: Failed (exit code 3)"}, false},
		{"pod failed, job not yet updated", jobWith(), podIn(corev1.PodFailed, exited(3, "Error")), Ended,
			executor.Exit{Code: 3, Reason: "kubernetes job gpupass-alloc-1-1 on n1: Failed (exit code 3)"}, false},
		{"oom", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(137, "OOMKilled")), Ended,
			executor.Exit{Code: 137, Reason: "kubernetes job gpupass-alloc-1-1 on n1: Failed (OOMKilled, exit code 137)"}, false},
		{"deadline, pod still terminating", jobWith(cond(batchv1.JobFailureTarget, "DeadlineExceeded")), podIn(corev1.PodRunning, func(p *corev1.Pod) {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}), Running, executor.Exit{}, false},
		{"deadline", jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")), nil, Ended,
			executor.Exit{Code: -1, Reason: "TIMEOUT: kubernetes job gpupass-alloc-1-1: Failed (DeadlineExceeded (activeDeadlineSeconds 60), its pod is gone)"}, false},
		{"evicted", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, func(p *corev1.Pod) {
			p.Status.Reason, p.Status.Message = "Evicted", "The node was low on resource: memory."
		}), Ended, executor.Exit{Code: -1, NodeLost: true, Reason: "node lost: kubernetes job gpupass-alloc-1-1 on n1: Failed (Evicted, The node was low on resource: memory.)"}, false},
		{"preempted", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, func(p *corev1.Pod) {
			exited(143, "Error")(p)
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
		}), Ended, executor.Exit{Code: 143, NodeLost: true, Reason: "node lost: kubernetes job gpupass-alloc-1-1 on n1: Failed (exit code 143, disrupted: PreemptionByScheduler)"}, false},
		{"node gone with the pod", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), nil, Ended,
			executor.Exit{Code: -1, NodeLost: true, Reason: "node lost: kubernetes job gpupass-alloc-1-1: Failed (its pod is gone)"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := classify(tt.job, tt.pod)
			if st.phase != tt.phase {
				t.Errorf("phase %d, want %d (%s)", st.phase, tt.phase, st.note)
			}
			if diff := cmp.Diff(tt.exit, st.exit); diff != "" {
				t.Errorf("exit (-want +got):\n%s", diff)
			}
			if (st.fatal != "") != tt.fatal {
				t.Errorf("fatal %q, want %v", st.fatal, tt.fatal)
			}
		})
	}
}

// fakeRun runs one attempt against a fake clientset, in the background.
type fakeRun struct {
	api   *fake.Clientset
	dir   string
	mu    sync.Mutex
	lines []executor.Line
	done  chan executor.Exit
}

func startRun(t *testing.T, ctx context.Context, api *fake.Clientset, r *Runner, dir string, mods ...func(*executor.Attempt)) *fakeRun {
	t.Helper()
	fr := &fakeRun{api: api, dir: dir, done: make(chan executor.Exit, 1)}
	r.Client.API = api
	a := executor.Attempt{Command: []string{"python3", "train.py"}, Dir: dir, Grace: 3 * time.Second,
		Env: []string{"PATH=/agent/bin", "HOME=/root", executor.EnvAllocID + "=alloc-abc", executor.EnvAttempt + "=1", executor.EnvMetricsFile + "=" + filepath.Join(dir, "metrics.jsonl"), "TMPDIR=" + filepath.Join(filepath.Dir(dir), ".tmp-alloc-abc")}}
	for _, m := range mods {
		m(&a)
	}
	go func() {
		fr.done <- r.Run(ctx, a, func(l executor.Line) {
			fr.mu.Lock()
			fr.lines = append(fr.lines, l)
			fr.mu.Unlock()
		})
	}()
	return fr
}

func (fr *fakeRun) texts() []string {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var s []string
	for _, l := range fr.lines {
		s = append(s, l.Text)
	}
	return s
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func getJob(api *fake.Clientset, name string) *batchv1.Job {
	j, err := api.BatchV1().Jobs("gpupass").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return j
}

// setEnd marks the Job and its pod as the controller and kubelet would.
func setEnd(t *testing.T, api *fake.Clientset, job *batchv1.Job, pod *corev1.Pod, c batchv1.JobCondition, phase corev1.PodPhase, code int32) {
	t.Helper()
	ctx := context.Background()
	pod.Status.Phase = phase
	exited(code, "")(pod)
	if _, err := api.CoreV1().Pods("gpupass").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	job.Status.Conditions = []batchv1.JobCondition{c}
	if _, err := api.BatchV1().Jobs("gpupass").UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createPod(t *testing.T, api *fake.Clientset, job *batchv1.Job) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-x", Namespace: "gpupass", Labels: job.Spec.Template.Labels},
		Spec: job.Spec.Template.Spec, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	pod.Spec.NodeName = "gpu-1"
	p, err := api.CoreV1().Pods("gpupass").Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newRunner is a runner whose shared dir is a fresh one; runDir is a
// run's work dir in it.
func newRunner(shared string) *Runner {
	return &Runner{Client: &Client{Namespace: "gpupass", Image: "localhost/run@sha256:" + strings.Repeat("a", 64), Poll: 5 * time.Millisecond,
		Volume: SharedDir{Path: shared}}, Cluster: "kind", Node: "gpu-1", GPUs: 2, TimeLimit: 90 * time.Second}
}

// TestRunnerJob: the attempt becomes a Job pinned to the node with its
// GPUs, the deadline, no retries, gpupass's variables and none of the
// agent's own, and its output reaches the executor line by line.
func TestRunnerJob(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	shared := t.TempDir()
	dir := filepath.Join(shared, "alloc-abc")
	fr := startRun(t, context.Background(), api, newRunner(shared), dir)
	var job *batchv1.Job
	waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })

	if got := *job.Spec.BackoffLimit; got != 0 {
		t.Errorf("backoffLimit %d", got)
	}
	if got := *job.Spec.ActiveDeadlineSeconds; got != 90 {
		t.Errorf("activeDeadlineSeconds %d", got)
	}
	ps := job.Spec.Template.Spec
	if got := ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values; !cmp.Equal(got, []string{"gpu-1"}) {
		t.Errorf("pinned to %v", got)
	}
	ctr := ps.Containers[0]
	if q := ctr.Resources.Limits[GPUResource]; q.Value() != 2 {
		t.Errorf("gpu limit %s", q.String())
	}
	if *ps.TerminationGracePeriodSeconds != 3 {
		t.Errorf("grace %d", *ps.TerminationGracePeriodSeconds)
	}
	var names []string
	for _, e := range ctr.Env {
		names = append(names, e.Name)
	}
	if want := []string{executor.EnvAllocID, executor.EnvAttempt, executor.EnvMetricsFile, "TMPDIR"}; !cmp.Equal(names, want) {
		t.Errorf("pod env %v, want %v (the agent's PATH and HOME stay out)", names, want)
	}
	if job.Labels[LabelAlloc] != "alloc-abc" || job.Annotations[AnnotationAlloc] != "alloc-abc" {
		t.Errorf("labels %v annotations %v", job.Labels, job.Annotations)
	}
	// The run sees its work dir and TMPDIR, nothing else of the shared dir.
	var mounted []string
	for i, v := range ps.Volumes {
		if v.HostPath == nil || v.HostPath.Path != ctr.VolumeMounts[i].MountPath {
			t.Errorf("volume %+v mounted at %s", v, ctr.VolumeMounts[i].MountPath)
		}
		mounted = append(mounted, ctr.VolumeMounts[i].MountPath)
	}
	if want := []string{dir, filepath.Join(filepath.Dir(dir), ".tmp-alloc-abc")}; !cmp.Equal(mounted, want) {
		t.Errorf("mounted %v, want %v", mounted, want)
	}

	pod := createPod(t, api, job)
	out := filepath.Join(dir, ".kube", "attempt-1.out")
	if err := os.WriteFile(out, []byte("step 1\nstep 2\npart"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two lines", func() bool { return len(fr.texts()) == 2 })
	setEnd(t, api, job, pod, cond(batchv1.JobComplete, ""), corev1.PodSucceeded, 0)
	ex := <-fr.done
	if ex.Code != 0 || ex.StartErr != nil || ex.Reason != "" {
		t.Errorf("exit %+v", ex)
	}
	if got, want := fr.texts(), []string{"step 1", "step 2", "part"}; !cmp.Equal(got, want) {
		t.Errorf("lines %q, want %q", got, want)
	}
}

// TestRunnerFindsJobAgain: an agent restarted under a run follows the
// Job it made before, from where the spool holds its output, instead of
// creating a second one or handing a line over twice.
func TestRunnerFindsJobAgain(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	shared := t.TempDir()
	dir := filepath.Join(shared, "alloc-abc")
	ctx, cancel := context.WithCancel(context.Background())
	first := startRun(t, ctx, api, newRunner(shared), dir)
	var job *batchv1.Job
	waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
	pod := createPod(t, api, job)
	out := filepath.Join(dir, ".kube", "attempt-1.out")
	if err := os.WriteFile(out, []byte("one\ntwo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two lines", func() bool { return len(first.texts()) == 2 })
	// The agent dies: its follower stops without touching the Job (a
	// killed process deletes nothing).
	first.mu.Lock()
	held := first.lines[0].Offset // the spool durably holds only "one"
	first.mu.Unlock()

	second := startRun(t, context.Background(), api, newRunner(shared), dir, func(a *executor.Attempt) {
		a.From = &executor.Offsets{Stdout: held}
	})
	if err := os.WriteFile(out, []byte("one\ntwo\nthree\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rest", func() bool { return len(second.texts()) == 2 })
	setEnd(t, api, job, pod, cond(batchv1.JobComplete, ""), corev1.PodSucceeded, 0)
	if ex := <-second.done; ex.Code != 0 || ex.StartErr != nil {
		t.Errorf("exit %+v", ex)
	}
	if got, want := second.texts(), []string{"two", "three"}; !cmp.Equal(got, want) {
		t.Errorf("restarted follower handed over %q, want %q", got, want)
	}
	jobs, _ := api.BatchV1().Jobs("gpupass").List(context.Background(), metav1.ListOptions{})
	if len(jobs.Items) != 1 {
		t.Errorf("%d jobs, want the one", len(jobs.Items))
	}
	cancel()
	<-first.done
}

// TestRunnerDeadline: the Job's activeDeadlineSeconds is the run's own
// time limit when it has one, else the agent's --kube-time-limit, rounded
// up to whole seconds.
func TestRunnerDeadline(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		run, agent  time.Duration
		wantSeconds int64 // 0: no deadline
	}{
		{"the run's limit wins", 5 * time.Second, 90 * time.Second, 5},
		{"the agent's when the run has none", 0, 90 * time.Second, 90},
		{"rounded up", 1500 * time.Millisecond, 0, 2},
		{"none", 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api := fake.NewClientset()
			shared := t.TempDir()
			r := newRunner(shared)
			r.TimeLimit = tt.agent
			ctx, cancel := context.WithCancel(context.Background())
			fr := startRun(t, ctx, api, r, filepath.Join(shared, "alloc-abc"), func(a *executor.Attempt) { a.TimeLimit = tt.run })
			var job *batchv1.Job
			waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
			var got int64
			if d := job.Spec.ActiveDeadlineSeconds; d != nil {
				got = *d
			}
			if got != tt.wantSeconds {
				t.Errorf("activeDeadlineSeconds %d, want %d", got, tt.wantSeconds)
			}
			cancel()
			<-fr.done
		})
	}
}

// TestRunnerGPUs: a run's pod asks for the GPUs its spec needs
// (Attempt.GPUs), not all the node's, as request and limit (the device
// plugin hands the container exactly that many); a run without a spec
// gets all the node's.
func TestRunnerGPUs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		node, attempt int
		want          int64
	}{
		{"the spec's one of four", 4, 1, 1},
		{"the spec's three of four", 4, 3, 3},
		{"no spec: all the node's", 4, 0, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api := fake.NewClientset()
			shared := t.TempDir()
			r := newRunner(shared)
			r.GPUs = tt.node
			ctx, cancel := context.WithCancel(context.Background())
			fr := startRun(t, ctx, api, r, filepath.Join(shared, "alloc-abc"), func(a *executor.Attempt) { a.GPUs = tt.attempt })
			var job *batchv1.Job
			waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
			res := job.Spec.Template.Spec.Containers[0].Resources
			limit, request := res.Limits[GPUResource], res.Requests[GPUResource]
			if limit.Value() != tt.want || request.Value() != tt.want {
				t.Errorf("the pod asks for %s (request %s) of %s, want %d", limit.String(), request.String(), GPUResource, tt.want)
			}
			cancel()
			<-fr.done
		})
	}
}

// TestRunnerCancel: a cancelled attempt deletes its Job in the
// foreground, with the attempt's grace period for its pod, and returns
// once the Job is gone.
func TestRunnerCancel(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	shared := t.TempDir()
	fr := startRun(t, ctx, api, newRunner(shared), filepath.Join(shared, "alloc-abc"))
	var job *batchv1.Job
	waitFor(t, "the job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
	createPod(t, api, job)
	cancel()
	ex := <-fr.done
	if !ex.Stopped || ex.Code != -1 {
		t.Errorf("exit %+v, want stopped", ex)
	}
	if getJob(api, job.Name) != nil {
		t.Error("the job is still there")
	}
	var del *metav1.DeleteOptions
	for _, a := range api.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "jobs" {
			opts := a.(interface{ GetDeleteOptions() metav1.DeleteOptions }).GetDeleteOptions()
			del = &opts
		}
	}
	if del == nil || *del.PropagationPolicy != metav1.DeletePropagationForeground || *del.GracePeriodSeconds != 3 {
		t.Errorf("delete options %+v", del)
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	if got := JobName("alloc-0123abcd", "2"); got != "gpupass-alloc-0123abcd-2" {
		t.Errorf("JobName = %q", got)
	}
	long := JobName("alloc-Upper_"+strings.Repeat("x", 64), "1")
	if len(long) > 63 || strings.ContainsAny(long, "_U") {
		t.Errorf("JobName of a long id %q is not a DNS label", long)
	}
	if JobName("alloc-a_b", "1") == JobName("alloc-a-b", "1") {
		t.Error("two ids share a job name")
	}
	if v := labelValue("alloc-" + strings.Repeat("x", 64)); len(v) > 63 {
		t.Errorf("label value %q", v)
	}
}

// TestRunJobsOn: only the node's run Jobs that have not ended count (a
// restarted agent does not start a conformance Job behind them).
func TestRunJobsOn(t *testing.T) {
	t.Parallel()
	job := func(name, kind, node string, conds ...batchv1.JobCondition) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpupass",
			Labels: map[string]string{LabelManagedBy: managedBy, LabelKind: kind, LabelNode: node}},
			Status: batchv1.JobStatus{Conditions: conds}}
	}
	api := fake.NewClientset(
		job("running", "run", "gpu-1"),
		job("done", "run", "gpu-1", cond(batchv1.JobComplete, "")),
		job("failed", "run", "gpu-1", cond(batchv1.JobFailed, "DeadlineExceeded")),
		job("succeeded, not yet Complete", "run", "gpu-1", cond(batchv1.JobSuccessCriteriaMet, "CompletionsReached")),
		job("elsewhere", "run", "gpu-2"),
		job("check", "check", "gpu-1"),
		// Its pod ended, and the Job controller has not written so yet:
		// the runner has already reported the run's end and the broker
		// may place the next run on the node.
		job("pod-ended", "run", "gpu-1"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ended-pod", Namespace: "gpupass",
			Labels: map[string]string{"batch.kubernetes.io/job-name": "pod-ended"}},
			Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
	)
	c := &Client{API: api, Namespace: "gpupass"}
	got, err := c.RunJobsOn(context.Background(), "gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"running"}; !cmp.Equal(got, want) {
		t.Errorf("RunJobsOn = %q, want %q", got, want)
	}
}

// startStep runs a check Step on gpu-1 against api and returns where its
// error arrives and its Job, once made.
func startStep(t *testing.T, api *fake.Clientset) (<-chan error, *batchv1.Job) {
	t.Helper()
	shared := t.TempDir()
	c := &Client{API: api, Namespace: "gpupass", Image: "localhost/run@sha256:" + strings.Repeat("a", 64), Poll: 5 * time.Millisecond, Volume: SharedDir{Path: shared}}
	done := make(chan error, 1)
	go func() {
		_, err := c.Step(context.Background(), "gpu-1", 4, shared, "gpupass-agent", "facts")
		done <- err
	}()
	var job *batchv1.Job
	waitFor(t, "the check job", func() bool {
		jobs, _ := api.BatchV1().Jobs("gpupass").List(context.Background(), metav1.ListOptions{})
		if len(jobs.Items) == 1 {
			job = &jobs.Items[0]
		}
		return job != nil
	})
	return done, job
}

// TestStepUnschedulable: a check Job whose pod the scheduler cannot place
// (the node was cordoned after the agent last looked) fails at once with
// the scheduler's words instead of waiting for StepTimeout.
func TestStepUnschedulable(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	done, job := startStep(t, api)
	// A check measures the whole node: it asks for all its GPUs.
	if q := job.Spec.Template.Spec.Containers[0].Resources.Limits[GPUResource]; q.Value() != 4 {
		t.Errorf("the check job asks for %s of %s, want all 4", q.String(), GPUResource)
	}
	pod := createPod(t, api, job)
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 node(s) were unschedulable."}}}
	if _, err := api.CoreV1().Pods("gpupass").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "Pending: Unschedulable: 0/1 nodes are available: 1 node(s) were unschedulable.") {
			t.Errorf("Step = %v, want the scheduler's reason", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Step still waits for an unschedulable pod")
	}
}

// TestStepReadsItsOwnPod: a check Job's end is read from its own pod,
// not from the newest pod of any check on the node. Every check on a
// node had the same pod labels, so the pod of another check there (an
// earlier one's, not deleted yet, or another agent's standing for the
// same node) was taken for this one's: CI's TestE2EKubernetesGangRestart
// failed a gang's restart "reading the log of check job gpupass-check-vm-6fc56bc9
// … (get pods gpupass-check-vm-6e176dc8-m57tg)".
func TestStepReadsItsOwnPod(t *testing.T) {
	t.Parallel()
	api := fake.NewClientset()
	done, job := startStep(t, api)
	// Another check of the node, newer, failed: as its pods are labelled.
	other := job.DeepCopy()
	other.Name = "gpupass-check-gpu-1-other"
	if other.Spec.Template.Labels[LabelCheck] != "" {
		other.Spec.Template.Labels[LabelCheck] = other.Name
	}
	decoy := createPod(t, api, other)
	decoy.CreationTimestamp = metav1.NewTime(time.Now().Add(time.Hour))
	if _, err := api.CoreV1().Pods("gpupass").Update(context.Background(), decoy, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	decoy.Status.Phase = corev1.PodFailed
	exited(7, "")(decoy)
	if _, err := api.CoreV1().Pods("gpupass").UpdateStatus(context.Background(), decoy, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// This check's pod succeeds (Step may end, and delete its Job, as
	// soon as it sees that).
	pod := createPod(t, api, job)
	pod.Status.Phase = corev1.PodSucceeded
	exited(0, "")(pod)
	if _, err := api.CoreV1().Pods("gpupass").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	job.Status.Conditions = []batchv1.JobCondition{cond(batchv1.JobComplete, "")}
	_, _ = api.BatchV1().Jobs("gpupass").UpdateStatus(context.Background(), job, metav1.UpdateOptions{})
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Step = %v, want its own pod's success, not the other check's failure", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Step did not end")
	}
}

// TestPodsRunAs: with Client.RunAs the run's and the conformance check's
// pods run as that user and group (an agent that is not root runs them as
// itself, so that it can delete what they write), with fsGroup only for a
// claim; without it they keep the image's user.
func TestPodsRunAs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		runAs *RunAs
		claim string
		// want is uid, gid, fsGroup (-1: unset); nil: the image's user.
		want []int64
	}{
		{"the image's user", nil, "", nil},
		{"the agent's uid on a hostPath", &RunAs{UID: 65532, GID: 65532}, "", []int64{65532, 65532, -1}},
		{"the agent's uid on a claim", &RunAs{UID: 1000, GID: 2000}, "shared", []int64{1000, 2000, 2000}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			check := func(what string, sc *corev1.PodSecurityContext) {
				t.Helper()
				if sc == nil {
					t.Fatalf("the %s pod has no security context", what)
				}
				if tt.want == nil {
					if sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.FSGroup != nil || sc.RunAsNonRoot != nil {
						t.Errorf("the %s pod sets a user %+v, want none (the image's user)", what, sc)
					}
					return
				}
				if sc.RunAsUser == nil || sc.RunAsGroup == nil || sc.RunAsNonRoot == nil {
					t.Fatalf("the %s pod's security context is %+v, want runAsUser %d runAsGroup %d", what, sc, tt.want[0], tt.want[1])
				}
				fs := int64(-1)
				if sc.FSGroup != nil {
					fs = *sc.FSGroup
				}
				if got := []int64{*sc.RunAsUser, *sc.RunAsGroup, fs}; !slices.Equal(got, tt.want) {
					t.Errorf("the %s pod runs as uid, gid, fsGroup %v, want %v", what, got, tt.want)
				}
				if !*sc.RunAsNonRoot {
					t.Errorf("the %s pod may run as root", what)
				}
			}
			shared := t.TempDir()
			r := newRunner(shared)
			r.Client.RunAs, r.Client.Volume.Claim = tt.runAs, tt.claim
			run, step := podsOf(t, r, shared)
			check("run", run.SecurityContext)
			check("conformance check", step.SecurityContext)
		})
	}
}

// TestPodsConfined: what a job runs (the run's pod, and the conformance
// check's, which runs in the same image a job can influence) gets no
// capabilities, cannot gain privileges (setuid binaries, file
// capabilities), runs under the runtime's default seccomp filter and has
// no service-account token, whichever user it runs as: a training script
// has no business with the node's kernel or the cluster's API.
func TestPodsConfined(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		runAs *RunAs
	}{
		{"the image's user", nil},
		{"the agent's uid", &RunAs{UID: 65532, GID: 65532}},
		{"root asked for", &RunAs{UID: 0, GID: 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			shared := t.TempDir()
			r := newRunner(shared)
			r.Client.RunAs = tt.runAs
			run, step := podsOf(t, r, shared)
			for what, spec := range map[string]*corev1.PodSpec{"run": run, "conformance check": step} {
				if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
					t.Errorf("the %s pod mounts the service account's token", what)
				}
				if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("the %s pod's seccomp profile is not RuntimeDefault: %+v", what, sc)
				}
				if len(spec.Containers) != 1 {
					t.Fatalf("the %s pod has %d containers", what, len(spec.Containers))
				}
				want := &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false),
					Privileged:               ptr(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				}
				if d := cmp.Diff(want, spec.Containers[0].SecurityContext); d != "" {
					t.Errorf("the %s container's security context (-want +got):\n%s", what, d)
				}
			}
		})
	}
}

// podsOf starts a run with r and a conformance check with its client on a
// fake API, and returns the pod specs of their Jobs.
func podsOf(t *testing.T, r *Runner, shared string) (run, step *corev1.PodSpec) {
	t.Helper()
	api := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	fr := startRun(t, ctx, api, r, filepath.Join(shared, "alloc-abc"))
	var job *batchv1.Job
	waitFor(t, "the run's job", func() bool { job = getJob(api, "gpupass-alloc-abc-1"); return job != nil })
	cancel()
	<-fr.done

	c := *r.Client
	c.API = api
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Step(sctx, "gpu-1", 4, shared, "gpupass-agent", "facts")
	}()
	var check *batchv1.Job
	waitFor(t, "the check's job", func() bool {
		jobs, _ := api.BatchV1().Jobs("gpupass").List(context.Background(), metav1.ListOptions{LabelSelector: LabelKind + "=check"})
		if len(jobs.Items) == 1 {
			check = &jobs.Items[0]
		}
		return check != nil
	})
	scancel()
	<-done
	return &job.Spec.Template.Spec, &check.Spec.Template.Spec
}
