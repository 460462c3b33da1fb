package executor

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/internal/events"
)

// Runner starts one attempt of a job and reports its output and its end.
// It is the plug-in point for where a job runs: agent/executor/local's
// ProcessRunner runs it as a process group on this node; container and Kubernetes-Job runners fit
// the same contract (output lines stream back, cancel stops everything
// the attempt started, Run returns only when nothing of it is left).
//
// The Executor above a Runner owns what is the same everywhere: runtime
// init, the environment, events, metrics, the spool and the NaN guard.
type Runner interface {
	// Run runs the attempt to its end and returns how it ended. Every
	// output line goes to out as it arrives; out may be called from one
	// goroutine per stream at once, and never after Run returns. When
	// ctx is cancelled the runner stops the attempt: SIGTERM (or its
	// equivalent), then after a.Grace SIGKILL. Run returns only when
	// every process the attempt started has been stopped.
	Run(ctx context.Context, a Attempt, out func(Line)) Exit
}

// LimitEnforcer is a Runner whose scheduler ends an attempt at its time
// limit itself (Slurm's sbatch --time): it takes what is left of the
// run's limit from Attempt.TimeLimit and ends a timed-out attempt with an
// Exit whose Reason says so in the scheduler's words. The executor then
// does not stop the attempt at the deadline itself; it does for every
// other Runner (SIGTERM, Grace, SIGKILL, as for a cancel).
type LimitEnforcer interface {
	Runner
	EnforcesTimeLimit() bool
}

// DefaultGrace is the time between SIGTERM and SIGKILL when an attempt
// does not say.
const DefaultGrace = 10 * time.Second

// EnvValue is key's value in an attempt's environment (Attempt.Env): the
// last one set, as the process would see it; "" when not set.
func EnvValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// Attempt is what a Runner needs to start one process of a run.
type Attempt struct {
	Command []string
	Dir     string
	// Env is the complete environment of the process.
	Env []string
	// Grace is how long a stopped attempt gets between SIGTERM and
	// SIGKILL.
	Grace time.Duration
	// TimeLimit is what is left of the run's time limit as the attempt
	// starts (0: the run has none). The limit is the run's, not the
	// attempt's: NaN restarts share one wall-clock budget. Only a
	// LimitEnforcer reads it; the executor stops other runners' attempts.
	TimeLimit time.Duration
	// GPUs is how many accelerators the run's spec asks for on this
	// node (resources.count, a gang rank's share of it); 0 when the run
	// has no spec. A runner that hands
	// GPUs out (a Kubernetes pod's nvidia.com/gpu request) asks for this
	// many, and for all the node's when it is 0.
	GPUs int
	// MaxLine bounds one output line; the rest of a longer line is
	// dropped and counted.
	MaxLine int
	// Credential, when set, is the user and groups the command runs as
	// (the runner must be root to use it).
	Credential *syscall.Credential
	// Contain, when set, holds every process of the run (its cgroup,
	// its own uid; the Executor's RunHost): the command starts inside,
	// and once it ended whatever is left there is killed before Run
	// returns.
	Contain Held
	// Note, when set, records an event in the run's log: a runner that
	// hands the attempt to a scheduler says there what the scheduler
	// does with it (job id, pending and why, node).
	Note func(msg string, fields map[string]string)
	// From, when set, says the attempt was started by an earlier agent
	// process and outlived it (Job.Reattach): a Runner that reads the
	// output from files finds it again and reads on from these offsets,
	// where the records the run holds end.
	From *Offsets
	// Link, when set, is the link measurement of a gang's rank, to run
	// in the job before Command (only a runner whose jobs run away from
	// the agent takes it; see LinkStep).
	Link *LinkStep
}

// Offsets are where in an attempt's output files the stored lines end.
type Offsets struct {
	Stdout, Stderr int64
}

// Line is one line of output, without its line ending, always valid UTF-8.
type Line struct {
	Stream events.Stream
	Text   string
	// Cut counts bytes dropped from a line longer than MaxLine.
	Cut int
	// InvalidUTF8 says bytes that were not UTF-8 were replaced by U+FFFD.
	InvalidUTF8 bool
	// Offset, from a runner that reads the output from a file (a batch
	// job's), is where in that file the line ends: a consumer that stores
	// it with the line can have the runner read on from exactly there
	// after a restart.
	Offset int64
}

// Exit is how an attempt ended.
type Exit struct {
	// StartErr is set when the command could not be started at all
	// (not found, not executable, bad work dir).
	StartErr error
	// Code is the exit status, -1 when killed by a signal or not started.
	Code int
	// Signal names the signal that ended the process, if any.
	Signal string
	// Stopped says the attempt was stopped because ctx was cancelled;
	// Killed that it needed SIGKILL after the grace period.
	Stopped, Killed bool
	// Leftover says processes of the attempt could not be killed: the
	// run must not go on, and its uid must not be handed out again.
	Leftover error
	// Reason, when set, is why the attempt ended in the words of what
	// ran it (a batch system's job state and reason: "slurm job 12 on
	// n1: TIMEOUT"); it becomes the run's reason, and a run whose
	// attempt has one failed unless its Code is 0.
	Reason string
	// NodeLost says the attempt ended because of its node (Slurm's
	// NODE_FAIL or PREEMPTED), not because of the job's code.
	NodeLost bool
	// LaunchFailed says the node could not start the attempt at all (the
	// scheduler refused the job): the node's failure, not the job's.
	LaunchFailed bool
}
