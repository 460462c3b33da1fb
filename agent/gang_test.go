package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// TestRunAssignmentGang (issue #34): a rank of a run across several
// nodes gets the rendezvous environment, and what a broker hands the
// agent is checked before anything starts: a rank beyond the gang, an
// address a shell would read more into, and, on rank 0, which listens, a
// port outside this node's job ports are refused, as is any rank on a
// node that advertises no job ports.
func TestRunAssignmentGang(t *testing.T) {
	t.Parallel()
	job := tarball(t, map[string]string{"job.sh": `echo "rdv $MASTER_ADDR $MASTER_PORT rank $RANK of $WORLD_SIZE node $GPUPASS_NODE_RANK/$NNODES local $LOCAL_RANK"` + "\n"})
	tests := []struct {
		name       string
		gang       rendezvous.Gang
		noPorts    bool
		wantState  AllocState
		wantReason string
		wantMsg    string
	}{
		{name: "rank 1 of 2", gang: rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.7", MasterPort: 29650},
			wantState: StateSucceeded, wantMsg: "rdv 10.0.0.7 29650 rank 1 of 2 node 1/2 local 0"},
		{name: "rank 0 on a port of its own", gang: rendezvous.Gang{NodeRank: 0, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.5", MasterPort: 29599},
			wantState: StateSucceeded, wantMsg: "rdv 10.0.0.5 29599 rank 0 of 2 node 0/2 local 0"},
		{name: "rank 0 told to listen on a port not its own", gang: rendezvous.Gang{NodeRank: 0, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.5", MasterPort: 22},
			wantState: StateFailed, wantReason: "the broker's rendezvous port 22 is not one of this node's job ports 29500-29599"},
		{name: "a rank beyond the gang", gang: rendezvous.Gang{NodeRank: 2, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.5", MasterPort: 29500},
			wantState: StateFailed, wantReason: "node rank 2: want 0 to 1"},
		{name: "an address a shell would read more into", gang: rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 1, MasterAddr: "x;reboot", MasterPort: 29500},
			wantState: StateFailed, wantReason: "master address"},
		{name: "a node that takes no rank", noPorts: true, gang: rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.5", MasterPort: 29500},
			wantState: StateFailed, wantReason: "it advertises no job ports"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newMemSource()
			l := &RunLoop{
				Source: src, AgentID: func() string { return "agent-1" },
				Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
				StateDir: t.TempDir(), Python: "/usr/bin/python3",
				UpdateEvery: 20 * time.Millisecond, DrainTimeout: 10 * time.Second,
				JobPortMin: 29500, JobPortMax: 29599,
			}
			if tc.noPorts {
				l.JobPortMin, l.JobPortMax = 0, 0
			}
			g := tc.gang
			a := Assignment{AllocID: "alloc-0000abcd-r1", FencingToken: 7, Command: []string{"sh", "job.sh"}, Workdir: job,
				Spec: []byte(`{"name":"x","runtime":{},"security":{},"resources":{}}`), Region: "us-west-2", Gang: &g, GangRun: "alloc-0000abcd"}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			final := l.RunAssignment(ctx, &a)
			if final.State != tc.wantState || !strings.Contains(final.Reason, tc.wantReason) {
				t.Errorf("final %s (%s), want %s saying %q", final.State, final.Reason, tc.wantState, tc.wantReason)
			}
			msgs := src.messages(t)
			if tc.wantMsg != "" && !contains(msgs, tc.wantMsg) {
				t.Errorf("the job did not see its rendezvous %q; events: %q", tc.wantMsg, msgs)
			}
			if tc.wantState == StateFailed && contains(msgs, "rdv ") {
				t.Errorf("the job ran with a refused rendezvous: %q", msgs)
			}
		})
	}
}
