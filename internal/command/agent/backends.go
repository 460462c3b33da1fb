package agent

import (
	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor/slurm"
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
