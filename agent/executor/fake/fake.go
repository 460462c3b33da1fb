// Package fake is an executor for tests: a cluster of --fake-nodes nodes
// that are all this machine. It shows what an executor is (a package that
// implements agent.Backend and agent.Node, and a line in
// internal/command/agent's list) and drives the agent's generic cluster
// path (agent.ClusterAgents, a node measured through its "cluster", runs
// through the node's Runner in its WorkRoot) without Slurm or Kubernetes.
// No binary lists it.
package fake

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/probe"
)

// Name is --executor fake.
const Name = "fake"

// Fields of the errors the backend returns.
const (
	FieldDir   = "fake dir"
	FieldNodes = "fake nodes"
)

// CheckName is the check every report of a fake node carries first.
const CheckName = "fake.node"

// Backend is the fake executor.
func Backend() agent.Backend {
	return agent.Define(agent.Spec[settings]{
		About:  agent.About{Executor: Name, Help: "test-only: nodes that are all this machine; see --fake-*"},
		Bind:   bind,
		Fields: map[string]string{FieldDir: "--fake-dir", FieldNodes: "--fake-nodes"},
		Stack:  inStack,
		Run:    serve,
	})
}

type settings struct {
	dir   string
	nodes int
}

func bind(f agent.FlagSet, s *settings) {
	f.StringVar(&s.dir, "fake-dir", "", "with --executor fake: absolute directory the fake cluster's nodes share (runs' work dirs)")
	f.IntVar(&s.nodes, "fake-nodes", 1, "with --executor fake: how many nodes the agent stands for")
}

// inStack (agent.Regional): each region's agent of a gpupass up stack
// has nodes of its own under --fake-dir.
func inStack(s *settings, _, region string) error {
	s.dir = agent.InRegion(s.dir, region)
	return nil
}

func serve(ctx context.Context, o *agent.Options, s *settings, log *slog.Logger) error {
	if s.dir == "" || !filepath.IsAbs(s.dir) {
		return fielderr.New(FieldDir, s.dir, "give an absolute directory")
	}
	if s.nodes < 1 {
		return fielderr.New(FieldNodes, fmt.Sprint(s.nodes), "must be 1 or more")
	}
	agents, err := agent.NewClusterAgents(o, Name, "test", time.Hour, log)
	if err != nil {
		return err
	}
	started := false
	return agents.Run(ctx, func() error {
		// The nodes never change: started once.
		if started {
			return nil
		}
		for i := range s.nodes {
			name := fmt.Sprintf("fake-%d", i)
			n := &node{name: name, dir: filepath.Join(s.dir, name), stateDir: agents.NodeStateDir(name)}
			if err := agents.Start(ctx, name, log.With("fake_node", name), n, ""); err != nil {
				return err
			}
		}
		started = true
		return nil
	})
}

// node is one fake node: measured in-process as `gpupass-agent facts`
// would measure it, its runs local processes.
type node struct {
	name, dir, stateDir string
}

func (n *node) Via() string { return "fake" }

func (n *node) Measure(ctx context.Context, o *agent.Options) (*probe.Facts, error) {
	fo := *o
	fo.StateDir = filepath.Join(n.stateDir, "facts")
	fo.StandFor(nil)
	a, err := agent.New(&fo, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return a.Facts(ctx)
}

func (n *node) Suite(o *agent.Options) *suite.Suite { return agent.RemoteSuite(n, o) }

func (n *node) Checks(*probe.Facts) (first, last []conformance.Check) {
	return []conformance.Check{{Name: CheckName, Expected: "this machine", Actual: n.name, Status: conformance.Pass}}, nil
}

func (n *node) Runner() executor.Runner { return local.ProcessRunner{} }

func (n *node) WorkRoot() string {
	_ = os.MkdirAll(n.dir, 0o755)
	return filepath.Join(n.dir, "runs")
}

func (n *node) Orphaned(context.Context, string) string {
	return "agent restarted during the run: its fake processes ended with it"
}

func (n *node) Placement(string) *agent.SlurmPlacement { return nil }

func (n *node) JobDir() string { return "" }
