package agent

import (
	"context"
	"path/filepath"
	"strconv"

	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/probe"
)

// What the Slurm and Kubernetes executors share: the agent on a login
// node (or in a cluster) stands for every node of the cluster, one broker
// node each, and measures each node where it is, through the cluster.

// remoteNode is a node measured through its cluster: a Slurm job step, a
// Kubernetes Job.
type remoteNode interface {
	// measure runs the agent's facts command on the node once for all
	// the probes of a suite run (remoteArgs).
	measure(ctx context.Context, o *Options) (*probe.Facts, error)
	// via names the cluster in the reason a failed measurement gives.
	via() string
}

// remoteSuite is a node's conformance suite: every probe runs on the node,
// in the one measurement its cluster makes.
func remoteSuite(n remoteNode, o *Options) *suite.Suite {
	var ps []probe.Probe
	for _, name := range []string{"gpu", "nvcc", "python", "storage", "fips"} {
		ps = append(ps, remoteProbe{name: name, n: n, o: o})
	}
	return suite.New(ps...)
}

// remoteProbe is one probe's section of what the node's measurement found.
type remoteProbe struct {
	name string
	n    remoteNode
	o    *Options
}

func (p remoteProbe) Name() string { return p.name }

func (p remoteProbe) Measure(ctx context.Context) (probe.Section, error) {
	f, err := p.n.measure(ctx, p.o)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		// What could not be measured fails the node's checks, with why.
		note := "measuring through " + p.n.via() + ": " + err.Error()
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

// remoteArgs is the agent's facts command (exe, as the node sees it), run
// on the node with dir, the node's own dir in the shared dir, for the
// storage probe. The facts command's state dir holds a key that signs
// nothing; it stays so a simulated profile keeps its GPU UUIDs from one
// measurement to the next.
func remoteArgs(exe, dir string, o *Options) []string {
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
