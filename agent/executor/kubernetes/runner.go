package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/follow"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// Runner runs each attempt of a run as a Job pinned to one node: an
// executor.Runner. The run's work dir must be in the shared dir (the
// executor's WorkRoot under Client.Volume.Path): the pod runs there, its
// output files and the metrics file are written there, checkpoints stay
// there when the pod is gone, and the agent reads them as they grow.
//
// Output goes to files rather than through the pod log API: a file has
// offsets, so an agent restarted under a run reads on from exactly where
// the spool holds the lines (Offsets) and keeps stdout and stderr apart,
// where the log API can only resume at a timestamp.
//
// Each attempt keeps, in WORKDIR/.kube/attempt-N.json, how far its output
// files were read; the Job's name is the allocation id and attempt, so an
// agent restarted under a run finds the Job again instead of creating it
// twice.
type Runner struct {
	Client *Client
	// Cluster is the cluster's name, named in the run's events.
	Cluster string
	// Node is the node every attempt is pinned to.
	Node string
	// GPUs is the node's: what a run's pod asks for when the attempt
	// names no count (Attempt.GPUs, the spec's resources.count). The
	// broker places a whole node, but the pod gets the GPUs the spec
	// asked for, no more: the job sees (and the device plugin hands it)
	// only those.
	GPUs int
	// TimeLimit is the Job's activeDeadlineSeconds, rounded up to whole
	// seconds, when the attempt has no limit of its own (the run's,
	// Attempt.TimeLimit); zero: none.
	TimeLimit time.Duration
}

type attemptState struct {
	Job string `json:"job"`
	follow.Offsets
}

// podEnv is the attempt's environment as the pod gets it: what gpupass
// sets for the job, not the agent's own environment (PATH, HOME and the
// libraries of the machine the agent runs on mean nothing in the image).
func podEnv(env []string) []corev1.EnvVar {
	keep := map[string]bool{"PYTORCH_CUDA_ALLOC_CONF": true, "TMPDIR": true, "TMP": true, "TEMP": true}
	// A rank of a gang: torch.distributed's and torchrun's names.
	for _, k := range rendezvous.Names() {
		keep[k] = true
	}
	seen := map[string]int{}
	var out []corev1.EnvVar
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if !keep[k] && !strings.HasPrefix(k, "GPUPASS_") {
			continue
		}
		if i, ok := seen[k]; ok {
			out[i].Value = v
			continue
		}
		seen[k] = len(out)
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	return out
}

// wrapper runs the command in the work dir with its output appended to
// the attempt's files; exec, so the container's main process is the
// command and the kubelet's SIGTERM reaches it.
const wrapper = `cd "$1" || exit 127; o=$2; e=$3; shift 3; exec "$@" >>"$o" 2>>"$e"`

// linkWrapper is wrapper for a gang rank whose pod measures the link
// first (step, executor.LinkStep): the step runs in the pod with the
// rank's rendezvous variables, its result written beside the attempt's
// output files in the shared dir, where the agent reads it (LinkWatch)
// as it reads the output; then the command is exec'd as in wrapper.
// What --require-bandwidth's check says goes to the attempt's stderr
// file, so the run's log has it.
//
// The result is the pod's word, as the job's own output is: the
// command runs in the same pod, as the same user, and could replace
// the file before the agent reads it (the agent polls it). The step
// runs before the command, so only a job that sets out to forge it
// can; the agent takes the first result it reads, never through a
// symbolic link.
func linkWrapper(step *executor.LinkStep, base string) string {
	return `cd "$1" || exit 127; o=$2; e=$3; shift 3; exec >>"$o" 2>>"$e"` + "\n" + step.Shell(base, executor.ShellQuote) + `exec "$@"` + "\n"
}

// linkPort is the port of the link step's rendezvous in rank 0's pod,
// beside the gang's MASTER_PORT: nothing but the step listens in that
// pod before the command starts (each pod has its own network
// namespace), and the command's rendezvous at MASTER_PORT is then never
// the step's, whatever order the ranks' steps end in.
func linkPort(master int) int {
	if master >= 65535 {
		return master - 1
	}
	return master + 1
}

// RunsLinkStep says a gang rank's link step (executor.Attempt.Link)
// runs in the rank's pod, before the command (linkWrapper).
func (r *Runner) RunsLinkStep() bool { return true }

// EnforcesTimeLimit implements executor.LimitEnforcer: the Job's
// activeDeadlineSeconds (what is left of the run's limit, from
// Attempt.TimeLimit) ends a timed-out attempt, and the pod's end says
// DeadlineExceeded in Kubernetes' words.
func (r *Runner) EnforcesTimeLimit() bool { return true }

var _ executor.LimitEnforcer = (*Runner)(nil)

// Run creates (or finds again) the attempt's Job, follows its output
// until it ends and maps its end to an Exit.
func (r *Runner) Run(ctx context.Context, a executor.Attempt, out func(executor.Line)) executor.Exit {
	f := &follower{r: r, note: a.Note}
	at, err := follow.Start(a, ".kube", &f.st, out)
	if err != nil {
		return startErr(err)
	}
	if len(a.Command) == 0 {
		return startErr(errors.New("the attempt has no command"))
	}
	f.files = at.Files
	alloc, attempt, base := at.AllocID, at.N, at.Base
	f.st.Job = JobName(alloc, attempt)
	if err := r.create(ctx, a, alloc, attempt, base, f.st.Job); err != nil {
		return startErr(err)
	}
	// Not fatal: the Job is found again by name.
	_ = f.files.Save()
	f.link = executor.NewLinkWatch(a.Link, base, func(msg string) {
		if a.Note != nil {
			a.Note(msg, map[string]string{"kube_job": f.st.Job, "gang_rank": executor.EnvValue(a.Env, "GPUPASS_NODE_RANK")})
		}
	})
	ex := f.run(ctx, a.Grace)
	ended := ex.Reason
	if ended == "" {
		ended = fmt.Sprintf("exit status %d", ex.Code)
	}
	if err := f.link.Finish(ended); err != nil {
		// --require-bandwidth: the step ended the pod before the
		// command, and the run says both figures.
		ex.Reason = events.Outcome(err.Error(), ex.Reason)
		if ex.Code == 0 {
			ex.Code = 3
		}
	}
	return ex
}

func startErr(err error) executor.Exit {
	return executor.Exit{StartErr: fmt.Errorf("kubernetes: %w", err), Code: -1}
}

// create makes the attempt's Job unless it is there already (the agent
// was restarted under it).
func (r *Runner) create(ctx context.Context, a executor.Attempt, alloc, attempt, base, name string) error {
	c := r.Client
	labels := map[string]string{LabelManagedBy: managedBy, LabelKind: "run", LabelAlloc: labelValue(alloc), LabelAttempt: attempt, LabelNode: labelValue(r.Node)}
	env := podEnv(a.Env)
	gang, isGang, err := gangOf(a.Env, alloc)
	if err != nil {
		return err
	}
	if a.From == nil {
		// A fresh attempt: a Job of its name is what an earlier
		// placement of this allocation on this node left (a gang's
		// restart places every rank again, its attempts counting from
		// 1), not this attempt's.
		if err := c.removeEnded(ctx, name, a.Note); err != nil {
			return err
		}
	}
	if isGang {
		labels[LabelGang], labels[LabelRank] = labelValue(gang.run), strconv.Itoa(gang.rank)
		labels[LabelRendezvous] = labelValue(gang.port)
		ip := ""
		if gang.rank > 0 {
			// An agent restarted under the rank follows its Job on: rank
			// 0 may be gone by now.
			if a.From != nil {
				cctx, cancel := c.ctx(ctx)
				_, gerr := c.API.BatchV1().Jobs(c.Namespace).Get(cctx, name, metav1.GetOptions{})
				cancel()
				if gerr == nil {
					if a.Note != nil {
						a.Note("following kubernetes job "+name+" again (the agent restarted under it)", map[string]string{"kube_job": name})
					}
					return nil
				}
			}
			if ip, err = c.rankZeroIP(ctx, gang, a.Note); err != nil {
				return err
			}
		}
		env = withMaster(env, ip)
	}
	zero := int32(0)
	dirs := []string{a.Dir}
	if tmp := executor.EnvValue(a.Env, "TMPDIR"); tmp != "" && !strings.HasPrefix(tmp, a.Dir+"/") {
		dirs = append(dirs, tmp)
	}
	gpus := r.GPUs
	if a.GPUs > 0 {
		gpus = a.GPUs
	}
	script, command := wrapper, a.Command
	if a.Link != nil && isGang {
		port, err := strconv.Atoi(gang.port)
		if err != nil || rendezvous.CheckPort(port) != nil {
			return fmt.Errorf("the attempt's GPUPASS_MASTER_PORT %q is not a port", gang.port)
		}
		step := *a.Link
		step.Port = linkPort(port)
		// A gang placed again counts its attempts from 1: what an
		// earlier placement's step left under this name is not this
		// one's result. (An attempt followed on after the agent
		// restarted is this placement's: its result stays.)
		for _, ext := range []string{"", ".tmp", ".err"} {
			if a.From != nil {
				break
			}
			if err := os.Remove(executor.LinkResultFile(base) + ext); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing an earlier link step's result: %w", err)
			}
		}
		if argv, ok := step.InCommand(base, command); ok {
			command = argv
		} else {
			script = linkWrapper(&step, base)
		}
	}
	spec, err := c.podSpec(r.Node, gpus, a.Grace, dirs, append([]string{"/bin/sh", "-c", script, "gpupass-attempt", a.Dir, base + ".out", base + ".err"}, command...), env)
	if err != nil {
		return fmt.Errorf("the run's work dir must be in the shared dir: %w", err)
	}
	spec.Containers[0].WorkingDir = a.Dir
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: labels, Annotations: map[string]string{AnnotationAlloc: alloc}},
		Spec: batchv1.JobSpec{
			// One pod per attempt: a retry is the executor's (NaN guard)
			// or the broker's (re-placement), never the Job controller's.
			BackoffLimit: &zero,
			Template:     corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationAlloc: alloc}}, Spec: spec},
		},
	}
	limit := a.TimeLimit
	if limit <= 0 {
		limit = r.TimeLimit
	}
	if limit > 0 {
		s := int64((limit + time.Second - 1) / time.Second)
		job.Spec.ActiveDeadlineSeconds = &s
	}
	// A finished Job stays a day for kubectl and an agent that was down
	// when it ended, then goes.
	ttl := int32(24 * 3600)
	job.Spec.TTLSecondsAfterFinished = &ttl
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.API.BatchV1().Jobs(c.Namespace).Create(cctx, job, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		if a.Note != nil {
			a.Note("following kubernetes job "+name+" again (the agent restarted under it)", map[string]string{"kube_job": name})
		}
		return nil
	case err != nil:
		return fmt.Errorf("creating job %s on node %s in namespace %s: %w", name, r.Node, c.Namespace, err)
	}
	return nil
}

// leftoverWait bounds how long a fresh attempt waits for the Job an
// earlier placement left under its name to be gone.
const leftoverWait = 2 * time.Minute

// removeEnded deletes the Job named name, if there is one, and waits
// until it is gone, so that the name is free for a fresh attempt. It
// is an earlier placement's (the broker re-places a run only once every
// attempt of it has ended), kept for its TTL; were it followed as this
// attempt's, the attempt would end at once with the earlier one's end.
func (c *Client) removeEnded(ctx context.Context, name string, note func(string, map[string]string)) error {
	jobs := c.API.BatchV1().Jobs(c.Namespace)
	cctx, cancel := c.ctx(ctx)
	_, err := jobs.Get(cctx, name, metav1.GetOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking for a job %s left by an earlier placement: %w", name, err)
	}
	if note != nil {
		note("deleting kubernetes job "+name+", left by an earlier placement of this run on the node", map[string]string{"kube_job": name})
	}
	ctx, stop := context.WithTimeout(ctx, leftoverWait)
	defer stop()
	zero := int64(0)
	cctx, cancel = c.ctx(ctx)
	err = jobs.Delete(cctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero, PropagationPolicy: ptr(metav1.DeletePropagationForeground)})
	cancel()
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting job %s, left by an earlier placement: %w", name, err)
	}
	t := time.NewTicker(c.poll())
	defer t.Stop()
	for {
		cctx, cancel := c.ctx(ctx)
		_, err := jobs.Get(cctx, name, metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("job %s, left by an earlier placement, was not gone within %s", name, leftoverWait)
		case <-t.C:
		}
	}
}

// follower follows one attempt: its job and its output files.
type follower struct {
	r        *Runner
	st       attemptState
	files    *follow.Files
	lastNote string
	note     func(string, map[string]string)
	// link hears a gang rank's link step (nil: none); linked once it
	// has handed the result over.
	link   *executor.LinkWatch
	linked bool
}

// read hands over the lines written since the last read. Failing to
// save how far it got does not fail the attempt: an agent restarted under
// it reads on from where the run's spool holds the lines (Attempt.From).
func (f *follower) read(final bool) { _ = f.files.Read(final) }

func (f *follower) observe(st jobState) {
	if st.note == f.lastNote || f.note == nil {
		return
	}
	f.lastNote = st.note
	f.note(st.note, map[string]string{"kube_job": st.name, "kube_pod": st.pod, "kube_node": st.node, "kube_cluster": f.r.Cluster,
		"kube_namespace": f.r.Client.Namespace})
}

// run follows the Job to its end. A cancelled ctx deletes the Job with
// the attempt's grace period (the kubelet sends SIGTERM, then SIGKILL
// after it) and waits until its pod is gone, so that nothing of the
// attempt is left when Run returns.
func (f *follower) run(ctx context.Context, grace time.Duration) executor.Exit {
	c := f.r.Client
	bg := context.WithoutCancel(ctx)
	var stopped bool
	var deletedAt time.Time
	tick := time.NewTicker(c.poll())
	defer tick.Stop()
	for {
		// The link first: its note precedes the command's first lines
		// when both are there at once.
		if !f.linked {
			f.linked = f.link.Poll()
		}
		f.read(false)
		st, err := c.state(bg, f.st.Job)
		switch {
		case errors.Is(err, ErrNoJob):
			f.read(true)
			ex := executor.Exit{Code: -1, Stopped: stopped, Killed: stopped && time.Since(deletedAt) > grace}
			if !stopped {
				ex.Reason = "kubernetes job " + f.st.Job + " was deleted before its end was read"
			}
			return ex
		case err == nil:
			f.observe(st)
			if st.ended() {
				f.read(true)
				st.exit.Stopped = stopped
				return st.exit
			}
			if st.fatal != "" && !stopped {
				_ = f.delete(bg, 0)
				f.read(true)
				return executor.Exit{Code: -1, Reason: "kubernetes job " + f.st.Job + ": " + st.fatal}
			}
		}
		select {
		case <-ctx.Done():
			if !stopped {
				stopped, deletedAt = true, time.Now()
				if err := f.delete(bg, grace); err != nil && f.note != nil {
					f.note("deleting kubernetes job "+f.st.Job+": "+err.Error(), nil)
				}
			}
			<-tick.C
		case <-tick.C:
		}
	}
}

// delete deletes the Job and, in the foreground, its pod: the Job stays
// (with a deletion timestamp) until the pod is gone, so run sees the Job
// until nothing of the attempt is left.
func (f *follower) delete(ctx context.Context, grace time.Duration) error {
	c := f.r.Client
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	g := int64((grace + time.Second - 1) / time.Second)
	err := c.API.BatchV1().Jobs(c.Namespace).Delete(cctx, f.st.Job, metav1.DeleteOptions{GracePeriodSeconds: &g, PropagationPolicy: ptr(metav1.DeletePropagationForeground)})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
