// Package kubernetes reaches a Kubernetes cluster's GPU nodes through the
// Kubernetes API, with no daemon of its own on any node: it discovers the
// nodes that offer nvidia.com/gpu (their GPU Feature Discovery labels,
// taints, cordon and conditions), runs the conformance probes on one node
// as a Job in the run image, and runs a run's attempts as Jobs pinned to
// a node, following their output files in a directory the agent and the
// pods share, mapping pod and Job states to an attempt's end and stopping
// them by deleting the Job with the attempt's grace period.
//
// It never starts anything on a node other than through a Job in the
// configured namespace, and never imports the broker.
package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// GPUResource is the extended resource the NVIDIA device plugin
// advertises.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// GPU Feature Discovery's node labels.
const (
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUCount   = "nvidia.com/gpu.count"
)

// Labels on every Job and pod the agent makes: how a restarted agent
// finds them again.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "gpupass-agent"
	LabelKind      = "gpupass.dev/kind"
	LabelAlloc     = "gpupass.dev/alloc"
	LabelAttempt   = "gpupass.dev/attempt"
	LabelNode      = "gpupass.dev/node"
	// LabelCheck names a check Job on its pods: every check on a node
	// has the other labels alike, and the pods of an earlier one (or of
	// another agent standing for the node) linger until their Job goes.
	LabelCheck = "gpupass.dev/check"
	// AnnotationAlloc holds the allocation id as the broker gave it; the
	// label may be a hash of it (label values are 63 characters at most).
	AnnotationAlloc = "gpupass.dev/alloc-id"
)

// Client talks to one cluster, in one namespace.
type Client struct {
	API       kubernetes.Interface
	Namespace string
	// Image is the runs' container image, pinned by digest.
	Image string
	// Timeout bounds one API call (default 30s).
	Timeout time.Duration
	// Poll is how often a Job's state is read (default 500ms).
	Poll time.Duration
	// Volume is the directory the agent and the pods share: work dirs,
	// output and metrics files, checkpoints.
	Volume SharedDir
	// RunAs, when set, is the user and group the pods run as; nil leaves
	// the image's user.
	RunAs *RunAs
}

// RunAs is a pod's user and group. An agent that is not root runs its
// pods as itself: what a run writes into its work dir (sub-directories
// included) must be the agent's to read and, when it prunes old work
// dirs or clears one for a new placement, to delete. Pods running as the
// image's root would leave it files it cannot delete.
type RunAs struct{ UID, GID int64 }

// securityContext is the pods' security context: the container
// runtime's default seccomp filter always, and c.RunAs's user and group
// when set (else the image's user).
func (c *Client) securityContext() *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	r := c.RunAs
	if r == nil {
		return sc
	}
	uid, gid, nonRoot := r.UID, r.GID, r.UID != 0
	sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot = &uid, &gid, &nonRoot
	if c.Volume.Claim != "" {
		// A claim's volume is made group-owned and writable by the
		// kubelet for fsGroup (a hostPath is not: the agent made those
		// dirs as this user already).
		sc.FSGroup = &gid
	}
	return sc
}

// containerSecurityContext confines what a job runs to what training
// needs: no capabilities (not even an image's root keeps
// CAP_DAC_OVERRIDE, CAP_SYS_ADMIN's siblings or CAP_NET_RAW), no way to
// gain privileges through a setuid binary (no_new_privs), the runtime's
// default seccomp filter. These are what PodSecurity admission's
// "restricted" level asks of a container, less runAsNonRoot where the
// image's user is kept (--kube-run-as image on a root agent).
func containerSecurityContext() *corev1.SecurityContext {
	no := false
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		Privileged:               &no,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// SharedDir is the directory the agent and every pod see at the same
// path: a hostPath (one node, or a directory every node mounts from the
// same NFS export) or a ReadWriteMany PersistentVolumeClaim that the
// agent's own pod mounts at Path too.
type SharedDir struct {
	Path string
	// Claim, when set, is the PVC mounted at Path; else Path is a
	// hostPath on the node.
	Claim string
}

// mounts mounts each of dirs (absolute, under Path) at its own path: a
// pod sees its run's work dir and TMPDIR, not other runs' files or the
// node's conformance state.
func (v SharedDir) mounts(dirs []string) ([]corev1.Volume, []corev1.VolumeMount, error) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	for i, d := range dirs {
		rel, err := filepath.Rel(v.Path, d)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || !filepath.IsAbs(d) {
			return nil, nil, fmt.Errorf("%s is not in the shared dir %s", d, v.Path)
		}
		name := fmt.Sprintf("gpupass-%d", i)
		vol := corev1.Volume{Name: name}
		m := corev1.VolumeMount{Name: name, MountPath: d}
		if v.Claim != "" {
			vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.Claim}
			if rel != "." {
				m.SubPath = rel
			}
		} else {
			t := corev1.HostPathDirectoryOrCreate
			vol.HostPath = &corev1.HostPathVolumeSource{Path: d, Type: &t}
		}
		vols, mounts = append(vols, vol), append(mounts, m)
	}
	return vols, mounts, nil
}

// Config loads the client configuration: the kubeconfig at path (or
// $KUBECONFIG, or ~/.kube/config) when there is one, else the pod's
// service account (in-cluster). It also returns the name of the
// kubeconfig's current cluster ("" in-cluster).
func Config(path string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	raw, err := cc.RawConfig()
	if err == nil && len(raw.Contexts) > 0 {
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("reading kubeconfig: %w", err)
		}
		cluster := ""
		if c := raw.Contexts[raw.CurrentContext]; c != nil {
			cluster = c.Cluster
		}
		return cfg, cluster, nil
	}
	if path != "" {
		return nil, "", fmt.Errorf("reading kubeconfig %s: no context in it (%v)", path, err)
	}
	cfg, ierr := rest.InClusterConfig()
	if ierr != nil {
		return nil, "", fmt.Errorf("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster: %w", ierr)
	}
	return cfg, "", nil
}

// digestRef is an image reference pinned by a sha256 digest.
var digestRef = regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)

// CheckImage returns an error unless ref is pinned by digest: on
// Kubernetes the certified environment is a node and this image, and a
// tag can be moved to other contents after the report was signed.
func CheckImage(ref string) error {
	if !digestRef.MatchString(ref) {
		return fmt.Errorf("image %q is not pinned by digest: give NAME@sha256:<64 hex> (a tag can be moved after the node was certified)", ref)
	}
	return nil
}

func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.Timeout
	if d <= 0 {
		d = 30 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

func (c *Client) poll() time.Duration {
	if c.Poll <= 0 {
		return 500 * time.Millisecond
	}
	return c.Poll
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// dnsName makes s a DNS-1123 label (what a Job name must be for its pods'
// names): lowercase letters, digits and '-', at most 63 characters; a
// longer or changed name gets a hash of the original so that two never
// collide.
func dnsName(s string) string {
	n := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(s), "-"), "-")
	if n == s && len(n) <= 52 {
		return n
	}
	h := hashOf(s)
	if len(n) > 52 {
		n = strings.TrimRight(n[:52], "-")
	}
	return n + "-" + h
}

var labelSafe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$`)

// labelValue is s when it is a valid label value, else a hash of it.
func labelValue(s string) string {
	if labelSafe.MatchString(s) {
		return s
	}
	return "h-" + hashOf(s)
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:5])
}

// JobName is the name of an attempt's Job: it carries the allocation id.
func JobName(allocID, attempt string) string { return dnsName("gpupass-" + allocID + "-" + attempt) }

// AllocSelector selects every Job and pod of a run.
func AllocSelector(allocID string) string {
	return LabelManagedBy + "=" + managedBy + "," + LabelAlloc + "=" + labelValue(allocID)
}

// podSpec is the pod of a Job pinned to node, asking for gpus of its GPUs
// (a run's: what its spec needs; a conformance check's: all of them), with
// the shared dir, no restarts (an attempt that fails is the executor's
// business).
func (c *Client) podSpec(node string, gpus int, grace time.Duration, dirs []string, command []string, env []corev1.EnvVar) (corev1.PodSpec, error) {
	vols, mounts, err := c.Volume.mounts(dirs)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	res := corev1.ResourceRequirements{}
	if gpus > 0 {
		q := *resourceQuantity(gpus)
		res.Limits = corev1.ResourceList{GPUResource: q}
		res.Requests = corev1.ResourceList{GPUResource: q}
	}
	g := int64(grace / time.Second)
	if grace > 0 && g == 0 {
		g = 1
	}
	no := false
	return corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		// Pinned through the scheduler, not spec.nodeName: it counts
		// the GPUs the node has left, where a pod bound by name is
		// refused by the kubelet (OutOfnvidia.com/gpu) instead.
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}},
		}},
		// GPU nodes are commonly tainted so that only pods asking for
		// GPUs land there.
		Tolerations:                   []corev1.Toleration{{Key: string(GPUResource), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		TerminationGracePeriodSeconds: &g,
		// The job has no business with the cluster's API.
		AutomountServiceAccountToken: &no,
		EnableServiceLinks:           &no,
		Containers: []corev1.Container{{
			Name: "run", Image: c.Image, Command: command, Env: env, Resources: res,
			VolumeMounts:             mounts,
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			ImagePullPolicy:          corev1.PullIfNotPresent,
			SecurityContext:          containerSecurityContext(),
		}},
		Volumes:         vols,
		SecurityContext: c.securityContext(),
	}, nil
}

// StepTimeout bounds a conformance Job, from creation (the image may
// have to be pulled) to its end.
const StepTimeout = 10 * time.Minute

// Step runs command in the run image as a Job pinned to node, with dir
// (in the shared dir) mounted, waits for its end and returns what it
// printed (the pod's log: stdout and stderr together). The Job is
// deleted when Step returns.
func (c *Client) Step(ctx context.Context, node string, gpus int, dir string, command ...string) (string, error) {
	ctx, cancelStep := context.WithTimeout(ctx, StepTimeout)
	defer cancelStep()
	spec, err := c.podSpec(node, gpus, time.Second, []string{dir}, command, nil)
	if err != nil {
		return "", err
	}
	name := dnsName("gpupass-check-" + node + "-" + fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffff))
	zero := int32(0)
	ttl := int32(300)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: map[string]string{
			LabelManagedBy: managedBy, LabelKind: "check", LabelNode: labelValue(node), LabelCheck: labelValue(name)}},
		Spec: batchv1.JobSpec{BackoffLimit: &zero, TTLSecondsAfterFinished: &ttl,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelManagedBy: managedBy, LabelKind: "check", LabelNode: labelValue(node), LabelCheck: labelValue(name)}},
				Spec:       spec,
			}},
	}
	cctx, cancel := c.ctx(ctx)
	_, err = c.API.BatchV1().Jobs(c.Namespace).Create(cctx, job, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return "", fmt.Errorf("creating the check job on node %s: %w", node, err)
	}
	defer func() {
		dctx, cancel := c.ctx(context.WithoutCancel(ctx))
		defer cancel()
		_ = c.API.BatchV1().Jobs(c.Namespace).Delete(dctx, name, metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationBackground)})
	}()
	t := time.NewTicker(c.poll())
	defer t.Stop()
	for {
		st, err := c.state(ctx, name)
		if err != nil && !errors.Is(err, errTransient) {
			return "", err
		}
		if err == nil && st.unschedulable != "" && !c.otherCheck(ctx, node, name) {
			// A check waits for nothing: the node was cordoned (or its
			// GPUs taken) after the agent last looked. The next suite
			// measures again. Another check on the node (a second
			// broker node standing for it, docs/multi-node.md) ends in
			// seconds: that one is waited for, within StepTimeout.
			return "", fmt.Errorf("check job %s on node %s: %s", name, node, st.unschedulable)
		}
		if err == nil && st.ended() {
			logs, lerr := c.logs(ctx, st.pod)
			if st.exit.Code != 0 {
				msg := st.exit.Reason
				if msg == "" {
					msg = fmt.Sprintf("exited with status %d", st.exit.Code)
				}
				return logs, fmt.Errorf("check job %s on node %s: %s: %s", name, node, msg, lastLines(logs, 5))
			}
			if lerr != nil {
				return "", fmt.Errorf("reading the log of check job %s on node %s: %w", name, node, lerr)
			}
			return logs, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
}

// otherCheck says whether a check Job other than name runs on node.
func (c *Client) otherCheck(ctx context.Context, node, name string) bool {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	jobs, err := c.API.BatchV1().Jobs(c.Namespace).List(cctx, metav1.ListOptions{
		LabelSelector: LabelManagedBy + "=" + managedBy + "," + LabelKind + "=check," + LabelNode + "=" + labelValue(node)})
	if err != nil {
		return false
	}
	for i := range jobs.Items {
		if j := &jobs.Items[i]; j.Name != name && j.DeletionTimestamp == nil && !jobEnded(j) {
			return true
		}
	}
	return false
}

func (c *Client) logs(ctx context.Context, pod string) (string, error) {
	if pod == "" {
		return "", errors.New("the job has no pod")
	}
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	b, err := c.API.CoreV1().Pods(c.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "run", LimitBytes: ptr(int64(8 << 20))}).DoRaw(cctx)
	return string(b), err
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	out := strings.Join(ls, " | ")
	if len(out) > 1000 {
		out = out[len(out)-1000:]
	}
	return out
}

// DeleteRun deletes every Job of a run (their pods go with them), each
// with the grace period.
func (c *Client) DeleteRun(ctx context.Context, allocID string, grace time.Duration) error {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	g := int64(grace / time.Second)
	err := c.API.BatchV1().Jobs(c.Namespace).DeleteCollection(cctx,
		metav1.DeleteOptions{GracePeriodSeconds: &g, PropagationPolicy: ptr(metav1.DeletePropagationBackground)},
		metav1.ListOptions{LabelSelector: AllocSelector(allocID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the jobs of %s: %w", allocID, err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func resourceQuantity(n int) *resource.Quantity {
	return resource.NewQuantity(int64(n), resource.DecimalSI)
}

// RunJobsOn names the run Jobs on node that have not ended: a run's pod
// holds the node's GPUs, so a conformance Job would wait for its end (an
// agent restarted under a run measures the node again once it ended).
func (c *Client) RunJobsOn(ctx context.Context, node string) ([]string, error) {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	jobs, err := c.API.BatchV1().Jobs(c.Namespace).List(cctx, metav1.ListOptions{
		LabelSelector: LabelManagedBy + "=" + managedBy + "," + LabelKind + "=run," + LabelNode + "=" + labelValue(node)})
	if err != nil {
		return nil, fmt.Errorf("listing the run jobs on node %s: %w", node, err)
	}
	var names []string
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if jobEnded(j) {
			continue
		}
		// The Job's status trails its pod's: an attempt the runner saw end
		// (its pod Succeeded or Failed) may not be Complete yet, and the
		// broker places the next run at once. The pod's phase decides, as
		// it does for the runner.
		if st, err := c.state(ctx, j.Name); err == nil && st.ended() {
			continue
		}
		names = append(names, j.Name)
	}
	return names, nil
}

// jobEnded says a Job's pod is done: the controller writes Complete or
// Failed only once the pod's finalizer is gone, a moment after the pod
// ended (SuccessCriteriaMet, FailureTarget and the counts come first).
func jobEnded(j *batchv1.Job) bool {
	for _, t := range []batchv1.JobConditionType{batchv1.JobComplete, batchv1.JobFailed, batchv1.JobSuccessCriteriaMet, batchv1.JobFailureTarget} {
		if condition(j, t) != nil {
			return true
		}
	}
	return j.Status.Active == 0 && j.Status.Succeeded+j.Status.Failed > 0
}
