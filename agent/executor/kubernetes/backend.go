package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/probe"
	k8s "k8s.io/client-go/kubernetes"
)

// Name is --executor kubernetes.
const Name = "kubernetes"

// Fields of the errors the backend returns (Backend.FlagNames).
const (
	FieldKubeconfig = "kubeconfig"
	FieldImage      = "kubernetes run image"
	FieldNamespace  = "kubernetes namespace"
	FieldSharedDir  = "kubernetes shared dir"
	FieldRefresh    = "kubernetes refresh"
	FieldTimeLimit  = "kubernetes time limit"
	FieldCluster    = "kubernetes cluster"
	FieldRunAs      = "kubernetes pods' user"
)

// Flags configure --executor kubernetes: the agent runs in the
// cluster (its service account) or outside it (a kubeconfig) and stands
// for each GPU node, one broker node each.
type Flags struct {
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
	runAs *RunAs
}

// kubeRunAs resolves --kube-run-as for an agent running as euid:egid.
func kubeRunAs(v string, euid, egid int) (*RunAs, error) {
	switch v {
	case "image":
		return nil, nil
	case "":
		if euid == 0 {
			return nil, nil
		}
		return &RunAs{UID: int64(euid), GID: int64(egid)}, nil
	}
	u, g, ok := strings.Cut(v, ":")
	uid, uerr := strconv.ParseInt(u, 10, 32)
	gid, gerr := strconv.ParseInt(g, 10, 32)
	if !ok || uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return nil, fielderr.New(FieldRunAs, v, `give UID:GID (numbers, as a pod's runAsUser and runAsGroup), "image" for the image's user, or nothing for the agent's own`)
	}
	if euid != 0 && uid != int64(euid) {
		return nil, fielderr.New(FieldRunAs, v, "the agent runs as uid %d and could not delete what pods running as uid %d write into the shared dir: leave it unset (the agent's own uid), or run the agent as root", euid, uid)
	}
	return &RunAs{UID: uid, GID: gid}, nil
}

// Backend is the Kubernetes executor (agent.Backend): the agent runs in
// the cluster or beside it and stands for each GPU node.
func Backend() agent.Backend {
	return agent.Define(agent.Spec[Flags]{
		About: agent.About{Executor: Name, Help: "Jobs on a cluster's GPU nodes, each enrolled as a node of its own; see --kube-*"},
		Bind:  bind,
		Fields: map[string]string{
			FieldKubeconfig: "--kubeconfig",
			FieldImage:      "--kube-image",
			FieldNamespace:  "--kube-namespace",
			FieldSharedDir:  "--kube-shared-dir",
			FieldRefresh:    "--kube-refresh",
			FieldTimeLimit:  "--kube-time-limit",
			FieldCluster:    "--kube-cluster",
			FieldRunAs:      "--kube-run-as",
		},
		Stack:     inStack,
		StandsFor: "every GPU node",
		// A gang's ranks are pods: rank 0's pod IP is the rendezvous.
		PodJobs: true,
		// A stack beside this machine: the local cluster
		// (scripts/k8s-up.sh) has the default namespace, and its nodes
		// are read every 5s so that a cordon shows at once.
		StackFlags: map[string]string{"kube-namespace": "default", "kube-refresh": "5s"},
		Run:        Run,
	})
}

func bind(f agent.FlagSet, k *Flags) {
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "with --executor kubernetes: kubeconfig file (default $KUBECONFIG, then ~/.kube/config, then the pod's service account)")
	f.StringVar(&k.Namespace, "kube-namespace", "gpupass", "with --executor kubernetes: namespace of the runs' and conformance checks' Jobs")
	f.StringVar(&k.Image, "kube-image", "", "with --executor kubernetes: the runs' container image, pinned by digest (NAME@sha256:…); the certified environment is a node and this image")
	f.StringVar(&k.Cluster, "kube-cluster", "", "with --executor kubernetes: cluster name in node ids and the provider kubernetes:NAME (default: the kubeconfig's current cluster)")
	f.StringVar(&k.SharedDir, "kube-shared-dir", "", "with --executor kubernetes: absolute directory the agent and every pod see at the same path (runs' work dirs, output, metrics, checkpoints); a hostPath unless --kube-shared-claim (in a gpupass up stack, default STATE_DIR/kube-shared: right for scripts/k8s-up.sh's one-node cluster on this machine)")
	f.StringVar(&k.SharedClaim, "kube-shared-claim", "", "with --executor kubernetes: ReadWriteMany PersistentVolumeClaim mounted at --kube-shared-dir in each pod (the agent's pod mounts it there too); empty: hostPath")
	f.StringVar(&k.NodeSelector, "kube-node-selector", "", "with --executor kubernetes: label selector narrowing the GPU nodes enrolled (e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)")
	f.DurationVar(&k.TimeLimit, "kube-time-limit", 0, "with --executor kubernetes: activeDeadlineSeconds of each run's Job (0: none)")
	f.DurationVar(&k.Refresh, "kube-refresh", 30*time.Second, "with --executor kubernetes: how often nodes are read (a cordoned, NotReady or pressured node stops being certified within one)")
	f.StringVar(&k.RunAs, "kube-run-as", "", `with --executor kubernetes: UID:GID the run and conformance pods run as; "image" keeps the image's user; default the agent's own uid and gid when it is not root (it must be able to delete what runs write), else the image's user`)
	f.StringVar(&k.AgentBinary, "kube-agent-binary", "gpupass-agent", "with --executor kubernetes: gpupass-agent inside --kube-image, which the conformance Job runs")
}

// inStack (agent.Regional): each region's agent of a gpupass up stack
// works under a dir of its own in the shared dir (validate makes it),
// by default the stack's kube-shared: right for scripts/k8s-up.sh's
// one-node cluster on this machine, whose hostPath is this machine's.
func inStack(k *Flags, stackDir, region string) error {
	if k.Image == "" {
		return fielderr.New(FieldImage, "", "is required with the kubernetes executor: the runs' image, pinned by digest (NAME@sha256:…); on the local cluster, `sudo scripts/k8s-up.sh --run-image` builds one and prints the up line that uses it")
	}
	if k.SharedDir == "" {
		k.SharedDir = filepath.Join(stackDir, "kube-shared")
	}
	if !filepath.IsAbs(k.SharedDir) {
		return fielderr.New(FieldSharedDir, k.SharedDir, "give an absolute directory the agent and the pods see at the same path")
	}
	k.SharedDir = agent.InRegion(k.SharedDir, region)
	return nil
}

func validate(k *Flags) error {
	if k.Image == "" {
		return fielderr.New(FieldImage, "", "is required with the kubernetes executor: the runs' image, pinned by digest (NAME@sha256:…)")
	}
	if err := CheckImage(k.Image); err != nil {
		return &fielderr.Error{Field: FieldImage, Problem: err.Error()}
	}
	if k.Namespace == "" {
		return fielderr.New(FieldNamespace, "", "is required with the kubernetes executor")
	}
	if k.SharedDir == "" || !filepath.IsAbs(k.SharedDir) {
		return fielderr.New(FieldSharedDir, k.SharedDir, "give an absolute directory the agent and the pods see at the same path")
	}
	if err := os.MkdirAll(k.SharedDir, 0o755); err != nil {
		return fielderr.New(FieldSharedDir, k.SharedDir, "%w", err)
	}
	if k.Refresh < time.Second {
		return fielderr.New(FieldRefresh, k.Refresh.String(), "must be at least 1s")
	}
	if k.TimeLimit < 0 {
		return fielderr.New(FieldTimeLimit, k.TimeLimit.String(), "must not be negative")
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
	client  *Client
	cluster string
	name    string
	flags   Flags
	log     *slog.Logger

	node agent.Watched[Node]
}

func (n *kubeNode) current() Node { return n.node.Get() }

func (n *kubeNode) dir() string {
	return filepath.Join(n.flags.SharedDir, "gpupass", n.cluster, n.name)
}

// WorkRoot is where the node's runs' work dirs go: in the shared dir.
func (n *kubeNode) WorkRoot() string { return filepath.Join(n.dir(), "runs") }

func (n *kubeNode) Runner() executor.Runner {
	return &Runner{Client: n.client, Cluster: n.cluster, Node: n.name, GPUs: n.current().GPUs, TimeLimit: n.flags.TimeLimit}
}

// Orphaned deletes the Jobs of a run the agent died under and cannot
// follow on (it died before the run's attempt was marked in its spool,
// see RunLoop.follow): a Job nobody follows must not hold the node's
// GPUs.
func (n *kubeNode) Orphaned(ctx context.Context, allocID string) string {
	reason := "agent restarted during the run: its kubernetes jobs were deleted"
	if err := n.client.DeleteRun(ctx, allocID, executor.DefaultGrace); err != nil {
		n.log.Error("deleting the kubernetes jobs of a run the agent died under", "alloc", allocID, "err", err)
		reason += " (failed: " + err.Error() + ")"
	}
	return reason
}

// Measure runs the probes in the image on the node, as one Job, and
// returns what they found; the probes of one suite run share it.
func (n *kubeNode) Measure(ctx context.Context, o *agent.Options) (*probe.Facts, error) {
	if why := n.current().Unavailable(); why != "" {
		// The Job would wait as long as the node is out.
		return nil, fmt.Errorf("not measured: %s", why)
	}
	// A run's Job holds the node's GPUs when an agent restarted under it
	// (a later suite waits for the run, see RunLoop.Busy): the check Job
	// would wait for its end, and the agent could neither enroll nor
	// follow the run meanwhile. The node is measured again once it ends.
	//
	// At a run's start (agent.ForRun) the check asks for the run's GPUs,
	// not all: what the run's pod will get, beside the pods of a gang's
	// other ranks on the node, if any (the scheduler says when it does
	// not fit).
	gpus := n.current().GPUs
	if g := agent.RunGPUs(ctx); g > 0 {
		gpus = g
	} else if jobs, err := n.client.RunJobsOn(ctx, n.name); err != nil {
		return nil, err
	} else if len(jobs) > 0 {
		return nil, fmt.Errorf("not measured: the node runs kubernetes job %s; measured again once it ends", jobs[0])
	}
	if err := os.MkdirAll(n.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("making the node's dir in the shared dir: %w", err)
	}
	out, err := n.client.Step(ctx, n.name, gpus, n.dir(), agent.RemoteArgs(n.flags.AgentBinary, n.dir(), o)...)
	var f probe.Facts
	if err == nil {
		err = decodeFacts(out, &f)
		if err != nil {
			err = fmt.Errorf("reading the conformance job's output on %s: %w", n.name, err)
		}
	}
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

// Suite is the node's conformance suite: every probe runs in the image
// on the node, in one Job.
func (n *kubeNode) Suite(o *agent.Options) *suite.Suite { return agent.RemoteSuite(n, o) }

func (n *kubeNode) Via() string { return "kubernetes" }

// JobDir: jobs run as the pods' user in the cluster; --run-as is this
// machine's.
func (n *kubeNode) JobDir() string { return "" }

// Placement: Kubernetes runs have none to report (their Jobs are named
// after the run).
func (n *kubeNode) Placement(string) *agent.SlurmPlacement { return nil }

// Checks: the kubernetes.node check, after the suite's.
func (n *kubeNode) Checks(*probe.Facts) (first, last []conformance.Check) {
	return nil, []conformance.Check{n.check()}
}

// check is the kubernetes.node check every report of the node carries:
// the node, the image it was measured in, and whether the cluster runs
// pods there.
func (n *kubeNode) check() conformance.Check {
	node := n.current()
	c := conformance.Check{Name: "kubernetes.node", Expected: "schedulable, Ready, no pressure",
		Actual: fmt.Sprintf("node %s on cluster %s (%d %s), measured in image %s", n.name, n.cluster, node.GPUs, GPUResource, n.flags.Image),
		Status: conformance.Pass}
	if why := node.Unavailable(); why != "" {
		c.Status, c.Message = conformance.Fail, why
	}
	return c
}

// Run runs the agent for every GPU node of the cluster until
// ctx ends: one broker node per Kubernetes node, each with an identity
// key of its own under --state-dir/kubernetes/CLUSTER-NODE (so its id is
// stable across restarts), provider kubernetes:CLUSTER, hostname the
// node's name.
func Run(ctx context.Context, o *agent.Options, k *Flags, log *slog.Logger) error {
	if err := validate(k); err != nil {
		return err
	}
	cfg, cluster, err := Config(k.Kubeconfig)
	if err != nil {
		return fielderr.New(FieldKubeconfig, k.Kubeconfig, "%w", err)
	}
	// Which credentials the agent acts with, in its log: in a pod, its
	// service account's token (RBAC of deploy/kubernetes), not a
	// kubeconfig someone mounted.
	if cluster == "" {
		log.Info("kubernetes api: in-cluster config", "server", cfg.Host, "token_file", cfg.BearerTokenFile)
	} else {
		log.Info("kubernetes api: kubeconfig", "server", cfg.Host, "cluster", cluster)
	}
	if k.Cluster != "" {
		cluster = k.Cluster
	}
	if cluster == "" {
		return fielderr.New(FieldCluster, "", "is required in a cluster (no kubeconfig names it): the name node ids and the provider carry")
	}
	api, err := k8s.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	client := &Client{API: api, Namespace: k.Namespace, Image: k.Image,
		Volume: SharedDir{Path: k.SharedDir, Claim: k.SharedClaim}, RunAs: k.runAs}
	if r := k.runAs; r != nil {
		log.Info("kubernetes pods run as", "uid", r.UID, "gid", r.GID)
	}
	agents, err := agent.NewClusterAgents(o, Name, cluster, k.Refresh, log)
	if err != nil {
		return err
	}
	running := map[string]*kubeNode{}
	refresh := func() error {
		nodes, err := client.Nodes(ctx, k.NodeSelector)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, nd := range nodes {
			seen[nd.Name] = true
			if kn, ok := running[nd.Name]; ok {
				kn.node.Set(nd)
				continue
			}
			kn := &kubeNode{client: client, cluster: cluster, name: nd.Name, flags: *k, log: log.With("kube_node", nd.Name)}
			kn.node.Set(nd)
			if err := agents.Start(ctx, nd.Name, kn.log, kn, ""); err != nil {
				return err
			}
			running[nd.Name] = kn
			log.Info("standing for kubernetes node", "node", nd.Name, "gpus", nd.GPUs, "product", nd.Product, "unavailable", nd.Unavailable(), "cluster", cluster)
		}
		for name, kn := range running {
			if !seen[name] {
				// Deleted from the cluster (or no longer selected): its
				// broker node stays, uncertified, with why.
				kn.node.Set(Node{Name: name, NotReady: "gone from the cluster's GPU nodes"})
			}
		}
		return nil
	}
	return agents.Run(ctx, refresh)
}
