package agent

import (
	"slices"

	"github.com/spf13/pflag"

	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor/slurm"
	"github.com/gpupass/gpupass/internal/command/executorflags"
)

// backends are the executors this gpupass-agent has (--executor), in the
// order --help lists them: adding one is its package and a line here.
// Each call of a constructor gives a backend with settings of its own, so
// command trees built side by side (tests) share none.
var backends = []func() daemon.Backend{
	daemon.LocalBackend,
	slurm.Backend,
}

// missingBackends says, for an executor a build left out, where to find
// it (backends_*.go); --executor names it in its error.
var missingBackends = map[string]string{}

// newBackends makes this command tree's backends.
func newBackends() []daemon.Backend {
	bs := make([]daemon.Backend, len(backends))
	for i, b := range backends {
		bs[i] = b()
	}
	return bs
}

// Backends are this build's executors' constructors, in backends' order
// (gpupass-docs writes their flags for gpupass up: ExecutorFlags).
func Backends() []func() daemon.Backend { return slices.Clone(backends) }

// ExecutorFlags describes the executors bs make, each with its flags as
// it registers them and its stack's settings (daemon.Regional): the data
// gpupass up, which links no executor, offers and hands to the agents.
func ExecutorFlags(bs []func() daemon.Backend) ([]executorflags.Executor, error) {
	var es []executorflags.Executor
	for _, mk := range bs {
		b := mk()
		fs := pflag.NewFlagSet(b.Name(), pflag.ContinueOnError)
		b.AddFlags(fs)
		var standsFor string
		var stack map[string]string
		if r, ok := b.(daemon.Regional); ok {
			standsFor, stack = r.StandsFor(), r.StackFlags()
		}
		e, err := executorflags.Describe(b.Name(), b.Usage(), standsFor, fs, stack)
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}
