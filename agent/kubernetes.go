package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	kube "github.com/gpupass/gpupass/agent/executor/kubernetes"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/probe"
	k8s "k8s.io/client-go/kubernetes"
)

// ExecutorKubernetes is --executor kubernetes.
const ExecutorKubernetes = "kubernetes"

// KubeFlags configure --executor kubernetes: the agent runs in the
// cluster (its service account) or outside it (a kubeconfig) and stands
// for each GPU node, one broker node each.
type KubeFlags struct {
	// Kubeconfig is the kubeconfig to use (default $KUBECONFIG, then
	// ~/.kube/config, then the pod's service account).
	Kubeconfig string
	Namespace  string
	// Image is the runs' container image, pinned by digest: the
	// certified environment is a node and this image.
	Image string
	// Cluster names the cluster in node ids and the provider
	// (kubernetes:CLUSTER); default the kubeconfig's current cluster.
	Cluster string
	// SharedDir is seen by the agent and every pod at the same path: the
	// runs' work dirs, output and metrics files and checkpoints. A
	// hostPath unless SharedClaim names a ReadWriteMany PVC.
	SharedDir   string
	SharedClaim string
	// NodeSelector narrows the nodes enrolled (a label selector).
	NodeSelector string
	TimeLimit    time.Duration
	// Refresh is how often the nodes are read again; a node that is
	// cordoned, NotReady or under pressure stops being certified within
	// one.
	Refresh time.Duration
	// AgentBinary is gpupass-agent inside the image, which the
	// conformance Job runs.
	AgentBinary string
	// RunAs is --kube-run-as: "UID:GID", "image" (the image's user), or
	// "" (the agent's own uid and gid when it is not root, else the
	// image's user); runAs is what validateKube made of it.
	RunAs string
	runAs *kube.RunAs
}

// kubeRunAs resolves --kube-run-as for an agent running as euid:egid.
func kubeRunAs(v string, euid, egid int) (*kube.RunAs, error) {
	switch v {
	case "image":
		return nil, nil
	case "":
		if euid == 0 {
			return nil, nil
		}
		return &kube.RunAs{UID: int64(euid), GID: int64(egid)}, nil
	}
	u, g, ok := strings.Cut(v, ":")
	uid, uerr := strconv.ParseInt(u, 10, 32)
	gid, gerr := strconv.ParseInt(g, 10, 32)
	if !ok || uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return nil, fielderr.New(FieldKubeRunAs, v, `give UID:GID (numbers, as a pod's runAsUser and runAsGroup), "image" for the image's user, or nothing for the agent's own`)
	}
	if euid != 0 && uid != int64(euid) {
		return nil, fielderr.New(FieldKubeRunAs, v, "the agent runs as uid %d and could not delete what pods running as uid %d write into the shared dir: leave it unset (the agent's own uid), or run the agent as root", euid, uid)
	}
	return &kube.RunAs{UID: uid, GID: gid}, nil
}

func (o *Options) validateKube() error {
	k := &o.Kube
	if k.Image == "" {
		return fielderr.New(FieldKubeImage, "", "is required with the kubernetes executor: the runs' image, pinned by digest (NAME@sha256:…)")
	}
	if err := kube.CheckImage(k.Image); err != nil {
		return &fielderr.Error{Field: FieldKubeImage, Problem: err.Error()}
	}
	if k.Namespace == "" {
		return fielderr.New(FieldKubeNamespace, "", "is required with the kubernetes executor")
	}
	if k.SharedDir == "" || !filepath.IsAbs(k.SharedDir) {
		return fielderr.New(FieldKubeSharedDir, k.SharedDir, "give an absolute directory the agent and the pods see at the same path")
	}
	if err := os.MkdirAll(k.SharedDir, 0o755); err != nil {
		return fielderr.New(FieldKubeSharedDir, k.SharedDir, "%w", err)
	}
	if k.Refresh < time.Second {
		return fielderr.New(FieldKubeRefresh, k.Refresh.String(), "must be at least 1s")
	}
	if k.TimeLimit < 0 {
		return fielderr.New(FieldKubeTimeLimit, k.TimeLimit.String(), "must not be negative")
	}
	if k.AgentBinary == "" {
		k.AgentBinary = "gpupass-agent"
	}
	r, err := kubeRunAs(k.RunAs, os.Geteuid(), os.Getegid())
	if err != nil {
		return err
	}
	k.runAs = r
	return nil
}

// kubeNode is what one GPU node's agent needs from the supervisor.
type kubeNode struct {
	client  *kube.Client
	cluster string
	name    string
	flags   KubeFlags
	log     *slog.Logger

	mu   sync.Mutex
	node kube.Node

	factsMu sync.Mutex
	facts   *probe.Facts
	factsAt time.Time
	factsOK error
}

func (n *kubeNode) current() kube.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.node
}

func (n *kubeNode) set(node kube.Node) {
	n.mu.Lock()
	n.node = node
	n.mu.Unlock()
}

func (n *kubeNode) dir() string {
	return filepath.Join(n.flags.SharedDir, "gpupass", n.cluster, n.name)
}

// workRoot is where the node's runs' work dirs go: in the shared dir.
func (n *kubeNode) workRoot() string { return filepath.Join(n.dir(), "runs") }

func (n *kubeNode) runner() executor.Runner {
	return &kube.Runner{Client: n.client, Cluster: n.cluster, Node: n.name, GPUs: n.current().GPUs, TimeLimit: n.flags.TimeLimit}
}

// orphaned deletes the Jobs of a run the agent died under and cannot
// follow on (it died before the run's attempt was marked in its spool,
// see RunLoop.follow): a Job nobody follows must not hold the node's
// GPUs.
func (n *kubeNode) orphaned(ctx context.Context, allocID string) string {
	reason := "agent restarted during the run: its kubernetes jobs were deleted"
	if err := n.client.DeleteRun(ctx, allocID, executor.DefaultGrace); err != nil {
		n.log.Error("deleting the kubernetes jobs of a run the agent died under", "alloc", allocID, "err", err)
		reason += " (failed: " + err.Error() + ")"
	}
	return reason
}

// measure runs the probes in the image on the node, as one Job, and
// returns what they found; the probes of one suite run share it.
func (n *kubeNode) measure(ctx context.Context, o *Options) (*probe.Facts, error) {
	n.factsMu.Lock()
	defer n.factsMu.Unlock()
	if time.Since(n.factsAt) < 2*time.Second {
		return n.facts, n.factsOK
	}
	if why := n.current().Unavailable(); why != "" {
		// The Job would wait as long as the node is out.
		return nil, fmt.Errorf("not measured: %s", why)
	}
	// A run's Job holds the node's GPUs when an agent restarted under it
	// (a later suite waits for the run, see RunLoop.Busy): the check Job
	// would wait for its end, and the agent could neither enroll nor
	// follow the run meanwhile. The node is measured again once it ends.
	if jobs, err := n.client.RunJobsOn(ctx, n.name); err != nil {
		return nil, err
	} else if len(jobs) > 0 {
		return nil, fmt.Errorf("not measured: the node runs kubernetes job %s; measured again once it ends", jobs[0])
	}
	if err := os.MkdirAll(n.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("making the node's dir in the shared dir: %w", err)
	}
	out, err := n.client.Step(ctx, n.name, n.current().GPUs, n.dir(), remoteArgs(n.flags.AgentBinary, n.dir(), o)...)
	var f probe.Facts
	if err == nil {
		err = decodeFacts(out, &f)
		if err != nil {
			err = fmt.Errorf("reading the conformance job's output on %s: %w", n.name, err)
		}
	}
	n.facts, n.factsOK, n.factsAt = &f, err, time.Now()
	return &f, err
}

// decodeFacts reads the facts JSON from a pod log, where stderr (the
// agent's warnings) is mixed in: the last line that is a JSON object.
func decodeFacts(log string, f *probe.Facts) error {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "{") {
			return json.Unmarshal([]byte(l), f)
		}
	}
	return fmt.Errorf("no JSON object in %d line(s) of log", len(lines))
}

// suite is the node's conformance suite: every probe runs in the image
// on the node, in one Job.
func (n *kubeNode) suite(o *Options) *suite.Suite { return remoteSuite(n, o) }

func (n *kubeNode) via() string { return "kubernetes" }

// check is the kubernetes.node check every report of the node carries:
// the node, the image it was measured in, and whether the cluster runs
// pods there.
func (n *kubeNode) check() conformance.Check {
	node := n.current()
	c := conformance.Check{Name: "kubernetes.node", Expected: "schedulable, Ready, no pressure",
		Actual: fmt.Sprintf("node %s on cluster %s (%d %s), measured in image %s", n.name, n.cluster, node.GPUs, kube.GPUResource, n.flags.Image),
		Status: conformance.Pass}
	if why := node.Unavailable(); why != "" {
		c.Status, c.Message = conformance.Fail, why
	}
	return c
}

// RunKubernetes runs the agent for every GPU node of the cluster until
// ctx ends: one broker node per Kubernetes node, each with an identity
// key of its own under --state-dir/kubernetes/CLUSTER-NODE (so its id is
// stable across restarts), provider kubernetes:CLUSTER, hostname the
// node's name.
func RunKubernetes(ctx context.Context, o *Options, log *slog.Logger) error {
	if err := o.validateKube(); err != nil {
		return err
	}
	cfg, cluster, err := kube.Config(o.Kube.Kubeconfig)
	if err != nil {
		return fielderr.New(FieldKubeconfig, o.Kube.Kubeconfig, "%w", err)
	}
	// Which credentials the agent acts with, in its log: in a pod, its
	// service account's token (RBAC of deploy/kubernetes), not a
	// kubeconfig someone mounted.
	if cluster == "" {
		log.Info("kubernetes api: in-cluster config", "server", cfg.Host, "token_file", cfg.BearerTokenFile)
	} else {
		log.Info("kubernetes api: kubeconfig", "server", cfg.Host, "cluster", cluster)
	}
	if o.Kube.Cluster != "" {
		cluster = o.Kube.Cluster
	}
	if cluster == "" {
		return fielderr.New(FieldKubeCluster, "", "is required in a cluster (no kubeconfig names it): the name node ids and the provider carry")
	}
	api, err := k8s.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	client := &kube.Client{API: api, Namespace: o.Kube.Namespace, Image: o.Kube.Image,
		Volume: kube.SharedDir{Path: o.Kube.SharedDir, Claim: o.Kube.SharedClaim}, RunAs: o.Kube.runAs}
	if r := o.Kube.runAs; r != nil {
		log.Info("kubernetes pods run as", "uid", r.UID, "gid", r.GID)
	}
	agents, err := newClusterAgents(o, ExecutorKubernetes, cluster, o.Kube.Refresh, log)
	if err != nil {
		return err
	}
	running := map[string]*kubeNode{}
	refresh := func() error {
		nodes, err := client.Nodes(ctx, o.Kube.NodeSelector)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, nd := range nodes {
			seen[nd.Name] = true
			if kn, ok := running[nd.Name]; ok {
				kn.set(nd)
				continue
			}
			kn := &kubeNode{client: client, cluster: cluster, name: nd.Name, flags: o.Kube, node: nd, log: log.With("kube_node", nd.Name)}
			if err := agents.start(ctx, nd.Name, kn.log, func(o *Options) { o.kube = kn }); err != nil {
				return err
			}
			running[nd.Name] = kn
			log.Info("standing for kubernetes node", "node", nd.Name, "gpus", nd.GPUs, "product", nd.Product, "unavailable", nd.Unavailable(), "cluster", cluster)
		}
		for name, kn := range running {
			if !seen[name] {
				// Deleted from the cluster (or no longer selected): its
				// broker node stays, uncertified, with why.
				kn.set(kube.Node{Name: name, NotReady: "gone from the cluster's GPU nodes"})
			}
		}
		return nil
	}
	return agents.run(ctx, refresh)
}
