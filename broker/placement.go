package broker

import (
	"fmt"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// maxPlacementField bounds each field of a Slurm placement an agent
// reports: Slurm's names and job ids are short, and what an agent sends
// is stored with the run and shown to every reader of it.
const maxPlacementField = 256

// slurmPlacement checks and converts the Slurm placement of an
// UpdateAllocation; nil when the agent sent none (another executor, or an
// agent older than the field).
func slurmPlacement(p *gpupassv1.SlurmPlacement) (*store.SlurmPlacement, error) {
	if p == nil {
		return nil, nil
	}
	for _, f := range []struct{ name, v string }{{"cluster", p.Cluster}, {"job_id", p.JobId}, {"node", p.Node}, {"partition", p.Partition}} {
		if len(f.v) > maxPlacementField {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("slurm.%s: %d bytes, at most %d", f.name, len(f.v), maxPlacementField))
		}
	}
	if p.JobId == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("slurm.job_id is required with a slurm placement"))
	}
	return &store.SlurmPlacement{Cluster: p.Cluster, JobID: p.JobId, Node: p.Node, Partition: p.Partition}, nil
}

func slurmPlacementProto(p *store.SlurmPlacement) *gpupassv1.SlurmPlacement {
	if p == nil {
		return nil
	}
	return &gpupassv1.SlurmPlacement{Cluster: p.Cluster, JobId: p.JobID, Node: p.Node, Partition: p.Partition}
}
