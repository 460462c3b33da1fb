package slurm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/follow"
	"github.com/gpupass/gpupass/internal/spec"
)

// Runner runs each attempt of a run as a batch job pinned to one compute
// node: an executor.Runner. The run's work dir must be in the cluster's
// shared dir (the executor's WorkRoot): the job runs there, its output
// files and the metrics file are written there, and the agent reads them
// from the login node.
//
// Each attempt keeps, in WORKDIR/.slurm/attempt-N.json, its job id and
// how far its output files were read; an agent restarted under a run
// finds the job again in its Ledger (without one: there, or by name in
// Slurm) and reads on from the offsets the attempt's From gives (where
// the run's spool ends) instead of submitting it twice.
//
// An attempt with a Credential (a uid of the run's own) is submitted as
// it (sbatch --uid/--gid): WORKDIR/.slurm is handed to it, its files are
// read only when they are its regular files, and no state file is kept.
type Runner struct {
	Client *Client
	// Cluster is the cluster's name, named in the run's events.
	Cluster string
	// Node is the compute node every attempt is pinned to (sbatch -w).
	Node string
	// Gres is what the job asks for ("gpu:a100:4"; empty: none).
	Gres string
	// Partition is sbatch -p (empty: the cluster's default).
	Partition string
	// TimeLimit is sbatch --time of a run that has no limit of its own
	// (Attempt.TimeLimit), rounded up to whole minutes, which is all
	// Slurm counts (zero: the partition's limit).
	TimeLimit time.Duration
	// Poll is how often the output files and the job's state are read
	// (default 200ms).
	Poll time.Duration
	// OnJob, when set, hears each change of the job's state (PENDING
	// with its reason, RUNNING, the end): the agent shows it in runs.
	OnJob func(Job)
	// Gangs, when set, joins the ranks of a run across several of the
	// cluster's nodes into one batch job (gang.go); without it such a
	// run fails to start.
	Gangs *gangHub
	// OnGang, when set, hears that the attempt of allocation alloc is a
	// rank of run's gang, whose one job (JobName(run)) runs it.
	OnGang func(alloc, run string)
	// Ledger, when set (the agent always sets it), records each job
	// submitted, and is the only place an attempt's job is found again:
	// the shared dir (WORKDIR/.slurm, job names) is every job's to write.
	// Strays of the account are cancelled before each submit and at
	// each attempt's end, and what the attempt's files show changed
	// after its job ended fails the attempt as disputed. Nil: the job is
	// found again by the attempt's file or its name (tests of the runner
	// alone).
	Ledger *Ledger
}

// endSlack is how long after the end slurmctld records (whole seconds,
// truncated) a job's own last write may still carry as its change time.
const endSlack = 2 * time.Second

// attemptState is WORKDIR/.slurm/attempt-N.json.
type attemptState struct {
	JobID string `json:"job_id"`
	follow.Offsets
}

// JobName is the name of a run's jobs: it carries the allocation id.
func JobName(allocID string) string { return "gpupass-" + allocID }

func attemptComment(n string) string { return "gpupass-attempt-" + n }

// Run submits (or finds again) the attempt's job, follows its output
// until it ends and maps Slurm's end to an Exit.
func (r *Runner) Run(ctx context.Context, a executor.Attempt, out func(executor.Line)) executor.Exit {
	f := &follower{r: r, note: a.Note, metrics: executor.EnvValue(a.Env, executor.EnvMetricsFile)}
	g, err := gangOf(a.Env)
	if err == nil && g != nil {
		err = g.refuse(a, r.Gangs)
	}
	if err != nil {
		return startErr(err)
	}
	at, err := follow.StartAs(a, ".slurm", ownerOf(a), &f.st, out)
	if err != nil {
		return startErr(err)
	}
	f.files = at.Files
	alloc, attempt, base := at.AllocID, at.N, at.Base
	f.alloc, f.attempt, f.base = alloc, attempt, base
	if r.Ledger != nil {
		// Only what the agent recorded: a job id in the shared dir may
		// be another job's doing, and a job found by name may be one a
		// job submitted under the run's name.
		var ok bool
		if f.st.JobID, ok = r.Ledger.Lookup(alloc, attempt); !ok && a.From == nil {
			// A new job: its files are read from their start, whatever
			// offsets a job wrote into the attempt's state file.
			f.st.Offsets = follow.Offsets{}
		}
	} else if f.st.JobID == "" {
		// The agent may have died between sbatch and writing the state.
		jobs, err := r.Client.JobsNamed(ctx, JobName(alloc))
		if err != nil {
			return startErr(err)
		}
		for _, j := range jobs {
			if j.Comment == attemptComment(attempt) {
				f.st.JobID = j.ID
			}
		}
	}
	if g != nil {
		return r.runGang(ctx, a, f, *g)
	}
	if f.st.JobID == "" {
		id, refused, err := r.submit(ctx, a, alloc, attempt, base, f.noteStrays)
		if err != nil {
			ex := startErr(err)
			// sbatch said no (a node Slurm will not run it on, a
			// limit): the node's failed launch.
			ex.LaunchFailed = refused
			return ex
		}
		f.st.JobID = id
		// Not fatal: the job is found again in the ledger (without
		// one, by name).
		_ = f.files.Save()
	}
	return f.run(ctx, a.Grace)
}

// ownerOf is the attempt's own user (sbatch --uid), nil for the
// agent's: slurmd creates the job's output files as it, in a dir of
// its own, and the agent reads only its regular files.
func ownerOf(a executor.Attempt) *executor.RunAs {
	c := a.Credential
	if c == nil {
		return nil
	}
	return &executor.RunAs{UID: c.Uid, GID: c.Gid}
}

// EnforcesTimeLimit implements executor.LimitEnforcer: slurmctld ends a
// job at its --time (state TIMEOUT), and a batch job outlives the agent,
// which could not stop it at the deadline while it is down.
func (r *Runner) EnforcesTimeLimit() bool { return true }

// timeArg is sbatch --time in minutes for the attempt: what is left of
// the run's limit, else the agent's default; 0 for none. note says why
// when Slurm's whole minutes round the run's limit up.
func (r *Runner) timeArg(a executor.Attempt) (minutes int, note string) {
	d, whose := a.TimeLimit, "the run's time limit"
	if d <= 0 {
		d, whose = r.TimeLimit, "the agent's --slurm-time-limit"
	}
	if d <= 0 {
		return 0, ""
	}
	// What is left of a run's limit is a hair under what it was a moment
	// ago: whole seconds first, so 59.999s is the minute it means.
	d = (d + time.Second - 1) / time.Second * time.Second
	minutes = int((d + time.Minute - 1) / time.Minute)
	note = fmt.Sprintf("sbatch --time=%d: %s (%s left)", minutes, whose, spec.FormatTimeLimit(d))
	if time.Duration(minutes)*time.Minute != d {
		note += fmt.Sprintf(" rounded up to %d minute(s), as Slurm counts whole minutes (and slurmctld checks limits periodically, so a job may run somewhat past it)", minutes)
	}
	return minutes, note
}

func startErr(err error) executor.Exit {
	return executor.Exit{StartErr: fmt.Errorf("slurm: %w", err), Code: -1}
}

// script is the batch script: the attempt's command, exec'd in its work
// dir so that Slurm's signals reach it, not a shell in between.
func script(a executor.Attempt) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# written by gpupass-agent: one attempt of a run\n")
	fmt.Fprintf(&b, "cd %s || exit 127\nexec%s\n", shellQuote(a.Dir), shellWords(a.Command))
	return b.String()
}

var shellQuote = executor.ShellQuote

// shellWords is argv as POSIX shell words, each after a space.
func shellWords(argv []string) string {
	var b strings.Builder
	for _, arg := range argv {
		b.WriteString(" " + shellQuote(arg))
	}
	return b.String()
}

func (r *Runner) submit(ctx context.Context, a executor.Attempt, alloc, attempt, base string, strays func([]Job, string)) (id string, refused bool, err error) {
	if len(a.Command) == 0 {
		return "", false, errors.New("the attempt has no command")
	}
	return r.submitScript(ctx, a, alloc, attempt, base, strays, []string{"-w", r.Node, "-N1", "-n1"}, script(a), nil)
}

// submitScript submits body as the attempt's batch job on the nodes
// place names (sbatch -w …); ranks are the allocations of a gang's other
// ranks, which the job runs too (Ledger.Submit).
func (r *Runner) submitScript(ctx context.Context, a executor.Attempt, alloc, attempt, base string, strays func([]Job, string), place []string, body string, ranks []string) (id string, refused bool, err error) {
	args := append([]string{"--parsable"}, place...)
	args = append(args, "--job-name", JobName(alloc), "--comment", attemptComment(attempt),
		"--chdir", a.Dir, "--output", base+".out", "--error", base+".err", "--open-mode=append", "--export=ALL", "--no-requeue")
	if c := a.Credential; c != nil {
		// The run's own uid (--run-as-range): its job cannot write
		// another run's files or scancel another run's job, and every
		// job it submits is of that uid too. Only root and the
		// cluster's SlurmUser may submit as another uid.
		args = append(args, "--uid="+strconv.FormatUint(uint64(c.Uid), 10), "--gid="+strconv.FormatUint(uint64(c.Gid), 10))
	}
	if r.Partition != "" {
		args = append(args, "-p", r.Partition)
	}
	if r.Gres != "" {
		args = append(args, "--gres="+r.Gres)
	}
	if minutes, note := r.timeArg(a); minutes > 0 {
		args = append(args, "--time="+strconv.Itoa(minutes))
		if a.Note != nil {
			a.Note(note, map[string]string{"slurm_time_limit_minutes": strconv.Itoa(minutes)})
		}
	}
	sbatch := func() (string, error) {
		// The job's environment is the attempt's (sbatch --export=ALL):
		// the same GPUPASS_* variables as the local executor's. The
		// script goes on sbatch's stdin, never through the shared dir,
		// where a job of the account could change it before sbatch
		// reads it.
		out, err := r.Client.runStdin(ctx, a.Env, body, "sbatch", args...)
		if err != nil {
			var te *ToolError
			refused = errors.As(err, &te)
			return "", fmt.Errorf("submitting to node %s: %w", place[1], err)
		}
		id, _, _ := strings.Cut(strings.TrimSpace(out), ";") // "ID;cluster" on federations
		if _, err := strconv.ParseUint(id, 10, 64); err != nil {
			return "", fmt.Errorf("sbatch --parsable printed %.100q, not a job id", out)
		}
		return id, nil
	}
	if r.Ledger == nil {
		id, err = sbatch()
		return id, refused, err
	}
	id, cancelled, err := r.Ledger.Submit(ctx, r.Client, alloc, attempt, sbatch, ranks...)
	strays(cancelled, "before submitting the attempt's job")
	return id, refused, err
}

// follower follows one attempt: its job and its output files.
type follower struct {
	r     *Runner
	st    attemptState
	files *follow.Files
	last  Job
	note  func(string, map[string]string)
	// alloc and attempt name the attempt in the ledger; base is its
	// files less their extension, metrics the run's metrics file.
	alloc, attempt, base, metrics string
	// link hears a gang rank's link step (nil: none); linked once it
	// has.
	link   *executor.LinkWatch
	linked bool
}

// noteStrays tells the run's log which jobs of the account the agent did
// not submit it cancelled, and when.
func (f *follower) noteStrays(jobs []Job, when string) {
	if len(jobs) == 0 || f.note == nil {
		return
	}
	whose := "the agent's account"
	if f.r.Ledger != nil && f.r.Ledger.Polices != nil {
		whose = "the runs' uids"
	}
	f.note(fmt.Sprintf("cancelled %d slurm job(s) of %s that no live run submitted (%s): %s", len(jobs), whose, when, DescribeStrays(jobs)),
		map[string]string{"slurm_strays_cancelled": strconv.Itoa(len(jobs))})
}

// end is the attempt's end once Slurm says its job ended: no job of the
// account that the agent did not submit is left running (one the run's
// job started must not outlive it), then the output files are read to
// their end, and the attempt is disputed when one of its files changed
// after the job ended: only another job of the account could write it
// then.
func (f *follower) end(ctx context.Context, j Job, ex executor.Exit) executor.Exit {
	r := f.r
	if r.Ledger != nil {
		strays, err := r.Ledger.Sweep(ctx, r.Client, SweepWait)
		f.noteStrays(strays, "at the end of the attempt's job")
		if err != nil {
			ex.Code = -1
			ex.Reason = joinReason(ex.Reason, "jobs the run may have started could not all be ended: "+err.Error())
		}
	}
	f.read(true)
	if r.Ledger != nil {
		if why := changedAfterEnd(j, f.base+".out", f.base+".err", f.metrics); why != "" {
			ex.Code = -1
			ex.Reason = joinReason(ex.Reason, why)
		}
		r.Ledger.forget(f.alloc, f.attempt)
	}
	return ex
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// changedAfterEnd says which of files changed (its ctime, which no
// process can set back) after the job's end, in words; "" when none did
// or Slurm gave no end time.
func changedAfterEnd(j Job, files ...string) string {
	if j.EndTime.IsZero() {
		return ""
	}
	for _, p := range files {
		if p == "" {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			continue
		}
		ct := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
		if ct.After(j.EndTime.Add(endSlack)) {
			return fmt.Sprintf("disputed: %s changed at %s, after slurm job %s ended at %s: only another job of the run's user could write it then, so what was read from it after the job's end is not proof",
				filepath.Base(p), ct.UTC().Format(time.RFC3339), j.ID, j.EndTime.UTC().Format(time.RFC3339))
		}
	}
	return ""
}

// read hands over the lines written since the last read. Failing to
// save how far it got does not fail the attempt: an agent restarted under
// it reads on from where the run's spool holds the lines (Attempt.From).
func (f *follower) read(final bool) { _ = f.files.Read(final) }

func (f *follower) observe(j Job) {
	if j.State != f.last.State || j.Reason != f.last.Reason {
		f.last = j
		if f.note != nil {
			f.note(j.Describe(), map[string]string{"slurm_job_id": j.ID, "slurm_job_name": j.Name, "slurm_state": j.State,
				"slurm_reason": j.Reason, "slurm_node": j.Node, "slurm_partition": j.Partition, "slurm_cluster": f.r.Cluster})
		}
		if f.r.OnJob != nil {
			f.r.OnJob(j)
		}
	}
}

// run follows the job to its end. A cancelled ctx stops the job: SIGTERM
// to every step (the batch script is the command itself), then after
// grace SIGKILL.
func (f *follower) run(ctx context.Context, grace time.Duration) executor.Exit {
	poll := f.r.Poll
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	bg := context.WithoutCancel(ctx)
	var stopped, killed bool
	var killAt time.Time
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		f.read(false)
		if !f.linked {
			f.linked = f.link.Poll()
		}
		j, err := f.r.Client.Job(bg, f.st.JobID)
		switch {
		case errors.Is(err, ErrNoJob):
			return f.end(bg, Job{ID: f.st.JobID}, executor.Exit{Code: -1, Stopped: stopped, Killed: killed,
				Reason: fmt.Sprintf("slurm no longer knows job %s (purged after MinJobAge before its end was read)", f.st.JobID)})
		case err == nil:
			f.observe(j)
			if j.Phase() == Ended {
				return f.end(bg, j, exitOf(j, stopped, killed))
			}
		}
		if stopped && !killed && time.Now().After(killAt) {
			killed = true
			_, _ = f.r.Client.run(bg, nil, "scancel", "--full", "--signal=KILL", f.st.JobID)
			// A pending job (or one scancel --full did not end) is
			// simply cancelled.
			_, _ = f.r.Client.run(bg, nil, "scancel", f.st.JobID)
		}
		select {
		case <-ctx.Done():
			if !stopped {
				stopped = true
				killAt = time.Now().Add(grace)
				if j.Phase() == Pending {
					_, _ = f.r.Client.run(bg, nil, "scancel", f.st.JobID)
				} else {
					_, _ = f.r.Client.run(bg, nil, "scancel", "--full", "--signal=TERM", f.st.JobID)
				}
			}
			<-tick.C
		case <-tick.C:
		}
	}
}

func exitOf(j Job, stopped, killed bool) executor.Exit {
	ex := executor.Exit{Code: j.ExitCode, Stopped: stopped, Killed: killed, NodeLost: j.NodeLost()}
	switch j.baseState() {
	case "COMPLETED":
		return ex
	case "FAILED":
		if j.Signal != 0 {
			ex.Code, ex.Signal = -1, "signal "+strconv.Itoa(j.Signal)
		}
	case "CANCELLED":
		ex.Code = -1
		if j.Signal != 0 {
			ex.Signal = "signal " + strconv.Itoa(j.Signal)
		}
	default:
		ex.Code = -1
	}
	ex.Reason = j.Describe()
	if ex.NodeLost {
		ex.Reason = "node lost: " + ex.Reason
	}
	return ex
}
