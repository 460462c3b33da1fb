package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpupass/gpupass/agent/executor"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrNoJob is a Job the cluster no longer (or never) knew.
var ErrNoJob = errors.New("kubernetes does not know the job")

// errTransient is an API call that failed and is tried again next poll.
var errTransient = errors.New("transient")

// Phase is where a Job is in its life, in gpupass's terms.
type Phase int

// Phases.
const (
	Pending Phase = iota
	Running
	Ended
)

// jobState is what the API says about one attempt's Job and its pod.
type jobState struct {
	name  string
	pod   string
	node  string
	phase Phase
	// note is the state in words, for the run's log when it changes
	// ("pending: 0/1 nodes are available: Insufficient nvidia.com/gpu").
	note string
	// exit is set once phase is Ended.
	exit executor.Exit
	// fatal is a pending pod that can never start (a bad image name).
	fatal string
	// unschedulable is why the scheduler could not place a pending pod
	// (the node cordoned, its GPUs taken).
	unschedulable string
}

func (s jobState) ended() bool { return s.phase == Ended }

// state reads the Job and its newest pod.
func (c *Client) state(ctx context.Context, name string) (jobState, error) {
	st := jobState{name: name}
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	job, err := c.API.BatchV1().Jobs(c.Namespace).Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return st, fmt.Errorf("job %s: %w", name, ErrNoJob)
	}
	if err != nil {
		return st, fmt.Errorf("reading job %s: %w (%w)", name, err, errTransient)
	}
	pods, err := c.API.CoreV1().Pods(c.Namespace).List(cctx, metav1.ListOptions{LabelSelector: podSelector(job)})
	if err != nil {
		return st, fmt.Errorf("listing the pods of job %s: %w (%w)", name, err, errTransient)
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time) {
			pod = p
		}
	}
	return classify(job, pod), nil
}

// podSelector finds a Job's pods by the labels its template gave them.
func podSelector(job *batchv1.Job) string {
	var sel []string
	for _, k := range []string{LabelManagedBy, LabelKind, LabelAlloc, LabelAttempt, LabelNode, LabelCheck} {
		if v, ok := job.Spec.Template.Labels[k]; ok {
			sel = append(sel, k+"="+v)
		}
	}
	if len(sel) == 0 {
		return "batch.kubernetes.io/job-name=" + job.Name
	}
	return strings.Join(sel, ",")
}

func condition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// lostReasons are pod status reasons that say the node, not the job's
// code, ended the pod.
var lostReasons = map[string]bool{"Evicted": true, "NodeLost": true, "Preempting": true, "Terminated": true, "Shutdown": true,
	"NodeShutdown": true, "UnexpectedAdmissionError": true, "OutOfnvidia.com/gpu": true, "NodeAffinity": true}

// fatalWaiting are reasons a container waits that never resolve.
var fatalWaiting = map[string]bool{"InvalidImageName": true, "ErrImageNeverPull": true, "CreateContainerConfigError": true}

// classify maps a Job and its newest pod (nil: none) to a phase, and an
// ended one to an Exit.
func classify(job *batchv1.Job, pod *corev1.Pod) jobState {
	st := jobState{name: job.Name, phase: Pending}
	if pod != nil {
		st.pod, st.node = pod.Name, pod.Spec.NodeName
	}
	failed := condition(job, batchv1.JobFailed)
	if failed == nil {
		failed = condition(job, batchv1.JobFailureTarget)
	}
	complete := condition(job, batchv1.JobComplete)
	podDone := pod == nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	term := terminated(pod)

	switch {
	case complete != nil && podDone, pod != nil && pod.Status.Phase == corev1.PodSucceeded:
		st.phase = Ended
		st.exit = executor.Exit{Code: 0}
		if term != nil {
			st.exit.Code = int(term.ExitCode)
		}
		st.note = describe(job, pod, "Complete")
		return st
	case failed != nil && podDone, pod != nil && pod.Status.Phase == corev1.PodFailed && (failed != nil || term != nil && term.ExitCode != 0):
		st.phase = Ended
		st.exit = failedExit(job, pod, failed, term)
		st.note = st.exit.Reason
		return st
	case pod == nil:
		st.note = describe(job, nil, "waiting for its pod")
		return st
	}
	if pod.DeletionTimestamp != nil {
		st.phase = Running
		st.note = describe(job, pod, "terminating")
		return st
	}
	if pod.Status.Phase == corev1.PodRunning {
		st.phase = Running
		st.note = describe(job, pod, "Running")
		return st
	}
	// Pending: why.
	why := "Pending"
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			why = "Pending: " + c.Reason
			if c.Message != "" {
				why += ": " + c.Message
			}
			if c.Reason == corev1.PodReasonUnschedulable {
				st.unschedulable = why
			}
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			why = "Pending: " + w.Reason
			if w.Message != "" {
				why += ": " + w.Message
			}
			if fatalWaiting[w.Reason] {
				st.fatal = why
			}
		}
	}
	st.note = describe(job, pod, why)
	return st
}

func terminated(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	if pod == nil {
		return nil
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "run" && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	return nil
}

// failedExit is the end of a failed Job: its exit code, the reason in
// Kubernetes' words, and whether the node (eviction, preemption, a lost
// node) rather than the job's code ended it.
func failedExit(job *batchv1.Job, pod *corev1.Pod, cond *batchv1.JobCondition, term *corev1.ContainerStateTerminated) executor.Exit {
	ex := executor.Exit{Code: -1}
	var why []string
	if cond != nil && cond.Reason != "" && cond.Reason != "BackoffLimitExceeded" {
		w := cond.Reason
		if cond.Reason == "DeadlineExceeded" && job.Spec.ActiveDeadlineSeconds != nil {
			w += " (activeDeadlineSeconds " + strconv.FormatInt(*job.Spec.ActiveDeadlineSeconds, 10) + ")"
		}
		why = append(why, w)
	}
	if term != nil {
		ex.Code = int(term.ExitCode)
		if term.Signal != 0 {
			ex.Code, ex.Signal = -1, "signal "+strconv.Itoa(int(term.Signal))
		}
		if term.Reason != "" && term.Reason != "Error" && term.Reason != "Completed" {
			why = append(why, term.Reason)
		}
		why = append(why, "exit code "+strconv.Itoa(int(term.ExitCode)))
	}
	switch {
	case pod == nil:
		// The pod went away before it was seen to end: its node was
		// lost (the pod garbage collector removes pods of a deleted
		// node) or someone deleted it.
		ex.NodeLost = true
		why = append(why, "its pod is gone")
	default:
		if pod.Status.Reason != "" {
			why = append(why, pod.Status.Reason)
			if lostReasons[pod.Status.Reason] {
				ex.NodeLost = true
			}
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				ex.NodeLost = true
				why = append(why, "disrupted: "+c.Reason)
			}
		}
		if pod.Status.Message != "" {
			why = append(why, pod.Status.Message)
		}
	}
	if cond != nil && cond.Reason == "DeadlineExceeded" {
		// The deadline, not the node, killed the pod.
		ex.NodeLost = false
	}
	ex.Reason = "kubernetes job " + job.Name
	if pod != nil && pod.Spec.NodeName != "" {
		ex.Reason += " on " + pod.Spec.NodeName
	}
	ex.Reason += ": Failed"
	if len(why) > 0 {
		ex.Reason += " (" + strings.Join(why, ", ") + ")"
	}
	switch {
	case ex.NodeLost:
		ex.Reason = "node lost: " + ex.Reason
	case cond != nil && cond.Reason == "DeadlineExceeded":
		// The words every executor uses for a run past its limit.
		ex.Reason = "TIMEOUT: " + ex.Reason
	}
	return ex
}

func describe(job *batchv1.Job, pod *corev1.Pod, what string) string {
	msg := "kubernetes job " + job.Name
	if pod != nil && pod.Spec.NodeName != "" {
		msg += " on " + pod.Spec.NodeName
	}
	return msg + ": " + what
}
