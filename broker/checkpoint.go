package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// attachCheckpoint gives a run that resumes on a new node (its old node
// was lost mid-run, --resume-elsewhere) the newest checkpoint the old
// node shipped before it was lost. Chunks past resume_after_seq are not
// looked at: the broker did not hold them gap-free when the run moved.
//
// Every rank of a restarted gang gets rank 0's: rank 0 alone ships them
// (the ranks of a data-parallel run hold the same state at a checkpoint).
func (b *Broker) attachCheckpoint(ctx context.Context, rs store.Runs, a store.Alloc, as *gpupassv1.Assignment) error {
	if a.Gang != "" {
		head, err := rs.Alloc(ctx, a.Gang)
		if err != nil {
			return b.storeErr("reading rank 0 of "+a.ID, err)
		}
		a = head
	}
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

// maxCheckpointReads is how many GetCheckpoint calls assemble a
// checkpoint at once; a call waits checkpointSlotWait for a turn.
const (
	maxCheckpointReads = 4
	checkpointSlotWait = 30 * time.Second
)

func init() {
	AllowRoles(gpupassv1connect.RunServiceGetCheckpointProcedure, store.RoleRead, store.RoleSubmit, store.RoleAdmin)
}

// GetCheckpoint streams the newest complete checkpoint a finished run
// shipped, so that `gpupass model push RUN` pushes what the run's node
// wrote, checked against the digest the node stated. Only records the
// broker holds gap-free are read; the assembler keeps at most one
// checkpoint (api.MaxCheckpointBytes) in memory.
func (s *runService) GetCheckpoint(ctx context.Context, req *connect.Request[gpupassv1.GetCheckpointRequest], stream *connect.ServerStream[gpupassv1.GetCheckpointResponse]) error {
	b := s.b
	rs, err := b.runStore()
	if err != nil {
		return err
	}
	a, err := b.visibleRun(ctx, rs, req.Msg.AllocId)
	if err != nil {
		return err
	}
	if !a.State.Terminal() {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s is still %s: its final checkpoint is known once it ends", a.ID, a.State))
	}
	// A read token must not make the broker hold a checkpoint per call
	// it opens: a few at a time, the others wait, then are told to retry.
	t := time.NewTimer(checkpointSlotWait)
	defer t.Stop()
	select {
	case b.ckptSlots <- struct{}{}:
		defer func() { <-b.ckptSlots }()
	case <-t.C:
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the broker is sending %d checkpoints already: retry in a few seconds", maxCheckpointReads))
	case <-ctx.Done():
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	var asm api.CheckpointAssembler
	var after uint64
	for after < a.HeldThrough {
		recs, err := rs.Records(ctx, a.ID, after, store.RecordCheckpoint, 16)
		if err != nil {
			return b.storeErr("reading checkpoints of "+a.ID, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Seq > a.HeldThrough {
				break
			}
			if err := asm.Add(r.Data); err != nil {
				b.log.Warn("skipping unreadable checkpoint record", "alloc", a.ID, "seq", r.Seq, "err", err)
			}
		}
		after = recs[len(recs)-1].Seq
	}
	name, data := asm.Newest()
	if name == "" {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s shipped no checkpoint: its node ships them for runs submitted with `gpupass train --resume-elsewhere` that write to $GPUPASS_CHECKPOINT_DIR", a.ID))
	}
	sum := sha256.Sum256(data)
	first := &gpupassv1.GetCheckpointResponse{Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}
	for off := 0; off == 0 || off < len(data); off += api.CheckpointChunk {
		msg := first
		if off > 0 {
			msg = &gpupassv1.GetCheckpointResponse{}
		}
		msg.Data = data[off:min(off+api.CheckpointChunk, len(data))]
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}
