package executor_test

import (
	"context"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/spec"
)

// gpusRunner records the GPU count each attempt was started with.
type gpusRunner struct {
	mu   sync.Mutex
	gpus []int
}

func (r *gpusRunner) Run(_ context.Context, a executor.Attempt, _ func(executor.Line)) executor.Exit {
	r.mu.Lock()
	r.gpus = append(r.gpus, a.GPUs)
	r.mu.Unlock()
	return executor.Exit{}
}

// TestAttemptGPUs: a runner learns how many accelerators the run's spec
// asks for on its node (resources.count, a gang rank's share), and 0 for a run without a spec (a runner
// that hands GPUs out then gives all the node's).
func TestAttemptGPUs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec *spec.Spec
		want int
	}{
		{"spec asks for 2", &spec.Spec{Resources: spec.Resources{Count: 2}}, 2},
		// A rank of a run across 2 nodes holds its share (#34): two
		// ranks asking for the whole count each would take twice it.
		{"gang of 2 asks for 4 in all", &spec.Spec{Resources: spec.Resources{Count: 4, Nodes: 2}}, 2},
		{"no spec", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &gpusRunner{}
			out := execute(t, context.Background(), executor.Job{Command: []string{"train"}, Spec: tc.spec}, &executor.Executor{Runner: r})
			if out.res.State != executor.Succeeded {
				t.Fatalf("run %s: %s", out.res.State, out.res.Reason)
			}
			if len(r.gpus) != 1 || r.gpus[0] != tc.want {
				t.Errorf("attempts started with GPUs %v, want [%d]", r.gpus, tc.want)
			}
		})
	}
}
