// Package executor runs a job on the node: runtime init (declared packages
// checked in the run's Python), a per-run work dir, the verified
// environment, the command through a Runner (a process group here), every
// output line as a structured event, metric points from
// $GPUPASS_METRICS_FILE and `gpupass:metric` lines, and the NaN guard
// that restarts the job from its newest checkpoint. Everything goes to the
// run's spool first; uploading it is the agent's uploader's business.
//
// It never imports the broker.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// DefaultMaxRestarts is the NaN guard's default limit (--max-restarts).
const DefaultMaxRestarts = 3

// Appender is where records go: the run's *spool.Spool.
type Appender interface {
	Append(recs ...spool.Record) (first, last uint64, err error)
}

// MeasuredPython is one measurement of an interpreter: which one (as
// Job.Python named it) and what it reported, for at least the spec's
// pinned packages.
type MeasuredPython struct {
	Exe     string
	Section probe.PythonSection
}

// Job is one run to execute.
type Job struct {
	AllocID string
	Region  string
	Command []string
	// Spec is the run's environment spec; nil runs with no runtime
	// checks and no allocator setting.
	Spec *spec.Spec
	// WorkRoot holds the per-run work dirs (WorkRoot/AllocID).
	WorkRoot string
	// Python is the run's interpreter for the package check (default
	// python3 on PATH).
	Python string
	// Measured is the run's Python as a runtime-init check already
	// measured it. The package check reads it instead of starting the
	// interpreter (and importing torch, ~2 s) a second time.
	Measured *MeasuredPython
	// CUDAHome is exported as CUDA_HOME; its lib64 leads LD_LIBRARY_PATH.
	CUDAHome string
	// LibraryPaths follow CUDA_HOME/lib64 at the front of LD_LIBRARY_PATH.
	LibraryPaths []string
	// MaxRestarts bounds NaN restarts (the CLI's default is
	// DefaultMaxRestarts; 0 means none).
	MaxRestarts int
	// Grace is the SIGTERM-to-SIGKILL period (default DefaultGrace).
	Grace time.Duration
	// TimeLimit is the run's wall-clock limit (the spec's
	// resources.time-limit, or train --time-limit); 0 means none, and
	// then an executor's own default applies (--slurm-time-limit,
	// --kube-time-limit). A run past it ends failed with reason TIMEOUT.
	// Each executor enforces it its own way: the local one stops the
	// process (SIGTERM, Grace, SIGKILL), Slurm gets sbatch --time and
	// Kubernetes the Job's activeDeadlineSeconds.
	TimeLimit time.Duration
	// BaseEnv is the environment the job's own variables are added to
	// (default os.Environ()). Whatever it holds passes through
	// JobEnviron first: the agent's own configuration never reaches the
	// job.
	BaseEnv []string
	// ResumeFrom is a checkpoint the first attempt starts from (a run
	// resumed on this node after its node was lost).
	ResumeFrom string
	// Reattach, when set, is where an earlier agent process left the run
	// (the mark its spool holds): its attempt outlived that process (a
	// batch job), so runtime-init is not done again and the attempt is
	// followed on from the mark's offsets instead of started. Only for
	// an Executor with Marks.
	Reattach *Mark
	// RunAs, when set, is the user the command runs as; the work dir is
	// handed to it before the command starts. Runtime-init (the bundle's
	// venv, the package check) still runs as the agent, so the job cannot
	// change the environment that was measured, and starts none of its
	// code (agent/bundleinstall.go).
	RunAs *RunAs
	// Rendezvous is the environment (NAME=value) of a rank of a run
	// across several nodes (internal/rendezvous: MASTER_ADDR, RANK, …),
	// set over whatever the base holds; nil for a run on one node.
	Rendezvous []string
	// OnAttempt, when set, hears the number of each attempt as it starts
	// (or is followed on after an agent restart): the agent reports the
	// attempt under way, not 0 until the run ends.
	OnAttempt func(attempt int)
	// Link, when set, gives the link step of a gang's rank as the first
	// attempt starts (after runtime-init, which signs the report the
	// step's figure amends), and as attempt 1 is followed on after an
	// agent restart (the job has the step already; the runner only reads
	// its result); nil from it, or a later attempt, runs none.
	Link func() *LinkStep
}

// metricPattern is the spec's metrics.pattern, nil when it has none.
func (j Job) metricPattern() (*metrics.Pattern, error) {
	if j.Spec == nil || j.Spec.Metrics.Pattern == "" {
		return nil, nil
	}
	return metrics.CompilePattern(j.Spec.Metrics.Pattern)
}

// gpus is how many accelerators the run's spec asks for on this node
// (resources.count, which a spec file that leaves it out has as 1; a
// rank of a run across resources.nodes nodes its share of it); 0 when
// the run has no spec.
func (j Job) gpus() int {
	if j.Spec == nil {
		return 0
	}
	if n := j.Spec.Resources.Nodes; n > 1 {
		return j.Spec.Resources.Count / n
	}
	return j.Spec.Resources.Count
}

// Executor runs jobs.
type Executor struct {
	Runner Runner
	// Log is for the agent's own diagnostics (default: discard).
	Log *slog.Logger
	// MaxLine bounds an output line (default DefaultMaxLine).
	MaxLine int
	// Output bounds what a run's output lines add to its log (rate and
	// total; zero: no limit).
	Output OutputLimits
	// MetricsPoll is how often the metrics file is read while the job
	// runs (default 100ms).
	MetricsPoll time.Duration
	// Checks run in runtime-init before the package check and the
	// command, in order; the agent adds the conformance re-check and the
	// refusal of GPUs held by foreign processes here.
	Checks []RuntimeCheck
	// Host holds each run's processes on this node (its cgroup, its own
	// uid, its own /tmp: agent/executor/local's Host), so that nothing a
	// run started outlives it. Required: an Executor without one refuses
	// to run (a forgotten Host must not mean runs without those checks).
	Host RunHost
	// Marks stores with the run's records where they reach into the
	// files the attempt writes (Mark, with a MarkedAppender), for a
	// Runner whose attempts outlive the agent and whose lines carry their
	// file offsets (Slurm's batch jobs): a restarted agent follows them
	// on (Job.Reattach).
	Marks bool
}

// RuntimeCheck is one runtime-init check. Run returns a short detail for
// the log, or an error that fails the run before the command starts.
type RuntimeCheck struct {
	Name string
	Run  func(ctx context.Context, job Job) (detail string, err error)
	// Prepare, when set, runs instead of Run. It may change the job
	// before the command starts (the wheel-bundle install points Python,
	// PATH and the command at the environment it built, and the package
	// check then looks there) and records its own events through emit.
	Prepare func(ctx context.Context, job *Job, emit Emit) (detail string, err error)
}

// Emit records one event of the run.
type Emit func(level events.Level, component, msg string, fields map[string]string)

// State is the terminal state of a run.
type State string

// Terminal states.
const (
	Succeeded State = "succeeded"
	Failed    State = "failed"
	Cancelled State = "cancelled"
)

// Result is how a run ended. Reason is never empty.
type Result struct {
	State    State  `json:"state"`
	Reason   string `json:"reason"`
	ExitCode int    `json:"exit_code"`
	Attempts int    `json:"attempts"`
	Restarts int    `json:"restarts"`
	WorkDir  string `json:"work_dir"`
	// LastSeq is the seq of the run's last spooled record.
	LastSeq uint64 `json:"last_seq"`
	// NodeFault says a failed run failed because of its node: NodeLost
	// (the scheduler lost the node under it) or LaunchFailed.
	NodeFault NodeFault `json:"node_fault,omitempty"`
}

// NodeFault is why a run failed when it was its node's doing.
type NodeFault string

// Node faults.
const (
	NodeLost     NodeFault = "lost"
	LaunchFailed NodeFault = "launch"
)

// Variables the executor sets for the job.
const (
	EnvAllocID       = "GPUPASS_ALLOC_ID"
	EnvRegion        = "GPUPASS_REGION"
	EnvMetricsFile   = "GPUPASS_METRICS_FILE"
	EnvCheckpointDir = "GPUPASS_CHECKPOINT_DIR"
	EnvResumeFrom    = "GPUPASS_RESUME_FROM"
	EnvAttempt       = "GPUPASS_ATTEMPT"
	// EnvGangRun is, in a rank of a run across several nodes, the run
	// (rank 0's allocation id): a runner that starts the gang as one
	// cluster job joins its ranks by it.
	EnvGangRun = "GPUPASS_GANG_RUN"
	// EnvReleaseThreshold carries cuda-malloc-async-release-threshold in
	// bytes. PyTorch's PYTORCH_CUDA_ALLOC_CONF has no key for the pool's
	// release threshold (cudaMemPoolAttrReleaseThreshold), so the job
	// applies it itself if it cares.
	EnvReleaseThreshold = "GPUPASS_CUDA_MALLOC_ASYNC_RELEASE_THRESHOLD"
)

// allocIDPattern is an allocation id as the broker makes them
// (alloc-<hex>), loose enough for readable test ids: one plain path
// element that is never "." or "..", holds no separator, and has no dot
// (StateDir/spool/<id> must not collide with <other id>.json, the ledger
// next to it).
var allocIDPattern = regexp.MustCompile(`^alloc-[A-Za-z0-9_-]{1,64}$`)

// CheckAllocID returns an error unless id is an allocation id that is
// safe to name a file or directory with. The id comes from the broker,
// and the agent joins it to its state dir for the run's work dir, spool
// and ledger: ".." there would make the state dir (identity key included)
// the run's work dir, and removing the run's spool would remove it.
func CheckAllocID(id string) error {
	if !allocIDPattern.MatchString(id) {
		return fmt.Errorf("allocation id %q is not a plain name (want alloc- and up to 64 letters, digits, _ or -)", id)
	}
	return nil
}

// Execute runs the job to a terminal result, writing every event and
// metric point to sp. It returns an error only for what prevents running
// at all (no work dir); everything about the job itself is in the Result
// and the events.
func (x *Executor) Execute(ctx context.Context, job Job, sp Appender) (Result, error) {
	log := x.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckAllocID(job.AllocID); err != nil {
		return Result{}, fmt.Errorf("executing run: %w", err)
	}
	if x.Host == nil {
		return Result{}, fmt.Errorf("executing run %s: %w", job.AllocID, ErrNoHost)
	}
	workDir := filepath.Join(job.WorkRoot, job.AllocID)
	ckptDir := filepath.Join(workDir, "checkpoints")
	metricsPath := filepath.Join(workDir, "metrics.jsonl")
	for _, d := range []string{workDir, ckptDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Result{}, fmt.Errorf("creating work dir of %s: %w", job.AllocID, err)
		}
	}
	f, err := os.OpenFile(metricsPath, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return Result{}, fmt.Errorf("creating metrics file of %s: %w", job.AllocID, err)
	}
	// A run executed again in the same work dir (the agent restarted)
	// must not spool the points of its earlier execution a second time.
	st, err := f.Stat()
	f.Close()
	if err != nil {
		return Result{}, fmt.Errorf("creating metrics file of %s: %w", job.AllocID, err)
	}
	metricsStart := st.Size()
	if job.Reattach != nil {
		if !x.Marks {
			return Result{}, fmt.Errorf("run %s: reattaching needs an executor that marks its records", job.AllocID)
		}
		// Exactly where the spool's points end: the attempt may have
		// written more since.
		metricsStart = job.Reattach.Metrics
	}
	if job.RunAs != nil {
		if err := job.RunAs.handOver(workDir); err != nil {
			return Result{}, fmt.Errorf("run %s: %w", job.AllocID, err)
		}
	}
	tmpDir, err := makeTmpDir(job)
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", job.AllocID, err)
	}
	defer os.RemoveAll(tmpDir)
	contain, err := x.Host.Hold(job, x.Runner, tmpDir)
	if err != nil {
		return Result{}, err
	}
	defer contain.Release()

	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	var mark *Mark
	if x.Marks {
		mark = &Mark{Metrics: metricsStart}
		if job.Reattach != nil {
			mark = job.Reattach
		}
	}
	rec := newMarkedRecorder(sp, mark, func(err error) { stopRun(err) })
	rec.limit = newOutputLimiter(x.Output)
	res := x.execute(runCtx, ctx, job, rec, runDirs{work: workDir, ckpt: ckptDir, metrics: metricsPath, tmp: tmpDir, tmpMode: contain.TmpMode(), privateTmp: contain.PrivateTmp()}, metricsStart, contain)
	res.WorkDir = workDir
	// Each attempt's end killed what it left; this also reaches what
	// ran as the run's uid outside an attempt. The run ends, and the
	// next one starts, only once nothing of it is left.
	if err := contain.Kill(); err != nil {
		res = leftover(res, err)
	} else if err := contain.Sweep(); err != nil {
		rec.event(events.Warn, events.ExecutorComp, err.Error(), nil)
	}
	// Only once its processes are gone: then no file of the tmpfs is
	// open, and unmounting it frees its memory.
	for _, err := range contain.Release() {
		rec.event(events.Warn, events.ExecutorComp, err.Error(), nil)
	}
	if err := os.RemoveAll(tmpDir); err != nil {
		rec.event(events.Warn, events.ExecutorComp, fmt.Sprintf("removing the run's TMPDIR: %v", err), nil)
	}
	if job.RunAs != nil {
		// Every run as --run-as has the same uid: the next one must not
		// read this one's files (the newest --keep-runs stay on disk).
		if err := job.RunAs.takeBack(workDir); err != nil {
			rec.event(events.Warn, events.ExecutorComp, err.Error(), nil)
		}
	}
	lvl := events.Info
	if res.State != Succeeded {
		lvl = events.Error
	}
	rec.event(lvl, events.ExecutorComp, fmt.Sprintf("run %s %s", job.AllocID, events.Outcome(string(res.State), res.Reason)),
		map[string]string{"state": string(res.State), "exit_code": strconv.Itoa(res.ExitCode), "attempts": strconv.Itoa(res.Attempts), "restarts": strconv.Itoa(res.Restarts)})
	last, err := rec.close()
	res.LastSeq = last
	if err != nil {
		log.Error("spooling run records", "alloc", job.AllocID, "err", err)
		if res.State == Succeeded {
			res.State = Failed
		}
		res.Reason = fmt.Sprintf("%s; spool: %v", res.Reason, err)
	}
	return res, nil
}

// runDirs are the paths of one run.
type runDirs struct {
	work, ckpt, metrics, tmp string
	// tmpMode says whether the run has a /tmp of its own (PrivateTmp).
	tmpMode string
	// privateTmp says the run's /tmp is tmp (PrivateTmp).
	privateTmp bool
}

// jobTmp is the run's TMPDIR as the job reaches it: /tmp when that is
// the run's own, a short path. A Unix socket's path must fit in 108
// bytes, and Python's multiprocessing (PyTorch's DataLoader workers hand
// their shared memory over through one) puts them in TMPDIR; below a
// deep state dir they would not fit, and the DataLoader would hang.
func (d runDirs) jobTmp() string {
	if d.privateTmp {
		return "/tmp"
	}
	return d.tmp
}

// leftover fails a run whose processes could not all be killed.
func leftover(res Result, err error) Result {
	res.State, res.ExitCode = Failed, -1
	res.Reason = "processes of the run could not be killed, so the node takes no further run as its uid: " + err.Error()
	return res
}

// makeTmpDir makes the run's private TMPDIR (the job's, 0700), outside
// its work dir so that it goes with the run rather than stay with the
// kept work dirs (--keep-runs). /tmp is shared by every job of the node
// and every user; a file a job leaves there by name is one another job
// can read or plant.
func makeTmpDir(job Job) (string, error) {
	d := filepath.Join(job.WorkRoot, ".tmp-"+job.AllocID)
	if job.Reattach != nil {
		// The attempt that is followed on still uses it.
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", fmt.Errorf("making the run's TMPDIR: %w", err)
		}
		return d, nil
	}
	// An earlier placement's (the agent was killed): not this run's.
	if err := os.RemoveAll(d); err != nil {
		return "", fmt.Errorf("clearing the TMPDIR of an earlier placement: %w", err)
	}
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", fmt.Errorf("making the run's TMPDIR: %w", err)
	}
	if job.RunAs != nil {
		if err := os.Lchown(d, int(job.RunAs.UID), int(job.RunAs.GID)); err != nil {
			return "", fmt.Errorf("handing the run's TMPDIR to %s: %w", job.RunAs, err)
		}
	}
	return d, nil
}

func (x *Executor) execute(ctx, parent context.Context, job Job, rec *recorder, dirs runDirs, metricsStart int64, contain Held) Result {
	workDir := dirs.work
	startFields := map[string]string{"alloc": job.AllocID, "region": job.Region, "command": strings.Join(job.Command, " ")}
	if job.RunAs != nil {
		startFields["user"] = job.RunAs.String()
	}
	if cg := contain.CgroupName(); cg != "" {
		startFields["cgroup"] = cg
	}
	if dirs.tmpMode != "" {
		startFields["private_tmp"] = dirs.tmpMode
	}
	if len(job.Command) == 0 {
		rec.event(events.Info, events.ExecutorComp, fmt.Sprintf("run %s starting in %s", job.AllocID, workDir), startFields)
		return Result{State: Failed, Reason: "runtime-init: the run has no command", ExitCode: -1}
	}
	if job.Reattach != nil {
		return x.attempts(ctx, parent, job, rec, dirs, metricsStart, contain)
	}
	rec.event(events.Info, events.ExecutorComp, fmt.Sprintf("run %s starting in %s", job.AllocID, workDir), startFields)
	for _, c := range x.Checks {
		var detail string
		var err error
		if c.Prepare != nil {
			detail, err = c.Prepare(ctx, &job, rec.event)
		} else {
			detail, err = c.Run(ctx, job)
		}
		if ctx.Err() != nil {
			return cancelled(ctx, parent, 0, 0)
		}
		if err != nil {
			msg := fmt.Sprintf("%s: %v", c.Name, err)
			rec.event(events.Error, events.RuntimeInit, msg, map[string]string{"check": c.Name})
			return Result{State: Failed, Reason: "runtime-init: " + msg, ExitCode: -1}
		}
		rec.event(events.Info, events.RuntimeInit, fmt.Sprintf("%s: %s", c.Name, detail), map[string]string{"check": c.Name})
	}
	if reason := runtimeInit(ctx, job, rec); reason != "" {
		if ctx.Err() != nil {
			return cancelled(ctx, parent, 0, 0)
		}
		return Result{State: Failed, Reason: "runtime-init: " + reason, ExitCode: -1}
	}
	return x.attempts(ctx, parent, job, rec, dirs, metricsStart, contain)
}

// attempts runs the command, and runs it again from the newest checkpoint
// when the NaN guard trips, up to MaxRestarts; a reattached run starts
// with following the attempt it was left in.
func (x *Executor) attempts(ctx, parent context.Context, job Job, rec *recorder, dirs runDirs, metricsStart int64, contain Held) Result {
	workDir, ckptDir, metricsPath := dirs.work, dirs.ckpt, dirs.metrics
	// After the checks: a Prepare may have changed the job's environment.
	env, err := buildEnv(job, dirs)
	if err != nil {
		rec.event(events.Error, events.RuntimeInit, err.Error(), nil)
		return Result{State: Failed, Reason: "runtime-init: " + err.Error(), ExitCode: -1}
	}

	tail := &metricsTail{path: metricsPath, rec: rec, maxLine: 1 << 20, off: metricsStart, runAs: job.RunAs}
	resume := job.ResumeFrom
	if resume != "" {
		why := "the run resumes here after its node was lost"
		if job.Rendezvous != nil {
			why = "the gang restarted: every rank resumes from rank 0's last shipped checkpoint"
		}
		rec.event(events.Info, events.ExecutorComp, "starting from checkpoint "+resume+" ("+why+")",
			map[string]string{"resume_from": resume})
	}
	restarts, first := 0, 1
	// The limit counts from the first attempt's start (runtime-init is
	// not the job's time) and is the run's: every attempt draws on it.
	var deadline time.Time
	if job.TimeLimit > 0 {
		deadline = time.Now().Add(job.TimeLimit)
	}
	var from *Mark
	if m := job.Reattach; m != nil {
		restarts, first, resume, from = m.Restarts, m.Attempt, m.Resume, m
		if m.Deadline != 0 {
			deadline = time.Unix(0, m.Deadline)
		}
		rec.event(events.Info, events.ExecutorComp, fmt.Sprintf("run %s: the agent restarted; following attempt %d on where its records end (stdout byte %d, stderr byte %d, metrics byte %d)",
			job.AllocID, m.Attempt, m.Stdout, m.Stderr, m.Metrics), map[string]string{"attempt": strconv.Itoa(m.Attempt), "reattached": "true"})
	}
	pat, perr := job.metricPattern()
	if perr != nil {
		// The broker validates the spec it is given; this is a spec from
		// elsewhere (an older broker, a hand-made job).
		rec.event(events.Warn, events.MetricsComp, "metrics.pattern: "+perr.Error()+"; reading `loss 1.23`, `loss=1.23`, `loss: 1.23` instead", nil)
	}
	enforcer, selfLimited := x.Runner.(LimitEnforcer)
	selfLimited = selfLimited && enforcer.EnforcesTimeLimit()
	for attempt := first; ; attempt++ {
		if job.OnAttempt != nil {
			job.OnAttempt(attempt)
		}
		var left time.Duration
		if !deadline.IsZero() {
			left = time.Until(deadline)
			if left <= 0 && from == nil {
				// A NaN restart due after the limit: not started.
				return timedOut(job, rec, Exit{Code: -1}, attempt-1, restarts)
			}
		}
		attemptEnv := append(env[:len(env):len(env)], EnvAttempt+"="+strconv.Itoa(attempt))
		if resume != "" {
			attemptEnv = append(attemptEnv, EnvResumeFrom+"="+resume)
		}
		guard := &nanGuard{}
		actx, stopAttempt := context.WithCancelCause(ctx)
		stopAt := func() bool { return true }
		if !deadline.IsZero() && !selfLimited {
			stopAt = time.AfterFunc(left, func() { stopAttempt(errTimeLimit) }).Stop
		}
		text := newTextMetrics(pat, metricsPath, metricsStart)
		check := guard.check(stopAttempt)
		tail.attempt, tail.onMetric = attempt, func(m events.Metric) { text.stop(); check(m) }
		ex := x.runAttempt(actx, job, attemptEnv, workDir, attemptInfo{n: attempt, restarts: restarts, resume: resume, from: from, left: left, deadline: deadline},
			rec, tail, check, text, contain)
		stopAt()
		from = nil
		limited := errors.Is(context.Cause(actx), errTimeLimit)
		stopAttempt(nil)
		if ex.Leftover != nil {
			return leftover(Result{Attempts: attempt, Restarts: restarts}, ex.Leftover)
		}

		if ctx.Err() != nil {
			return cancelled(ctx, parent, attempt, restarts)
		}
		if limited && ex.Stopped {
			// Stopped for the limit, not ended on its own just before.
			return timedOut(job, rec, ex, attempt, restarts)
		}
		if step, val, at, ok := guard.tripped(); ok {
			if restarts >= job.MaxRestarts {
				msg := fmt.Sprintf("non-finite loss %s at step %d; giving up after %d restart(s) (--max-restarts %d)", fmtVal(val), step, restarts, job.MaxRestarts)
				if job.Rendezvous != nil {
					// A rank of a gang is not restarted alone: the
					// broker restarts the whole gang while restarts
					// remain.
					msg = fmt.Sprintf("non-finite loss %s at step %d: stopped this rank; the whole gang restarts from its last checkpoint if the run has restarts left (--max-restarts)", fmtVal(val), step)
				}
				rec.event(events.Error, events.NaNGuard, msg, map[string]string{"step": strconv.FormatInt(step, 10), "attempt": strconv.Itoa(attempt)})
				return Result{State: Failed, Reason: msg, ExitCode: ex.Code, Attempts: attempt, Restarts: restarts}
			}
			restarts++
			ckpt, cerr := newestCheckpoint(ckptDir, at)
			fields := map[string]string{"step": strconv.FormatInt(step, 10), "attempt": strconv.Itoa(attempt + 1), "restart": strconv.Itoa(restarts)}
			from := "from the start (no checkpoint in " + ckptDir + ")"
			if cerr != nil {
				from = fmt.Sprintf("from the start (reading %s: %v)", ckptDir, cerr)
			} else if ckpt != "" {
				from = "from " + ckpt
				fields["resume_from"] = ckpt
			}
			rec.event(events.Error, events.NaNGuard, fmt.Sprintf("non-finite loss %s at step %d: stopped the process; restart %d of %d %s",
				fmtVal(val), step, restarts, job.MaxRestarts, from), fields)
			resume = ckpt
			continue
		}
		return finished(ex, attempt, restarts)
	}
}

// errTimeLimit is the cause an attempt is stopped with at the run's
// deadline.
var errTimeLimit = errors.New("the run's time limit was reached")

// timedOut ends a run at its time limit: failed, with a reason that
// starts TIMEOUT as Slurm's does.
func timedOut(job Job, rec *recorder, ex Exit, attempts, restarts int) Result {
	limit := spec.FormatTimeLimit(job.TimeLimit)
	reason := "TIMEOUT: time limit " + limit + " reached"
	msg := reason + fmt.Sprintf(" after %d attempt(s), the limit is the run's, NaN restarts share it", attempts)
	if ex.Stopped {
		msg += fmt.Sprintf("; stopped attempt %d (SIGTERM to the process group%s)", attempts, map[bool]string{true: ", SIGKILL after the grace period", false: ""}[ex.Killed])
	}
	rec.event(events.Error, events.ExecutorComp, msg, map[string]string{"time_limit": limit, "attempt": strconv.Itoa(attempts)})
	return Result{State: Failed, Reason: reason, ExitCode: ex.Code, Attempts: attempts, Restarts: restarts}
}

func cancelled(ctx, parent context.Context, attempts, restarts int) Result {
	reason := "cancelled"
	if parent.Err() == nil {
		// The run context was stopped from inside (the spool failed).
		reason = context.Cause(ctx).Error()
		return Result{State: Failed, Reason: reason, ExitCode: -1, Attempts: attempts, Restarts: restarts}
	}
	if c := context.Cause(parent); c != nil && !errors.Is(c, context.Canceled) {
		// "cancelled by the broker" says it already.
		reason = events.Outcome(reason, c.Error())
	}
	return Result{State: Cancelled, Reason: reason, ExitCode: -1, Attempts: attempts, Restarts: restarts}
}

func finished(ex Exit, attempts, restarts int) Result {
	r := Result{ExitCode: ex.Code, Attempts: attempts, Restarts: restarts}
	switch {
	case ex.NodeLost:
		r.NodeFault = NodeLost
	case ex.LaunchFailed:
		r.NodeFault = LaunchFailed
	}
	switch {
	case ex.StartErr != nil:
		r.State, r.Reason = Failed, "starting the command: "+ex.StartErr.Error()
	case ex.Reason != "" && (ex.Code != 0 || ex.Signal != ""):
		r.State, r.Reason = Failed, ex.Reason
	case ex.Signal != "":
		r.State, r.Reason = Failed, "killed by signal "+ex.Signal
	case ex.Code != 0:
		r.State, r.Reason = Failed, "exited with status "+strconv.Itoa(ex.Code)
	default:
		r.State, r.Reason = Succeeded, "exited with status 0"
	}
	return r
}

func fmtVal(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "Infinity"
	case math.IsInf(v, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// attemptInfo is where an attempt stands in its run.
type attemptInfo struct {
	n, restarts int
	resume      string
	// from is set when the attempt is followed on after an agent restart.
	from *Mark
	// left is what is left of the run's time limit (0: none), reached
	// at deadline.
	left     time.Duration
	deadline time.Time
}

// runAttempt runs one process and tails its metrics file meanwhile.
func (x *Executor) runAttempt(ctx context.Context, job Job, env []string, workDir string, at attemptInfo, rec *recorder, tail *metricsTail, onMetric func(events.Metric), text *textMetrics, contain Held) Exit {
	attempt, from := at.n, at.from
	poll := x.MetricsPoll
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	if from == nil {
		fields := map[string]string{"attempt": strconv.Itoa(attempt)}
		m := Mark{Attempt: attempt, Restarts: at.restarts, Resume: at.resume}
		if !at.deadline.IsZero() {
			m.Deadline = at.deadline.UnixNano()
			fields["time_left"] = at.left.Round(time.Second).String()
		}
		rec.attemptStarts(events.Event{Time: events.Now(), Level: events.Info, Component: events.ExecutorComp,
			Message: fmt.Sprintf("attempt %d: starting %s", attempt, strings.Join(job.Command, " ")), Fields: fields}, m)
	}
	tailDone := make(chan struct{})
	tailStop := make(chan struct{})
	go func() {
		defer close(tailDone)
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-tailStop:
				return
			case <-t.C:
				tail.read()
			}
		}
	}()
	classifiers := [2]*events.Classifier{{Stream: events.Stdout}, {Stream: events.Stderr}}
	var fromOffsets *Offsets
	if from != nil {
		fromOffsets = &Offsets{Stdout: from.Stdout, Stderr: from.Stderr}
	}
	var link *LinkStep
	if job.Link != nil && attempt == 1 {
		// Followed on after an agent restart, the job has the step in
		// it already: the runner watches for its result.
		link = job.Link()
	}
	ex := x.Runner.Run(ctx, Attempt{Link: link, Command: job.Command, Dir: workDir, Env: env, Grace: job.Grace, TimeLimit: at.left, GPUs: job.gpus(), MaxLine: x.MaxLine, Credential: job.RunAs.credential(), Contain: contain, From: fromOffsets,
		Note: func(msg string, fields map[string]string) { rec.event(events.Info, events.ExecutorComp, msg, fields) }}, func(l Line) {
		rec.line(classifiers[l.Stream], l, attempt, onMetric, text)
	})
	close(tailStop)
	<-tailDone
	tail.read() // what the process wrote just before it ended
	tail.finish()

	fields := map[string]string{"attempt": strconv.Itoa(attempt), "exit_code": strconv.Itoa(ex.Code)}
	msg := fmt.Sprintf("attempt %d: exited with status %d", attempt, ex.Code)
	lvl := events.Info
	switch {
	case ex.StartErr != nil:
		lvl, msg = events.Error, fmt.Sprintf("attempt %d: could not start %q: %v", attempt, job.Command[0], ex.StartErr)
	case ex.Signal != "":
		lvl, msg = events.Warn, fmt.Sprintf("attempt %d: ended by signal %s", attempt, ex.Signal)
		fields["signal"] = ex.Signal
	case ex.Code != 0:
		lvl = events.Warn
	}
	if ex.Reason != "" {
		msg += ": " + ex.Reason
		if ex.Code != 0 || ex.Signal != "" {
			lvl = events.Error
		}
	}
	if ex.Stopped {
		fields["stopped"] = "true"
		msg += fmt.Sprintf(" (stopped: SIGTERM to the process group%s)", map[bool]string{true: ", SIGKILL after the grace period", false: ""}[ex.Killed])
	}
	rec.event(lvl, events.ExecutorComp, msg, fields)
	return ex
}

// nanGuard notices the first non-finite loss of an attempt and stops it.
type nanGuard struct {
	mu   sync.Mutex
	hit  bool
	step int64
	val  float64
	at   time.Time
}

func (g *nanGuard) check(stop context.CancelCauseFunc) func(events.Metric) {
	return func(m events.Metric) {
		loss, ok := m.Loss()
		if !ok || (!math.IsNaN(loss) && !math.IsInf(loss, 0)) {
			return
		}
		g.mu.Lock()
		first := !g.hit
		if first {
			g.hit, g.step, g.val, g.at = true, m.Step, loss, m.Time
		}
		g.mu.Unlock()
		if first {
			stop(fmt.Errorf("non-finite loss at step %d", m.Step))
		}
	}
}

func (g *nanGuard) tripped() (int64, float64, time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.step, g.val, g.at, g.hit
}

// newestCheckpoint returns the most recently modified entry of dir
// (files or directories, as frameworks save either) modified before the
// non-finite loss was logged: a checkpoint saved after it may hold the
// poisoned weights the restart is meant to escape. (File times come from
// the kernel's coarse clock, up to a tick (4 ms at HZ=250) behind the
// clock the job stamps metrics with, so a checkpoint saved within that
// tick after the bad step can pass for one saved before it. A slack
// would wrongly drop the good checkpoint of a fast trainer instead.) Hidden and *.tmp
// entries (still being written) are ignored; ties go to the larger name.
func newestCheckpoint(dir string, before time.Time) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", err
	}
	var best string
	var bestT time.Time
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || strings.HasSuffix(n, ".tmp") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		t := info.ModTime()
		if !before.IsZero() && !t.Before(before) {
			continue
		}
		if best == "" || t.After(bestT) || (t.Equal(bestT) && n > filepath.Base(best)) {
			best, bestT = filepath.Join(dir, n), t
		}
	}
	return best, nil
}

// agentEnvPrefix is flagenv.Prefix, written here (a test keeps them
// equal) because flagenv brings cobra, which the daemon does not link.
const agentEnvPrefix = "GPUPASS_"

// JobEnviron is what a job and the processes started for it (venv
// creation, pip) may inherit of env: all of it but GPUPASS_* (flagenv's
// prefix). Those variables configure the agent, and flagenv reads every
// secret from one of them (GPUPASS_BROKER_TOKEN, GPUPASS_REGISTRY_PASSWORD and
// their _FILE forms); the job's output becomes uploaded events, so a
// secret it could read would be one echo away from the run log. The
// GPUPASS_* variables a job sees are the ones the executor sets for it
// (EnvAllocID, EnvMetricsFile, ...).
func JobEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, agentEnvPrefix) {
			out = append(out, kv)
		}
	}
	return out
}

// Environ is the environment the job and what runtime-init starts for it
// begin from: BaseEnv (or os.Environ()) through JobEnviron.
func (job *Job) Environ() []string {
	if job.BaseEnv != nil {
		return JobEnviron(job.BaseEnv)
	}
	return JobEnviron(os.Environ())
}

// buildEnv is the job's environment: the base minus the agent's own
// configuration and what gpupass sets, then gpupass's variables.
func buildEnv(job Job, dirs runDirs) ([]string, error) {
	base := job.Environ()
	set := map[string]string{
		EnvAllocID:       job.AllocID,
		EnvRegion:        job.Region,
		EnvMetricsFile:   dirs.metrics,
		EnvCheckpointDir: dirs.ckpt,
		// Python's tempfile, mktemp and most tools read one of these.
		"TMPDIR": dirs.jobTmp(), "TMP": dirs.jobTmp(), "TEMP": dirs.jobTmp(),
	}
	var ld []string
	if job.CUDAHome != "" {
		set["CUDA_HOME"] = job.CUDAHome
		ld = append(ld, filepath.Join(job.CUDAHome, "lib64"))
	}
	ld = append(ld, job.LibraryPaths...)
	if s := job.Spec; s != nil {
		if s.Runtime.CUDAMallocAsync {
			set["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
		} else {
			// Explicit, so an inherited setting cannot change the
			// allocator the spec declared.
			set["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native"
		}
		if th := s.Runtime.CUDAMallocAsyncReleaseThreshold; th != "" {
			n, err := spec.ParseSize(th)
			if err != nil {
				return nil, fmt.Errorf("spec runtime.cuda-malloc-async-release-threshold: %w", err)
			}
			set[EnvReleaseThreshold] = strconv.FormatInt(n, 10)
		}
	}
	if job.RunAs != nil {
		maps.Copy(set, job.RunAs.env(dirs.work))
	}
	var order []string // the rendezvous variables, in the contract's order
	for _, kv := range job.Rendezvous {
		k, v, _ := strings.Cut(kv, "=")
		set[k] = v
		order = append(order, k)
	}
	var env []string
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; ours || k == EnvResumeFrom || k == EnvAttempt {
			continue
		}
		if k == "LD_LIBRARY_PATH" {
			for _, p := range strings.Split(v, ":") {
				if p != "" {
					ld = append(ld, p)
				}
			}
			continue
		}
		env = append(env, kv)
	}
	if len(ld) > 0 {
		env = append(env, "LD_LIBRARY_PATH="+strings.Join(dedupe(ld), ":"))
	}
	for _, k := range append([]string{"HOME", "USER", "LOGNAME", "CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF", EnvReleaseThreshold, EnvAllocID, EnvRegion, EnvMetricsFile, EnvCheckpointDir, "TMPDIR", "TMP", "TEMP"}, order...) {
		if v, ok := set[k]; ok {
			env = append(env, k+"="+v)
		}
	}
	return env, nil
}

func dedupe(xs []string) []string {
	seen := map[string]bool{}
	out := xs[:0:0]
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// DecodeEvent reads an event record of the spool, with its seq.
func DecodeEvent(r spool.Record) (events.Event, error) {
	var e events.Event
	if r.Kind != spool.KindEvent {
		return e, fmt.Errorf("record %d is not an event (kind %d)", r.Seq, r.Kind)
	}
	if err := json.Unmarshal(r.Data, &e); err != nil {
		return e, fmt.Errorf("decoding event record %d: %w", r.Seq, err)
	}
	e.Seq = r.Seq
	return e, nil
}

// DecodeMetric reads a metric record of the spool, with its seq.
func DecodeMetric(r spool.Record) (events.Metric, error) {
	var m events.Metric
	if r.Kind != spool.KindMetric {
		return m, fmt.Errorf("record %d is not a metric point (kind %d)", r.Seq, r.Kind)
	}
	if err := json.Unmarshal(r.Data, &m); err != nil {
		return m, fmt.Errorf("decoding metric record %d: %w", r.Seq, err)
	}
	m.Seq = r.Seq
	return m, nil
}
