package agent

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
)

// follow takes a run on again whose attempt outlived an earlier agent
// process (a Slurm batch job): runtime-init passed then and the broker
// holds the run as running, so it goes straight to following the attempt
// from the spool's mark, with the uploader and the lease watcher of a
// run started here. It returns the run's end, or stale when the broker
// gave the run to another node meanwhile (it is that node's to report).
func (l *RunLoop) follow(ctx context.Context, log *slog.Logger, e runLedger, sp *spool.Spool, up *uploader.Uploader, mark executor.Mark) (final AllocUpdate, stale bool) {
	if l.Busy != nil {
		defer l.Busy()()
	}
	a := e.assignment()
	r := &run{l: l, a: a, log: log, spool: sp, up: up, ledgerWritten: func() error { return nil }, reattach: &mark, prepared: e.Job}
	r.final = AllocUpdate{AllocID: a.AllocID, FencingToken: a.FencingToken}
	sp2, err := decodeSpec(a.Spec)
	if err != nil {
		log.Error("the run's recorded spec", "err", err)
	}
	r.spec = sp2
	r.workRoot = filepath.Join(l.StateDir, "runs")
	if l.WorkRoot != "" {
		r.workRoot = l.WorkRoot
	}
	r.workDir = filepath.Join(r.workRoot, a.AllocID)
	log.Info("following a run on that an earlier agent process started", "attempt", mark.Attempt, "stdout_offset", mark.Stdout, "stderr_offset", mark.Stderr, "metrics_offset", mark.Metrics)
	r.state.Store(StateRunning)
	up.Sink, r.untrack = l.Metrics.Track(sp, func() string { return string(r.state.Load().(AllocState)) }, up.Sink)
	defer r.untrack()
	res, err := r.execute(ctx)
	r.settle(ctx, res, err)
	if r.stale.Load() {
		return r.final, true
	}
	r.final.LastSeq = max(r.final.LastSeq, sp.Stats().LastSeq)
	return r.final, false
}
