package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/retry"
)

// A run's end reaches the broker in one order: every spooled record
// first, then the final state. A client that sees "succeeded" must find
// the whole log, so while the broker does not hold every record (it is
// restarting, the network is down, the agent itself was killed) the final
// state waits with the spool, on disk. The ledger, StateDir/spool/<alloc>.json
// next to the spool, says which lease the run was under and, once the run
// ended, how; a restarted agent reads every ledger it finds and finishes
// the delivery, so runs it ran before (ended or not) are never left
// half-reported.

// runLedger is one ledger file.
type runLedger struct {
	AllocID        string `json:"alloc_id"`
	FencingToken   uint64 `json:"fencing_token"`
	ResumeAfterSeq uint64 `json:"resume_after_seq,omitempty"`
	// Final is the run's end as the executor saw it; nil while the run
	// goes on (or when the agent died under it).
	Final *AllocUpdate `json:"final,omitempty"`
	// Job is the run as its command started (after runtime-init), kept
	// when the executor's attempts outlive the agent (Slurm's batch
	// jobs): a restarted agent follows the run on from it.
	Job *ledgerJob `json:"job,omitempty"`
}

// ledgerJob is what following a run on needs of its assignment and of
// what runtime-init made of it.
type ledgerJob struct {
	Region       string          `json:"region,omitempty"`
	Command      []string        `json:"command"`
	Spec         json.RawMessage `json:"spec,omitempty"`
	MaxRestarts  int             `json:"max_restarts"`
	Grace        time.Duration   `json:"grace"`
	TimeLimit    time.Duration   `json:"time_limit,omitempty"`
	Python       string          `json:"python,omitempty"`
	CUDAHome     string          `json:"cuda_home,omitempty"`
	LibraryPaths []string        `json:"library_paths,omitempty"`
	BaseEnv      []string        `json:"base_env,omitempty"`
	// Gang and GangRun are a gang's rank (Assignment.Gang): the rank is
	// followed on with the rendezvous it started with, and its one job
	// found again as that rank's.
	Gang    *rendezvous.Gang `json:"gang,omitempty"`
	GangRun string           `json:"gang_run,omitempty"`
	// LinkReport and LinkSignature are a cluster rank's run report as
	// runtime-init signed it, its link not measured yet: a rank followed
	// on signs it again with the figure its job's step measured. It is
	// read back only under this agent's own signature.
	LinkReport    []byte `json:"link_report,omitempty"`
	LinkSignature string `json:"link_signature,omitempty"`
}

func (e runLedger) assignment() *Assignment {
	a := &Assignment{AllocID: e.AllocID, FencingToken: e.FencingToken, ResumeAfterSeq: e.ResumeAfterSeq}
	if j := e.Job; j != nil {
		a.Region, a.Command, a.Spec, a.MaxRestarts, a.Grace, a.TimeLimit = j.Region, j.Command, j.Spec, j.MaxRestarts, j.Grace, j.TimeLimit
		a.Gang, a.GangRun = j.Gang, j.GangRun
	}
	return a
}

func (l *RunLoop) spoolDir(id string) string   { return filepath.Join(l.StateDir, "spool", id) }
func (l *RunLoop) ledgerPath(id string) string { return filepath.Join(l.StateDir, "spool", id+".json") }

func (l *RunLoop) writeLedger(e runLedger) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("recording run %s: %w", e.AllocID, err)
	}
	if err := os.MkdirAll(filepath.Join(l.StateDir, "spool"), 0o700); err != nil {
		return fmt.Errorf("recording run %s: %w", e.AllocID, err)
	}
	if err := fsutil.WriteFileAtomic(l.ledgerPath(e.AllocID), b, 0o600); err != nil {
		return fmt.Errorf("recording run %s: %w", e.AllocID, err)
	}
	return nil
}

// dropRun forgets a run whose end the broker has (or will never take):
// the ledger goes first, so a crash in between leaves only a spool
// without a ledger, which nothing reads.
func (l *RunLoop) dropRun(log *slog.Logger, id string, st spool.Stats) {
	if err := executor.CheckAllocID(id); err != nil {
		// RemoveAll of StateDir/spool/<id> with id ".." or "" would
		// take the identity key or every run's spool with it.
		log.Error("not removing the spool of a run whose id is not a plain name", "err", err)
		return
	}
	if st.Pending > 0 {
		log.Warn("dropping records the broker will not take (the run is no longer this node's)", "records", st.Pending)
	}
	if err := os.Remove(l.ledgerPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("removing run ledger", "err", err)
		return
	}
	if err := os.RemoveAll(l.spoolDir(id)); err != nil {
		log.Warn("removing delivered spool", "err", err)
	}
}

// pruneWorkDirs deletes the work dirs of earlier runs past the newest
// KeepRuns-1 (the starting run, current, takes the last place). Runs whose
// end is still being delivered keep theirs.
func (l *RunLoop) pruneWorkDirs(log *slog.Logger, root, current string) {
	if l.KeepRuns <= 0 {
		return
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("listing old work dirs", "err", err)
		}
		return
	}
	type dir struct {
		name string
		mod  time.Time
	}
	var old []dir
	for _, e := range ents {
		if !e.IsDir() || e.Name() == current || executor.CheckAllocID(e.Name()) != nil || l.isFinishing(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		old = append(old, dir{e.Name(), fi.ModTime()})
	}
	sort.Slice(old, func(i, j int) bool { return old[i].mod.After(old[j].mod) })
	for _, d := range old[min(len(old), l.KeepRuns-1):] {
		if err := os.RemoveAll(filepath.Join(root, d.name)); err != nil {
			log.Warn("deleting an old work dir", "dir", d.name, "err", err)
			continue
		}
		log.Info("deleted the work dir of an earlier run (--keep-runs)", "dir", d.name, "keep", l.KeepRuns)
	}
}

// send is one UpdateAllocation under the run's lease, its spool seq
// shifted past what earlier nodes of the run delivered.
func (l *RunLoop) send(ctx context.Context, a *Assignment, u AllocUpdate) (bool, error) {
	u.AllocID, u.FencingToken = a.AllocID, a.FencingToken
	if u.Slurm == nil && l.Placement != nil {
		u.Slurm = l.Placement(a.AllocID)
	}
	if u.LastSeq > 0 {
		u.LastSeq += a.ResumeAfterSeq
	}
	return l.Source.UpdateAllocation(ctx, u)
}

// edge sends a state edge, which must reach the broker even while it
// restarts: every error but a refused lease is retried, for up to limit
// (until ctx ends when limit <= 0).
func (l *RunLoop) edge(ctx context.Context, log *slog.Logger, a *Assignment, u AllocUpdate, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	bo := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for {
		_, err := l.send(ctx, a, u)
		if err == nil || errors.Is(err, ErrStaleLease) || (limit > 0 && time.Now().After(deadline)) {
			return err
		}
		wait := bo.NextBackOff()
		log.Warn("allocation update failed; retrying", "state", u.State, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// deliver uploads what the spool still holds (up may be nil: nothing
// spooled) and then reports e.Final, each for up to limit (until ctx ends
// when limit <= 0). done means the broker has the run's end, or refused
// the lease for good; either way the run is forgotten here.
func (l *RunLoop) deliver(ctx context.Context, log *slog.Logger, e runLedger, up *uploader.Uploader, limit time.Duration) (done bool, err error) {
	a := e.assignment()
	var st spool.Stats
	if up != nil {
		dctx, cancel := ctx, context.CancelFunc(func() {})
		if limit > 0 {
			dctx, cancel = context.WithTimeout(ctx, limit)
		}
		err := up.Drain(dctx)
		cancel()
		st = up.Spool.Stats()
		switch {
		case errors.Is(err, uploader.ErrRefused):
			log.Warn("the broker refuses the run's records; its end is not reported from here", "err", err)
			l.dropRun(log, e.AllocID, st)
			return true, nil
		case err != nil:
			return false, err
		}
	}
	switch err := l.edge(ctx, log, a, *e.Final, limit); {
	case errors.Is(err, ErrStaleLease):
		log.Warn("the broker refused the final state", "state", e.Final.State, "err", err)
	case err != nil:
		return false, err
	}
	log.Info("run ended", "state", e.Final.State, "reason", e.Final.Reason, "last_seq", e.Final.LastSeq+e.ResumeAfterSeq)
	l.dropRun(log, e.AllocID, spool.Stats{})
	return true, nil
}

// finishLater delivers a run's end in the background until it is done or
// ctx ends (the ledger then waits for the next start).
func (l *RunLoop) finishLater(ctx context.Context, e runLedger) {
	l.finishMu.Lock()
	defer l.finishMu.Unlock()
	if l.finishing == nil {
		l.finishing = map[string]bool{}
	}
	if l.finishing[e.AllocID] || ctx.Err() != nil {
		return
	}
	l.finishing[e.AllocID] = true
	l.finishWG.Add(1)
	go func() {
		defer l.finishWG.Done()
		defer func() {
			l.finishMu.Lock()
			delete(l.finishing, e.AllocID)
			l.finishMu.Unlock()
		}()
		l.finish(ctx, e)
	}()
}

// isFinishing reports whether id's end is being delivered now.
func (l *RunLoop) isFinishing(id string) bool {
	l.finishMu.Lock()
	defer l.finishMu.Unlock()
	return l.finishing[id]
}

// WaitFinished waits for background deliveries started by RunAssignment
// (they end when done or when their context ends).
func (l *RunLoop) WaitFinished() { l.finishWG.Wait() }

func (l *RunLoop) finish(ctx context.Context, e runLedger) {
	log := l.log().With("alloc", e.AllocID)
	sp, err := spool.Open(l.spoolDir(e.AllocID), spool.Options{})
	var up *uploader.Uploader
	if err != nil {
		// Records that cannot be read cannot be sent; the broker still
		// learns how the run ended.
		log.Error("opening the run's spool; reporting its end without the records it holds", "err", err)
	} else {
		defer sp.Close()
		up = &uploader.Uploader{AllocID: e.AllocID, Spool: sp, Sink: l.Source.Sink(e.assignment()), Log: log}
	}
	if e.Final == nil && sp != nil && e.Job != nil && l.Executor != nil && l.Executor.Marks {
		// The run's attempt outlived the agent (a batch job): follow it
		// on from where the spool's records end.
		mark, ok, err := executor.ReadMark(sp.Mark())
		switch {
		case err != nil:
			log.Error("cannot follow the run on", "err", err)
		case ok:
			final, stale := l.follow(ctx, log, e, sp, up, mark)
			if stale {
				l.dropRun(log, e.AllocID, sp.Stats())
				return
			}
			e.Final = &final
			if err := l.writeLedger(e); err != nil {
				log.Warn("recording the run's end", "err", err)
			}
		}
	}
	if e.Final == nil {
		// The agent died under the run (Pdeathsig took the command
		// down with it): what the spool holds is all there is.
		f := AllocUpdate{State: StateFailed, Reason: "agent restarted during the run: the command was stopped with it", ExitCode: -1}
		if l.Orphaned != nil {
			// A scheduler's job outlives the agent: stop it too.
			f.Reason = l.Orphaned(ctx, e.AllocID)
		}
		if sp != nil {
			f.LastSeq = sp.Stats().LastSeq
		}
		e.Final = &f
		if err := l.writeLedger(e); err != nil {
			log.Warn("recording the run's end", "err", err)
		}
	}
	log.Info("delivering the end of a run taken before", "state", e.Final.State, "pending", pending(sp))
	if done, err := l.deliver(ctx, log, e, up, 0); !done {
		log.Info("the run's end is still not delivered; the next start retries", "err", err)
	}
}

func pending(sp *spool.Spool) uint64 {
	if sp == nil {
		return 0
	}
	return sp.Stats().Pending
}

// resumeRuns starts delivering every run a ledger names.
func (l *RunLoop) resumeRuns(ctx context.Context) {
	names, err := filepath.Glob(filepath.Join(l.StateDir, "spool", "alloc-*.json"))
	if err != nil {
		l.log().Warn("listing run ledgers", "err", err)
		return
	}
	sort.Strings(names)
	for _, path := range names {
		b, err := os.ReadFile(path)
		var e runLedger
		if err == nil {
			err = json.Unmarshal(b, &e)
		}
		if err == nil && e.AllocID != strings.TrimSuffix(filepath.Base(path), ".json") {
			err = fmt.Errorf("names run %q", e.AllocID)
		}
		if err == nil {
			err = executor.CheckAllocID(e.AllocID)
		}
		if err != nil {
			l.log().Error("skipping unreadable run ledger; move it away to silence this", "path", path, "err", err)
			continue
		}
		l.finishLater(ctx, e)
	}
}
