package executor

import "errors"

// RunHost holds a run's processes on the node the agent runs on, so that
// nothing the run started outlives it: its cgroup, its own uid, its own
// /tmp (agent/executor/local's Host). The Executor asks for a hold once
// per run, before its first attempt, and ends it after the last; an
// Executor without one refuses to run (ErrNoHost).
type RunHost interface {
	// Hold sets up what holds run job's processes. runner is the
	// Executor's Runner: a host holds more for one that starts the
	// run's processes here than for one that hands them to a cluster.
	// tmpDir is the run's TMPDIR.
	Hold(job Job, runner Runner, tmpDir string) (Held, error)
}

// Held is one run's hold; each of its attempts carries it
// (Attempt.Contain), and the Runner that starts processes here starts
// them inside.
type Held interface {
	// Kill kills every process of the run and waits until none is
	// left; the error names what is left after the host's timeout.
	Kill() error
	// CgroupName names the run's cgroup for its start event ("" for
	// none).
	CgroupName() string
	// TmpMode says in the run's start event whether the run has a /tmp
	// of its own ("": nothing to say).
	TmpMode() string
	// PrivateTmp says the run's /tmp is its own (a mount namespace).
	PrivateTmp() bool
	// Sweep removes what the run's uid left in the node's shared tmp
	// dirs; called only once Kill found nothing of the run left.
	Sweep() error
	// Release ends the hold once the run's processes are gone (its /tmp
	// unmounted, its cgroup removed); each error is a warning. A second
	// call does nothing.
	Release() []error
}

// ErrNoHost is Execute's refusal of an Executor without a Host: a run
// held by nothing but its Runner would leave what it started behind and
// share the node's /tmp with the next, and nothing would say so.
var ErrNoHost = errors.New("the executor has no Host (Executor.Host is nil): give it the node's RunHost, e.g. agent/executor/local's Host")

// OneJobGangs is a Runner that stands for several nodes and runs every
// rank of a gang it holds as one cluster job (Slurm's sbatch -N n), whose
// tasks all run as the one uid it was submitted as. An agent that gives
// each run a uid of its own gives such a gang's ranks one uid, which
// they share (RunAs.Shared).
type OneJobGangs interface {
	RunsGangAsOneJob() bool
}
