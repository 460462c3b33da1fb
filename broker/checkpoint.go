package broker

import (
	"context"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// attachCheckpoint gives a run that resumes on a new node (its old node
// was lost mid-run, --resume-elsewhere) the newest checkpoint the old
// node shipped before it was lost. Chunks past resume_after_seq are not
// looked at: the broker did not hold them gap-free when the run moved.
func (b *Broker) attachCheckpoint(ctx context.Context, rs store.Runs, a store.Alloc, as *gpupassv1.Assignment) error {
	if a.ResumeAfterSeq == 0 {
		return nil
	}
	var asm api.CheckpointAssembler
	var after uint64
	for after < a.ResumeAfterSeq {
		recs, err := rs.Records(ctx, a.ID, after, store.RecordCheckpoint, 64)
		if err != nil {
			return b.storeErr("reading checkpoints of "+a.ID, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Seq > a.ResumeAfterSeq {
				break
			}
			if err := asm.Add(r.Data); err != nil {
				b.log.Warn("skipping unreadable checkpoint record", "alloc", a.ID, "seq", r.Seq, "err", err)
			}
		}
		after = recs[len(recs)-1].Seq
	}
	as.ResumeCheckpointName, as.ResumeCheckpoint = asm.Newest()
	if as.ResumeCheckpointName != "" {
		b.log.Info("run resumes from a shipped checkpoint", "alloc", a.ID, "checkpoint", as.ResumeCheckpointName, "bytes", len(as.ResumeCheckpoint))
	}
	return nil
}
