package broker_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestSlurmPlacement: the Slurm job an agent reports with an update is
// kept with the run (across a broker restart) and shown to readers; an
// update without one (an older agent, another executor) keeps it; an
// oversized field is refused.
func TestSlurmPlacement(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := brokertest.NewDB(t, kind)
			b := brokertest.Start(t, db, brokertest.Fast())
			agentTok, readTok := b.Token(t, store.RoleAgent, "*"), b.Token(t, store.RoleSubmit, "*")
			w := newWorker(t, b, agentTok, brokertest.H100("hpc-eu", 20))
			c := dialRuns(t, b, readTok)
			run := submit(t, c, "hpc-eu", nil)
			if run.Slurm != nil {
				t.Fatalf("a run not started has a slurm placement: %v", run.Slurm)
			}
			as := w.poll(t, 5)
			send := func(st gpupassv1.AllocState, p *gpupassv1.SlurmPlacement) error {
				_, err := w.runs.Work.UpdateAllocation(context.Background(), connect.NewRequest(&gpupassv1.UpdateAllocationRequest{
					AgentId: w.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, State: st, Attempts: 1, Slurm: p}))
				return err
			}
			want := &gpupassv1.SlurmPlacement{Cluster: "hpc1", JobId: "4021", Node: "gpu-n17", Partition: "a100"}
			if err := send(gpupassv1.AllocState_ALLOC_STATE_RUNNING, want); err != nil {
				t.Fatal(err)
			}
			if err := send(gpupassv1.AllocState_ALLOC_STATE_RUNNING, nil); err != nil {
				t.Fatal(err)
			}
			long := &gpupassv1.SlurmPlacement{Cluster: "hpc1", JobId: "1", Node: strings.Repeat("n", 257)}
			if err := send(gpupassv1.AllocState_ALLOC_STATE_RUNNING, long); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "slurm.node") {
				t.Errorf("a 257-byte node name: %v, want invalid_argument naming slurm.node", err)
			}
			if err := send(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, nil); err != nil {
				t.Fatal(err)
			}
			b.Stop(t)
			b2 := brokertest.Start(t, db, brokertest.Fast())
			c2 := dialRuns(t, b2, readTok)
			got := getRun(t, c2, run.Id)
			if diff := cmp.Diff(want, got.Slurm, protocmp.Transform()); diff != "" {
				t.Errorf("GetRun slurm (-want +got):\n%s", diff)
			}
			list, err := c2.Run.ListRuns(context.Background(), connect.NewRequest(&gpupassv1.ListRunsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Msg.Runs) != 1 || !cmp.Equal(want, list.Msg.Runs[0].Slurm, protocmp.Transform()) {
				t.Errorf("ListRuns = %v, want the run with %v", list.Msg.Runs, want)
			}
		})
	}
}
