package executor_test

import (
	"context"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
)

// exitRunner ends every attempt the way it is told, as a scheduler's
// runner reports a job the scheduler ended.
type exitRunner executor.Exit

func (r exitRunner) Run(context.Context, executor.Attempt, func(executor.Line)) executor.Exit {
	return executor.Exit(r)
}

// TestNodeFault: an attempt that ended because of its node (Slurm's
// NODE_FAIL or PREEMPTED, a job sbatch refused) fails the run with the
// fault named, for the broker to re-place it and count the node's failed
// launch; the job's own failures name none.
func TestNodeFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		exit  executor.Exit
		fault executor.NodeFault
	}{
		{"node lost", executor.Exit{Code: -1, NodeLost: true, Reason: "node lost: slurm job 7 on n1: NODE_FAIL (NodeDown)"}, executor.NodeLost},
		{"launch refused", executor.Exit{Code: -1, LaunchFailed: true, StartErr: context.DeadlineExceeded}, executor.LaunchFailed},
		{"the job's own failure", executor.Exit{Code: 3, Reason: "slurm job 7 on n1: FAILED (exit code 3)"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := execute(t, context.Background(), executor.Job{Command: []string{"train"}}, &executor.Executor{Runner: exitRunner(tc.exit)})
			if out.res.State != executor.Failed || out.res.NodeFault != tc.fault {
				t.Errorf("result = %s, fault %q (%s); want failed, fault %q", out.res.State, out.res.NodeFault, out.res.Reason, tc.fault)
			}
		})
	}
}
