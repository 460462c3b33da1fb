package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

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
	sp2, err := decodeSpec(a.Spec, a.SpecFingerprint)
	if err != nil {
		log.Error("the run's recorded spec", "err", err)
	}
	r.spec = sp2
	// A gang's rank goes on with the rendezvous it started with: its
	// executor finds the gang's one job again as that rank's.
	if r.rendezvous, err = l.gangEnv(a); err != nil {
		log.Error("the rank's recorded rendezvous; following it on as a run on one node", "err", err)
	}
	if j := e.Job; j != nil && len(j.LinkReport) > 0 && l.FollowLink != nil {
		// Its job's link step may not have had its result yet, or
		// had it after the earlier agent stopped reading.
		if a.linkStep, err = l.FollowLink(a, j.LinkReport, j.LinkSignature); err != nil {
			log.Error("the rank's recorded run report; its link is not amended", "err", err)
		}
	}
	r.workRoot = filepath.Join(l.StateDir, "runs")
	if l.WorkRoot != "" {
		r.workRoot = l.WorkRoot
	}
	r.workDir = filepath.Join(r.workRoot, a.AllocID)
	release, reclaimErr := r.reclaimUser()
	if reclaimErr != nil {
		// Its later attempts would run as the agent's account, or as
		// a uid another run holds: the attempt followed on is its last.
		log.Error("taking the run's uid back; the run is not restarted", "err", reclaimErr)
		r.runAs, a.MaxRestarts = nil, 0
	}
	defer release()
	log.Info("following a run on that an earlier agent process started", "attempt", mark.Attempt, "stdout_offset", mark.Stdout, "stderr_offset", mark.Stderr, "metrics_offset", mark.Metrics)
	r.state.Store(StateRunning)
	up.Sink, r.untrack = l.Metrics.Track(sp, func() string { return string(r.state.Load().(AllocState)) }, up.Sink)
	defer r.untrack()
	res, err := r.execute(ctx)
	r.settle(ctx, res, err)
	if l.RunAsRange != nil {
		disputeUnclaimed(&r.final, reclaimErr)
	}
	if r.stale.Load() {
		return r.final, true
	}
	r.final.LastSeq = max(r.final.LastSeq, sp.Stats().LastSeq)
	return r.final, false
}

// reclaimUser takes the uid back that the run's job runs as (--run-as,
// or with --run-as-range the owner of its work dir, which the executor
// handed to it and which the job cannot give away), so that its later
// attempts run as it too, and the uid is not handed to another run until
// this one ended.
func (r *run) reclaimUser() (release func(), err error) {
	r.runAs = r.l.RunAs
	if r.l.RunAsRange == nil {
		return func() {}, nil
	}
	fi, err := os.Lstat(r.workDir)
	if err != nil {
		return func() {}, fmt.Errorf("finding the uid of the run's work dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return func() {}, fmt.Errorf("the run's work dir %s is not a directory", r.workDir)
	}
	if r.runAs, err = r.l.RunAsRange.ClaimShared(r.uidKey(), st.Uid); err != nil {
		return func() {}, err
	}
	return func() {
		if err := r.l.RunAsRange.Release(r.runAs); err != nil {
			r.log.Error("giving the run's uid back", "err", err)
		}
	}, nil
}

// disputeUnclaimed fails a run that would have succeeded when its uid
// could not be taken back after the agent restarted (err): another run
// may hold that uid now, and a job of it could have written the files
// the attempt was read from, so they are no proof.
func disputeUnclaimed(final *AllocUpdate, err error) {
	if err == nil || final.State != StateSucceeded {
		return
	}
	final.State, final.ExitCode = StateFailed, -1
	final.Reason = fmt.Sprintf("disputed: the run's uid could not be taken back after the agent restarted (%v): another run may hold it, so what was read from the attempt is not proof", err)
}
