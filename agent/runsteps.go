package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/spec"
)

// run is one assignment on its way through RunAssignment's steps; each
// step is a method that reads what the steps before it left here.
type run struct {
	l     *RunLoop
	a     *Assignment
	log   *slog.Logger
	final AllocUpdate
	// rendezvous is the job's rendezvous environment (NAME=value) when
	// it is a rank of a gang.
	rendezvous []string
	// ledgerWritten waits for the start ledger (written beside
	// runtime-init, see start); every later ledger write waits for it.
	ledgerWritten func() error

	spec       *spec.Spec
	runAs      *executor.RunAs
	workRoot   string
	workDir    string
	resumeFrom string
	spool      *spool.Spool
	up         *uploader.Uploader
	// untrack ends the run's export at /metrics (agentmetrics).
	untrack func()

	// state is what the watcher reports: starting through runtime-init
	// (which keeps the broker's start timeout from firing), running once
	// the lease check passed. stateMu orders the watcher's polls and the
	// lease edge, so a starting poll never follows running.
	state   atomic.Value
	stateMu sync.Mutex
	// stale: the broker refused this node's lease during the run.
	stale atomic.Bool

	// attempt is the executor's attempt under way (0 before the first),
	// sent with every update.
	attempt atomic.Int32

	// reattach and prepared are set for a run followed on after the
	// agent restarted (runfollow.go): where its records end, and the job
	// as its command started.
	reattach *executor.Mark
	prepared *ledgerJob
}

// start reports the starting edge; from then on the run is this node's
// to finish, and the ledger lets a restarted agent upload what is left
// of its spool and report it. The ledger's two fsyncs run beside
// runtime-init rather than before the command (they cost tens of ms on a
// busy disk); a crash before they finish is a crash before the run had
// anything to send, which the broker's start timeout covers.
func (r *run) start(ctx context.Context) error {
	if err := r.l.edge(ctx, r.log, r.a, AllocUpdate{State: StateStarting}, time.Minute); err != nil {
		return err
	}
	startLedger := make(chan error, 1)
	go func() {
		startLedger <- r.l.writeLedger(runLedger{AllocID: r.a.AllocID, FencingToken: r.a.FencingToken, ResumeAfterSeq: r.a.ResumeAfterSeq})
	}()
	r.ledgerWritten = sync.OnceValue(func() error { return <-startLedger })
	return nil
}

// failBeforeStart ends a run whose command never started: the failure is
// delivered now, or kept in the ledger and retried in the background.
func (r *run) failBeforeStart(ctx context.Context, reason string) AllocUpdate {
	_ = r.ledgerWritten()
	r.final.State, r.final.Reason, r.final.ExitCode = StateFailed, reason, -1
	r.log.Error("run failed before start", "reason", reason)
	limit := r.l.drainTimeout()
	if ctx.Err() != nil {
		limit = 5 * time.Second
	}
	e := runLedger{AllocID: r.a.AllocID, FencingToken: r.a.FencingToken, ResumeAfterSeq: r.a.ResumeAfterSeq, Final: &r.final}
	if done, err := r.l.deliver(context.WithoutCancel(ctx), r.log, e, nil, limit); !done {
		r.log.Warn("reporting failure; retrying in the background", "err", err)
		if err := r.l.writeLedger(e); err != nil {
			r.log.Warn("recording the run's end", "err", err)
		}
		r.l.finishLater(ctx, e)
	}
	return r.final
}

// acquireUser picks the user the run's processes run as: --run-as, or a
// uid of its own from --run-as-range, given back by release. The ranks of
// a gang that this agent runs share one (uidKey).
func (r *run) acquireUser() (release func(), err error) {
	r.runAs = r.l.RunAs
	if r.l.RunAsRange == nil {
		return func() {}, nil
	}
	if r.runAs, err = r.l.RunAsRange.AcquireShared(r.uidKey()); err != nil {
		return nil, err
	}
	// The executor killed every process of the uid before it returned
	// (of a shared uid, the last rank's Release does); one it could not
	// kill spoils the uid for good.
	return func() {
		if err := r.l.RunAsRange.Release(r.runAs); err != nil {
			r.log.Error("giving the run's uid back", "err", err)
		}
	}, nil
}

// uidKey is what the run shares its uid of the range under: a gang's run
// (rank 0's allocation) for each of its ranks, where the agent stands
// for several nodes and runs a gang as one cluster job submitted as one
// uid, every rank's task as it, in every rank's work dir (GangsShareUID:
// Slurm). They are one run to the uid's isolation: nothing of another
// run shares it. "" (no sharing) for any other run.
func (r *run) uidKey() string {
	if !r.l.GangsShareUID || r.a.Gang == nil || r.a.Gang.Nodes < 2 || r.a.GangRun == "" {
		return ""
	}
	return "gang/" + r.a.GangRun
}

// prepareWorkdir makes the run's work dir afresh, unpacks the job's files
// into it and places the checkpoint it resumes from.
func (r *run) prepareWorkdir() error {
	r.workRoot = filepath.Join(r.l.StateDir, "runs")
	if r.l.WorkRoot != "" {
		r.workRoot = r.l.WorkRoot
	}
	r.workDir = filepath.Join(r.workRoot, r.a.AllocID)
	// A work dir already there is an earlier placement of this run on
	// this node: the run starts afresh (from the broker's checkpoint),
	// not on what that attempt left, symlinks included.
	if err := os.RemoveAll(r.workDir); err != nil {
		return fmt.Errorf("clearing the work dir of an earlier placement: %v", err)
	}
	r.l.pruneWorkDirs(r.log, r.workRoot, r.a.AllocID)
	if err := os.MkdirAll(r.workDir, 0o755); err != nil {
		return fmt.Errorf("creating work dir: %v", err)
	}
	if len(r.a.Workdir) > 0 {
		if err := unpackWorkdir(r.a.Workdir, r.workDir, r.l.WorkdirLimits); err != nil {
			return err
		}
	}
	if r.a.ResumeCheckpointName != "" {
		var err error
		if r.resumeFrom, err = placeCheckpoint(r.workDir, r.a.ResumeCheckpointName, r.a.ResumeCheckpoint); err != nil {
			return err
		}
	}
	return nil
}

// openSpool opens the run's spool, which its uploader sends to the work
// source. closeSpool closes it unless finish handed it to the background.
func (r *run) openSpool() error {
	sp, err := spool.Open(filepath.Join(r.l.StateDir, "spool", r.a.AllocID), spool.Options{})
	if err != nil {
		return fmt.Errorf("opening spool: %v", err)
	}
	r.spool = sp
	r.up = &uploader.Uploader{AllocID: r.a.AllocID, Spool: sp, Sink: r.l.Source.Sink(r.a), Log: r.log}
	// /metrics reads the run's state as the watcher reports it, and what
	// its spool holds that the broker has not acknowledged.
	r.state.Store(StateStarting)
	r.up.Sink, r.untrack = r.l.Metrics.Track(sp, func() string { return string(r.state.Load().(AllocState)) }, r.up.Sink)
	return nil
}

func (r *run) closeSpool() {
	if r.untrack != nil {
		r.untrack()
	}
	if r.spool != nil {
		r.spool.Close()
	}
}

// execute runs the command through the executor (runtime-init, the
// command, its restarts) while the uploader follows the spool and the
// watcher follows the lease; it returns when all three are done.
func (r *run) execute(ctx context.Context) (executor.Result, error) {
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	upCtx, stopUp := context.WithCancel(context.WithoutCancel(ctx))
	upDone := make(chan error, 1)
	go func() { upDone <- r.up.Run(upCtx) }()

	if r.reattach == nil {
		// A run followed on is running at the broker already.
		r.state.Store(StateStarting)
	}
	x := r.executor()
	var ship *ckptShipper // nil: the run's checkpoints stay here
	if !r.a.KeepCheckpoints {
		ship = &ckptShipper{dir: filepath.Join(r.workDir, "checkpoints"), app: r.up, log: r.log, settle: 500 * time.Millisecond, runAs: r.runAs}
		if r.resumeFrom != "" {
			ship.skip(r.resumeFrom)
		}
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		r.watch(runCtx, stopRun, ship)
	}()

	job := executor.Job{
		AllocID: r.a.AllocID, Region: r.a.Region, Command: r.a.Command, Spec: r.spec, WorkRoot: r.workRoot,
		Python: r.l.Python, MaxRestarts: r.a.MaxRestarts, Grace: r.a.Grace, TimeLimit: r.a.TimeLimit, ResumeFrom: r.resumeFrom, RunAs: r.runAs,
		OnAttempt:  func(n int) { r.attempt.Store(int32(n)) },
		Rendezvous: r.rendezvous,
		// Set by runtime-init on a cluster's gang rank.
		Link: func() *executor.LinkStep { return r.a.linkStep },
	}
	if r.l.CUDAHome != nil {
		job.CUDAHome = r.l.CUDAHome()
	}
	if p := r.prepared; p != nil && r.reattach != nil {
		job.Python, job.CUDAHome, job.LibraryPaths, job.BaseEnv = p.Python, p.CUDAHome, p.LibraryPaths, p.BaseEnv
		job.Reattach = r.reattach
	}
	res, err := x.Execute(runCtx, job, r.up)
	stopRun(nil)
	<-watchDone
	if ship != nil && err == nil && res.State == executor.Succeeded {
		// The job has exited: what it wrote last is final, settled or
		// not, and is the model of the run (gpupass model push pushes the
		// newest shipped checkpoint). The watcher ticks only while the
		// run runs, so a checkpoint written in its last second would
		// otherwise stay here.
		ship.tick(time.Now().Add(ship.settle))
	} else if ship != nil && err == nil && r.a.Gang != nil {
		// A gang's attempt that ended otherwise restarts from the
		// newest checkpoint the broker holds: one the watcher had not
		// sent yet goes now, if it has settled (a file written as the
		// process was killed may be cut short).
		ship.tick(time.Now())
	}
	// The background uploader stops first: two loops uploading from one
	// spool race on the broker's gap-free mark (one sees a lower
	// held_through than the other already acknowledged and gives up),
	// which ended runs "succeeded" with records still in the spool. The
	// final drain alone finishes.
	stopUp()
	<-upDone
	return res, err
}

// executor is the loop's executor with this run's runtime-init checks:
// the node's own, then the bundle install, the conformance check against
// the run's spec, and last the lease edge that marks the run running.
func (r *run) executor() *executor.Executor {
	x := *r.l.Executor
	x.Checks = append([]executor.RuntimeCheck(nil), r.l.Executor.Checks...)
	// The bundle goes in before the conformance check: that check and the
	// run's signed report measure packages in the run's own Python, which
	// is the bundle's venv once it is installed.
	if c := r.l.Bundles.Check(r.spec); c != nil {
		x.Checks = append(x.Checks, *c)
	}
	x.Checks = append(x.Checks, r.l.checks(r.a, r.spec)...)
	// Runtime-init (a bundle pull and install) can take minutes; the
	// broker must not count the run as launched before its command. The
	// last check marks the run running: every check before the command
	// passed, so the next thing that happens is the command.
	x.Checks = append(x.Checks, executor.RuntimeCheck{Name: "lease", Run: r.leaseCheck})
	return &x
}

func (r *run) leaseCheck(ctx context.Context, job executor.Job) (string, error) {
	if r.l.Executor.Marks {
		// The attempt will outlive this process: the ledger keeps the
		// job as runtime-init left it, for a restarted agent to follow
		// it on (runfollow.go).
		if err := r.recordJob(job); err != nil {
			return "", err
		}
	}
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	// The lease check is the last before attempt 1 starts.
	if err := r.l.edge(ctx, r.log, r.a, AllocUpdate{State: StateRunning, Attempts: 1}, time.Minute); err != nil {
		return "", err
	}
	r.state.Store(StateRunning)
	// Not the token itself: the run's log is read by read tokens.
	return "running under this node's lease", nil
}

func (r *run) recordJob(job executor.Job) error {
	if err := r.ledgerWritten(); err != nil {
		return err
	}
	lj := &ledgerJob{Region: r.a.Region, Command: job.Command, MaxRestarts: job.MaxRestarts, Grace: job.Grace, TimeLimit: job.TimeLimit,
		Python: job.Python, CUDAHome: job.CUDAHome, LibraryPaths: job.LibraryPaths, BaseEnv: job.BaseEnv, Gang: r.a.Gang, GangRun: r.a.GangRun}
	if sr := r.a.linkReport; sr != nil {
		lj.LinkReport, lj.LinkSignature = sr.Bytes, sr.Signature
	}
	if job.Spec != nil {
		b, err := json.Marshal(job.Spec)
		if err != nil {
			return fmt.Errorf("recording the run's spec: %w", err)
		}
		lj.Spec = b
	}
	return r.l.writeLedger(runLedger{AllocID: r.a.AllocID, FencingToken: r.a.FencingToken, ResumeAfterSeq: r.a.ResumeAfterSeq, Job: lj})
}

// watch asks the broker every UpdateEvery whether the run goes on, and
// ships new checkpoints while it runs. A refused lease or a cancel stops
// the run (stop's cause says which); a broker away does not: records
// wait in the spool.
func (r *run) watch(ctx context.Context, stop context.CancelCauseFunc, ship *ckptShipper) {
	every := r.l.UpdateEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.state.Load() == StateRunning && ship != nil {
			ship.tick(time.Now())
		}
		r.stateMu.Lock()
		cancel, err := r.l.send(ctx, r.a, AllocUpdate{State: r.state.Load().(AllocState), Attempts: int(r.attempt.Load())})
		r.stateMu.Unlock()
		switch {
		case errors.Is(err, ErrStaleLease):
			r.stale.Store(true)
			r.log.Warn("lease lost: stopping the run", "err", err)
			stop(ErrStaleLease)
			return
		case err != nil:
			r.log.Debug("allocation update", "err", err)
		case cancel:
			r.log.Info("cancel requested")
			stop(errors.New("cancelled by the broker"))
			return
		}
	}
}

// settle turns the executor's outcome into the run's final update.
func (r *run) settle(ctx context.Context, res executor.Result, err error) {
	if err != nil {
		r.final.State, r.final.Reason, r.final.ExitCode = StateFailed, err.Error(), -1
		r.log.Error("run failed before start", "reason", r.final.Reason)
	} else {
		r.final.State, r.final.Reason, r.final.ExitCode = AllocState(res.State), res.Reason, res.ExitCode
		r.final.Attempts, r.final.Restarts, r.final.LastSeq = res.Attempts, res.Restarts, res.LastSeq
		if res.State == executor.Failed {
			r.final.NodeFault = res.NodeFault
		}
	}
	if ctx.Err() != nil && r.final.State == StateCancelled {
		// The agent itself is stopping, nobody cancelled the run.
		r.final.State, r.final.Reason = StateFailed, "agent stopped during the run"
	}
}

// finish reports the run's end once the broker holds every record, so a
// client that sees "succeeded" also sees the whole log; what it cannot
// deliver now waits in the ledger and the spool, retried in the
// background. A run whose lease was lost is dropped: it is another's.
func (r *run) finish(ctx context.Context) AllocUpdate {
	if r.stale.Load() {
		_ = r.ledgerWritten()
		r.final.Reason = ErrStaleLease.Error()
		r.l.dropRun(r.log, r.a.AllocID, r.spool.Stats())
		return r.final
	}
	r.final.LastSeq = max(r.final.LastSeq, r.spool.Stats().LastSeq)
	if err := r.ledgerWritten(); err != nil {
		r.log.Warn("recording the run's start", "err", err)
	}
	e := runLedger{AllocID: r.a.AllocID, FencingToken: r.a.FencingToken, ResumeAfterSeq: r.a.ResumeAfterSeq, Final: &r.final}
	if err := r.l.writeLedger(e); err != nil {
		// The run's end is still delivered now; only a restart before
		// that would report it as interrupted.
		r.log.Warn("recording the run's end", "err", err)
	}
	drain := r.l.drainTimeout()
	if ctx.Err() != nil {
		// The agent is stopping: what the broker does not take now stays
		// in the spool, and the next start finishes it.
		drain = min(drain, 5*time.Second)
	}
	done, err := r.l.deliver(context.WithoutCancel(ctx), r.log, e, r.up, drain)
	if done {
		return r.final
	}
	r.log.Warn("the broker does not hold every record yet: the final state waits with the spool and is retried in the background", "state", r.final.State, "err", err)
	r.spool.Close()
	r.spool = nil
	r.l.finishLater(ctx, e)
	return r.final
}
