package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// What the Slurm and Kubernetes executors share: the agent on a login
// node (or in a cluster) stands for every node of the cluster, one broker
// node each, and measures each node where it is, through the cluster.

// RemoteNode is a node measured through its cluster: a Slurm job step, a
// Kubernetes Job.
type RemoteNode interface {
	// Measure runs the agent's facts command on the node once for all
	// the probes of a suite run (RemoteArgs).
	Measure(ctx context.Context, o *Options) (*probe.Facts, error)
	// Via names the cluster in the reason a failed measurement gives.
	Via() string
}

// RemoteSuite is a node's conformance suite: every probe runs on the node,
// in the one measurement its cluster makes.
func RemoteSuite(n RemoteNode, o *Options) *suite.Suite {
	m := &measurement{n: n}
	var ps []probe.Probe
	for _, name := range []string{"gpu", "nvcc", "python", "storage", "fips"} {
		ps = append(ps, remoteProbe{name: name, m: m, o: o})
	}
	return suite.New(ps...)
}

// measurement is a node's last measurement, which the probes of one suite
// run share: the node is measured once for all of them.
type measurement struct {
	n     RemoteNode
	mu    sync.Mutex
	facts *probe.Facts
	err   error
	at    time.Time
}

func (m *measurement) get(ctx context.Context, o *Options) (*probe.Facts, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.at) < 2*time.Second {
		return m.facts, m.err
	}
	m.facts, m.err = m.n.Measure(ctx, o)
	m.at = time.Now()
	return m.facts, m.err
}

type runGPUsKey struct{}

// ForRun is ctx for measuring a node at a run's start (runtime-init,
// RunReport), where the run gets gpus of the node's GPUs: a cluster
// backend measures in a job that asks for that many, what the run's own
// pod or step will hold, so the check fits beside what else runs there
// (a gang's other ranks on the same node).
func ForRun(ctx context.Context, gpus int) context.Context {
	return context.WithValue(ctx, runGPUsKey{}, gpus)
}

// RunGPUs is ForRun's gpus; 0 for the node's own suite, which measures
// every GPU.
func RunGPUs(ctx context.Context) int {
	g, _ := ctx.Value(runGPUsKey{}).(int)
	return g
}

// Watched is what a backend last read of one of its cluster's nodes: set
// by its refresh, read by the agent that stands for the node.
type Watched[T any] struct {
	mu sync.Mutex
	v  T
}

// Get is the node as last read.
func (w *Watched[T]) Get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}

// Set records the node as read now.
func (w *Watched[T]) Set(v T) {
	w.mu.Lock()
	w.v = v
	w.mu.Unlock()
}

// remoteProbe is one probe's section of what the node's measurement found.
type remoteProbe struct {
	name string
	m    *measurement
	o    *Options
}

func (p remoteProbe) Name() string { return p.name }

func (p remoteProbe) Measure(ctx context.Context) (probe.Section, error) {
	f, err := p.m.get(ctx, p.o)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		// What could not be measured fails the node's checks, with why.
		note := "measuring through " + p.m.n.Via() + ": " + err.Error()
		f = &probe.Facts{}
		f.GPU.Reason, f.NVCC.Reason, f.Python.Reason = note, note, note
	}
	switch p.name {
	case "gpu":
		return f.GPU, nil
	case "nvcc":
		return f.NVCC, nil
	case "python":
		return f.Python, nil
	case "storage":
		return f.Storage, nil
	}
	return f.FIPS, nil
}

// RemoteArgs is the agent's facts command (exe, as the node sees it), run
// on the node with dir, the node's own dir in the shared dir, for the
// storage probe. The facts command's state dir holds a key that signs
// nothing; it stays so a simulated profile keeps its GPU UUIDs from one
// measurement to the next.
func RemoteArgs(exe, dir string, o *Options) []string {
	args := []string{exe, "facts", "--python", o.Python, "--read-probe-mb", strconv.Itoa(o.ReadProbeMB),
		"--storage-path", dir, "--state-dir", filepath.Join(dir, "facts")}
	if o.Simulate != "" {
		args = append(args, "--simulate", o.Simulate)
	}
	if o.NVCC != "" {
		args = append(args, "--nvcc", o.NVCC)
	}
	return args
}

// ClusterAgents runs one agent per node of a cluster until ctx ends, all
// over one connection to the broker: each request names and proves its
// node, so the nodes share one ControlPlane.
type ClusterAgents struct {
	o *Options
	// kind is the executor (slurm, kubernetes): the provider is
	// KIND:CLUSTER and each node's state dir --state-dir/KIND/CLUSTER-NODE.
	kind, cluster string
	// refresh is how often the cluster's nodes are read again.
	refresh time.Duration
	log     *slog.Logger
	cp      ControlPlane

	wg   sync.WaitGroup
	errs chan error
}

// NewClusterAgents dials the broker for the agents of cluster, whose
// backend is kind.
func NewClusterAgents(o *Options, kind, cluster string, refresh time.Duration, log *slog.Logger) (*ClusterAgents, error) {
	tlsConf, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	o.warnInsecureHTTP(log)
	co := o.brokerOptions(tlsConf)
	co.Timeout = 30 * time.Second
	clients, err := brokerclient.Dial(o.BrokerURL, co)
	if err != nil {
		return nil, err
	}
	return &ClusterAgents{o: o, kind: kind, cluster: cluster, refresh: refresh, log: log, cp: NewControlPlane(clients), errs: make(chan error, 1)}, nil
}

var nodeIDUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// NodeStateDir is the node's own state dir (identity key, reports), so
// its broker node id is stable across restarts.
func (c *ClusterAgents) NodeStateDir(node string) string {
	return filepath.Join(c.o.StateDir, c.kind, nodeIDUnsafe.ReplaceAllString(c.cluster+"-"+node, "_"))
}

// Start starts the agent that stands for n, the cluster's node named
// node: hostname the node's name, an identity of its own (NodeStateDir),
// simulate its hardware profile (--simulate when ""), its suite run at
// least once a refresh so a node the cluster takes out is reported within
// one. Its jobs are reached at the agent's job address: a Kubernetes
// agent's rendezvous.PodAddress (rank 0's pod IP, once the pod is); none
// for a Slurm agent, whose nodes each have their own (StartAt).
func (c *ClusterAgents) Start(ctx context.Context, node string, log *slog.Logger, n Node, simulate string) error {
	return c.StartAt(ctx, node, c.o.JobAddress, log, n, simulate)
}

// StartAt is Start for a node whose jobs the other nodes of a gang reach
// at addr (a Slurm node's NodeAddr): with the agent's --job-ports the node
// advertises addr and them, and takes gang ranks. Without job ports, or
// with an addr no rendezvous may use (said in the log), it takes none.
func (c *ClusterAgents) StartAt(ctx context.Context, node, addr string, log *slog.Logger, n Node, simulate string) error {
	clone := *c.o
	clone.JobAddress = ""
	if clone.jobPortMax > 0 {
		if err := rendezvous.CheckAddr(addr); err != nil {
			log.Warn("the node takes no rank of a run across several nodes: its address is no rendezvous address", "node", node, "err", err)
			clone.jobPortMin, clone.jobPortMax = 0, 0
		} else {
			clone.JobAddress = addr
		}
	}
	clone.StateDir = c.NodeStateDir(node)
	clone.Provider = c.kind + ":" + c.cluster
	clone.Hostname = node
	// Serve, not Run: no query endpoint per node.
	clone.RunCgroup = "off"
	// The runs are batch jobs or pods elsewhere, not processes here.
	clone.RunPrivateTmp = "off"
	if clone.SuiteInterval > c.refresh {
		clone.SuiteInterval = c.refresh
	}
	clone.standsFor = n
	if simulate != "" {
		clone.Simulate = simulate
	}
	a, err := New(&clone, log)
	if err != nil {
		return fmt.Errorf("%s node %s: %w", c.kind, node, err)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := a.Serve(ctx, c.cp); err != nil && ctx.Err() == nil {
			select {
			case c.errs <- fmt.Errorf("%s node %s: %w", c.kind, node, err):
			default:
			}
		}
	}()
	return nil
}

// Run reads the cluster's nodes (refresh, which starts an agent for each
// new one) now and every c.refresh until ctx ends or a node's agent
// fails; a failed first read is the caller's error, a later one keeps the
// last view.
func (c *ClusterAgents) Run(ctx context.Context, refresh func() error) error {
	if err := refresh(); err != nil {
		return err
	}
	t := time.NewTicker(c.refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.wg.Wait()
			return nil
		case err := <-c.errs:
			c.wg.Wait()
			return err
		case <-t.C:
			if err := refresh(); err != nil {
				c.log.Warn("reading "+c.kind+" nodes; keeping the last view", "err", err)
			}
		}
	}
}
