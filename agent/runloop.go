package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/agentmetrics"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Assignment is one run the broker hands this node.
type Assignment struct {
	AllocID string
	// FencingToken names this node's lease on the run; every update and
	// upload carries it, and the broker refuses a stale one, so a run
	// that was moved elsewhere is never written to by two nodes.
	FencingToken uint64
	// Spec is the run's spec in its wire form (spec.Encode; spec.Decode
	// reads it).
	Spec []byte
	// SpecFingerprint is the fingerprint the broker computed at submit;
	// empty from a broker of the previous release (not checked then).
	SpecFingerprint string
	Command         []string
	// Workdir is a tar (optionally gzip-compressed) of the job's files,
	// unpacked into the run's work dir before the command starts.
	Workdir     []byte
	Region      string
	MaxRestarts int
	Grace       time.Duration
	// TimeLimit is the run's wall-clock limit (executor.Job.TimeLimit;
	// 0: none).
	TimeLimit time.Duration
	// ResumeAfterSeq is set when the run continues here after its node
	// was lost: the broker holds seq 1..ResumeAfterSeq already, and this
	// node's records follow them (its spool still counts from 1).
	ResumeAfterSeq uint64
	// ResumeCheckpointName and ResumeCheckpoint are the newest checkpoint
	// the lost node shipped; the command starts from it.
	ResumeCheckpointName string
	ResumeCheckpoint     []byte
	// KeepCheckpoints is set for a run submitted without
	// --resume-elsewhere: no other node resumes from its checkpoints, so
	// none is shipped to the broker.
	KeepCheckpoints bool
	// Gang is this node's place in a run across several nodes, as the
	// broker gave it (checked by gangEnv before use); nil for a run on
	// one node.
	Gang *rendezvous.Gang
	// GangRun is the run (rank 0's allocation) this rank belongs to.
	GangRun string
	// RequireBandwidth: a link measured below the spec's declared
	// bandwidth fails the run (--require-bandwidth) rather than being
	// recorded as a shortfall.
	RequireBandwidth bool

	// linkStep is, once runtime-init signed a cluster rank's report, the
	// link step of the rank's job that amends it (clusterlink.go).
	linkStep *executor.LinkStep
	// linkReport is the report linkStep amends, as runtime-init signed
	// it: the ledger keeps it, for a restarted agent following the rank
	// on to amend it still (RunLoop.FollowLink).
	linkReport *SignedReport
	// linkCheck is, once runtime-init signed a rank's report with the
	// link this node's agent measured, that report's link check: the
	// run's log says it (linkEvent).
	linkCheck *conformance.Check
}

// AllocState is a state the agent reports for an allocation.
type AllocState string

// States the agent reports; the broker owns pending and matched.
const (
	StateStarting  AllocState = "starting"
	StateRunning   AllocState = "running"
	StateSucceeded AllocState = "succeeded"
	StateFailed    AllocState = "failed"
	StateCancelled AllocState = "cancelled"
)

// AllocUpdate is one UpdateAllocation call.
type AllocUpdate struct {
	AllocID      string
	FencingToken uint64
	State        AllocState
	Reason       string
	ExitCode     int
	Attempts     int
	Restarts     int
	LastSeq      uint64
	// Slurm is where the run's batch job is (nil: not a Slurm run, or
	// its job not seen yet).
	Slurm *SlurmPlacement
	// NodeFault, with StateFailed, says the run failed because of the
	// node: lost under it (re-placed like a node gone silent) or not
	// launched; either counts in the node's failure rate.
	NodeFault executor.NodeFault `json:",omitempty"`
}

// SlurmPlacement is a run's batch job on a Slurm cluster, reported to the
// broker with every update so that runs, compare and audits name it.
type SlurmPlacement struct {
	Cluster, JobID, Node, Partition string
}

// ErrStaleLease is what a WorkSource returns when the broker refused the
// fencing token: the run belongs to another node (or was reset) and this
// node must stop touching it.
var ErrStaleLease = errors.New("the broker refused this node's lease on the run (stale fencing token)")

// WorkSource is the broker as the run loop sees it. The agent's ConnectRPC
// client implements it; tests use an in-process one.
type WorkSource interface {
	// PollWork waits (long poll) for a run for this node; nil, nil when
	// the poll ended without one.
	PollWork(ctx context.Context, agentID string) (*Assignment, error)
	// UpdateAllocation records a state edge (or, with the current state,
	// just asks whether a cancel is wanted). ErrStaleLease when refused.
	UpdateAllocation(ctx context.Context, u AllocUpdate) (cancelRequested bool, err error)
	// Sink is where the run's spooled records go.
	Sink(a *Assignment) uploader.Sink
}

// RunLoop takes runs from a WorkSource and executes them, one at a time,
// each with its own spool and uploader.
type RunLoop struct {
	Source   WorkSource
	AgentID  func() string
	Executor *executor.Executor
	// JobPortMin..JobPortMax are the node's job ports (agent
	// --job-ports): a rank 0 is only started on a rendezvous port among
	// them. 0: the node takes no gang rank.
	JobPortMin, JobPortMax int
	// StateDir holds runs/<alloc> (work dirs) and spool/<alloc>.
	StateDir string
	// Orphaned, when set, stops what a run left running when the agent
	// died under it (a Slurm job) and could not follow it on (it died
	// before the attempt started, or the spool has no mark), and
	// returns the run's reason.
	Orphaned func(ctx context.Context, allocID string) string
	// Placement, when set, says where a run's batch job is (nil when
	// not known yet); every update of the run carries it.
	Placement func(allocID string) *SlurmPlacement
	// WorkRoot, when set, holds the work dirs instead of StateDir/runs
	// (the Slurm executor's shared dir, which the compute nodes see).
	WorkRoot string
	// Python is the run's interpreter (its packages are checked).
	Python string
	// Recheck re-runs the conformance suite against the run's spec
	// before the command starts (the suite reuses what cannot have
	// changed); nil skips it.
	Recheck func(ctx context.Context, sp *spec.Spec) ([]conformance.Check, error)
	// RunReport, when set, replaces Recheck: it signs the run's own
	// conformance report (packages checked in python) and hands it to
	// the broker as the run's audit evidence (see runreport.go). It
	// returns a detail for the log and the checks that fail.
	RunReport func(ctx context.Context, a *Assignment, sp *spec.Spec, python string, measured *executor.MeasuredPython) (string, []conformance.Check, *executor.MeasuredPython, error)
	// FollowLink, when set, is the link step of a cluster rank followed
	// on after the agent restarted: report and signature are the rank's
	// run report as runtime-init signed it (kept in the ledger), which
	// the step amends with the figure the job measured, as it would have
	// before the restart.
	FollowLink func(a *Assignment, report []byte, signature string) (*executor.LinkStep, error)
	Log        *slog.Logger
	// CUDAHome returns the verified toolkit's root (exported as
	// CUDA_HOME, its lib64 first on LD_LIBRARY_PATH); "" for none.
	CUDAHome func() string
	// UpdateEvery is how often a running run asks whether it should be
	// cancelled (default 1s).
	UpdateEvery time.Duration
	// DrainTimeout bounds the wait for the broker to hold every record
	// after the command ended (default 10 minutes: a broker restart must
	// not lose the tail of a run).
	DrainTimeout time.Duration
	// Retry is the pause after a failed poll (default 1s).
	Retry time.Duration

	// finishing tracks runs whose end is still being delivered (spool
	// upload, then final state) in the background; see runstate.go.
	finishMu  sync.Mutex
	finishing map[string]bool
	finishWG  sync.WaitGroup
	// Bundles installs a spec's runtime.bundle before the command
	// (bundleinstall.go); the zero value uses TLS and the docker config.
	Bundles BundleInstaller
	// RunAs, when set, is the user jobs run as (--run-as).
	RunAs *executor.RunAs
	// RunAsRange, when set, gives each run a uid of its own
	// (--run-as-range); it replaces RunAs.
	RunAsRange *local.UIDRange
	// GangsShareUID gives the ranks of a gang that this agent runs one
	// uid of RunAsRange (the Executor's Runner runs them as one job:
	// executor.OneJobGangs).
	GangsShareUID bool
	// KeepRuns bounds the work dirs under StateDir/runs: as a run starts,
	// all but the newest KeepRuns (the starting run's included) are
	// deleted, so checkpoints of old runs do not fill the node's disk.
	// 0 keeps them all.
	KeepRuns int
	// WorkdirLimits bound a run's work dir archive on unpack (zero
	// fields: workdir.Default).
	WorkdirLimits workdir.Limits
	// Busy, when set, is called as a run starts; the function it returns
	// is called when the run's command and checks are over. The agent
	// holds its periodic conformance runs meanwhile.
	Busy func() (done func())
	// Metrics, when set, exports the run in progress and its spool.
	Metrics *agentmetrics.Metrics
}

func (l *RunLoop) log() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Log
}

// Run polls for work until ctx ends.
func (l *RunLoop) Run(ctx context.Context) error {
	retry := l.Retry
	if retry <= 0 {
		retry = time.Second
	}
	// Runs this node took before it restarted: their spools go up and
	// their final states follow, next to new work.
	l.resumeRuns(ctx)
	defer l.finishWG.Wait()
	for ctx.Err() == nil {
		a, err := l.Source.PollWork(ctx, l.AgentID())
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			wait := retry
			if errors.Is(err, ErrUnsupported) {
				// A broker without the runs API: registry only.
				wait = 30 * time.Second
			}
			l.log().Warn("polling for work", "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		if a == nil {
			continue
		}
		l.runBusy(ctx, a)
	}
	return nil
}

func (l *RunLoop) runBusy(ctx context.Context, a *Assignment) {
	if l.Busy != nil {
		defer l.Busy()()
	}
	l.RunAssignment(ctx, a)
}

// RunAssignment executes one run to its end and reports each edge. It
// returns the final update it sent (or would have sent, when the lease
// was lost). Each step is a method of run (runsteps.go): start → prepare
// the work dir → open the spool → execute (runtime-init and its package
// check, the command, its restarts and NaN guard in the executor, while
// the uploader follows the spool and the watcher the lease) → finish.
func (l *RunLoop) RunAssignment(ctx context.Context, a *Assignment) AllocUpdate {
	r := &run{l: l, a: a, log: l.log().With("alloc", a.AllocID), ledgerWritten: func() error { return nil }}
	r.final = AllocUpdate{AllocID: a.AllocID, FencingToken: a.FencingToken}
	// Before anything is named after the id: work dir, spool, ledger.
	if err := executor.CheckAllocID(a.AllocID); err != nil {
		return l.refuse(ctx, r.log, a, err)
	}
	if err := r.start(ctx); err != nil {
		r.log.Warn("refusing run: starting update not accepted", "err", err)
		r.final.State, r.final.Reason = StateFailed, err.Error()
		return r.final
	}
	sp, err := decodeSpec(a.Spec, a.SpecFingerprint)
	if err != nil {
		return r.failBeforeStart(ctx, err.Error())
	}
	r.spec = sp
	if r.rendezvous, err = l.gangEnv(a); err != nil {
		return r.failBeforeStart(ctx, err.Error())
	}
	release, err := r.acquireUser()
	if err != nil {
		return r.failBeforeStart(ctx, err.Error())
	}
	defer release()
	if err := r.prepareWorkdir(); err != nil {
		return r.failBeforeStart(ctx, err.Error())
	}
	if err := r.openSpool(); err != nil {
		return r.failBeforeStart(ctx, err.Error())
	}
	defer r.closeSpool()
	res, err := r.execute(ctx)
	r.settle(ctx, res, err)
	return r.finish(ctx)
}

// gangEnv is the rendezvous environment of a rank of a gang (nil for a
// run on one node), after checking what the broker gave: a node rank
// below the node count, an address and port a rendezvous may use, and,
// on rank 0, which listens there, a port of this node's own job range, so
// a broker cannot make a job listen on a port the node keeps for
// something else.
func (l *RunLoop) gangEnv(a *Assignment) ([]string, error) {
	g := a.Gang
	if g == nil {
		return nil, nil
	}
	if l.JobPortMax == 0 {
		return nil, errors.New("the broker gave this node a rank of a run across several nodes, but it advertises no job ports (this agent's job address and port range are not set)")
	}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("the broker's rendezvous for this rank: %w", err)
	}
	if g.NodeRank == 0 && !rendezvous.InRange(g.MasterPort, l.JobPortMin, l.JobPortMax) {
		return nil, fmt.Errorf("the broker's rendezvous port %d is not one of this node's job ports %d-%d", g.MasterPort, l.JobPortMin, l.JobPortMax)
	}
	if g.LocalRanks != 1 {
		return nil, fmt.Errorf("the broker's rendezvous has %d ranks per node: this agent starts one", g.LocalRanks)
	}
	env, err := g.Rank(0)
	if err != nil {
		return nil, err
	}
	return append(env, executor.EnvGangRun+"="+a.GangRun), nil
}

// refuse reports a run this node will not touch as failed, once and
// briefly: nothing was spooled or written for it, so nothing waits.
func (l *RunLoop) refuse(ctx context.Context, log *slog.Logger, a *Assignment, why error) AllocUpdate {
	final := AllocUpdate{AllocID: a.AllocID, FencingToken: a.FencingToken, State: StateFailed, ExitCode: -1,
		Reason: "the agent refused the run: " + why.Error()}
	log.Error("refusing a run from the broker", "err", why)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := l.send(rctx, a, final); err != nil {
		log.Warn("reporting the refused run", "err", err)
	}
	return final
}

func (l *RunLoop) drainTimeout() time.Duration {
	if l.DrainTimeout <= 0 {
		return 10 * time.Minute
	}
	return l.DrainTimeout
}

// checks are the runtime-init checks this node adds: the conformance
// suite again against the run's spec, which also refuses GPUs held by
// processes this agent did not start.
func (l *RunLoop) checks(a *Assignment, sp *spec.Spec) []executor.RuntimeCheck {
	if (l.Recheck == nil && l.RunReport == nil) || sp == nil {
		return nil
	}
	return []executor.RuntimeCheck{{Name: "conformance", Prepare: func(ctx context.Context, job *executor.Job, emit executor.Emit) (string, error) {
		// Packages are enforced in the run's own Python right after this
		// (runtime-init, importlib.metadata), one event per package, from
		// the measurement made here when there is one.
		detail, failed, measured, err := l.recheck(ctx, a, sp, job.Python, job.Measured)
		if err != nil {
			return "", err
		}
		if measured != nil {
			// Else the bundle's measurement of its venv stays: nothing
			// may start that interpreter as the agent to measure again.
			job.Measured = measured
		}
		if c := a.linkCheck; c != nil {
			emit(linkEvent(*c))
		}
		if len(failed) > 0 {
			var msgs []string
			for _, c := range failed {
				m := fmt.Sprintf("%s expected %s, found %s", c.Name, c.Expected, c.Actual)
				if c.Message != "" {
					m += " (" + c.Message + ")"
				}
				msgs = append(msgs, m)
			}
			return "", fmt.Errorf("node does not conform: %s", strings.Join(msgs, "; "))
		}
		return detail, nil
	}}}
}

// decodeSpec reads the spec the broker sent (spec.Decode: its one wire
// form) and, when the broker sent the run's fingerprint, checks that the
// spec hashes to it here: what this node runs and signs for is then the
// spec the submitter fingerprinted, not one changed on the way.
func decodeSpec(b []byte, fingerprint string) (*spec.Spec, error) {
	if len(b) == 0 {
		if fingerprint != "" {
			// A run with a fingerprint always has a spec: without one
			// the node would skip its conformance re-check.
			return nil, fmt.Errorf("the run was submitted with spec fingerprint %s but came without its spec: refusing to run a spec other than the one submitted", fingerprint)
		}
		return nil, nil
	}
	s, err := spec.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("the run's spec: %w", err)
	}
	if fingerprint == "" {
		return s, nil
	}
	got, err := spec.Fingerprint(s)
	if err != nil {
		return nil, fmt.Errorf("the run's spec: %w", err)
	}
	if got != fingerprint {
		return nil, fmt.Errorf("the run's spec hashes to %s on this node, but the run was submitted with spec fingerprint %s: refusing to run a spec other than the one submitted", got, fingerprint)
	}
	return s, nil
}

// Recheck is RunLoop.Recheck for this agent: CheckSpec's failed checks.
func (a *Agent) Recheck(ctx context.Context, sp *spec.Spec) ([]conformance.Check, error) {
	fp, err := a.CheckSpec(ctx, sp)
	if err != nil {
		return nil, err
	}
	return fp.Failed, nil
}

// startRunLoop runs the work loop against the broker until ctx ends; the
// returned func waits for it (a run in flight is stopped and reported).
func (a *Agent) startRunLoop(ctx context.Context) (wait func(), err error) {
	id := func() string {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.agentID
	}
	// The work API is on the broker that enrollment and heartbeats
	// reach: --tls-ca is trusted here too.
	co := a.o.brokerOptions(a.tls)
	co.Agent = a.creds
	src, err := NewBrokerSource(a.o.BrokerURL, co, id, a.log)
	if err != nil {
		return nil, err
	}
	cgroups, err := a.runCgroups()
	if err != nil {
		return nil, err
	}
	host := &local.Host{Cgroups: cgroups, KillTimeout: a.o.RunKillTimeout}
	if a.o.runAsRange != nil {
		a.o.runAsRange.KillTimeout = a.o.RunKillTimeout
	}
	l := &RunLoop{
		Source: src, AgentID: id, StateDir: a.o.StateDir, Python: a.o.Python, Log: a.log,
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: host, Log: a.log, Output: a.o.outputLimits()},
		Recheck:  a.Recheck, CUDAHome: a.cudaHome, KeepRuns: a.o.KeepRuns, RunAs: a.o.runAs, RunAsRange: a.o.runAsRange, WorkdirLimits: a.o.Workdir,
		Bundles:    BundleInstaller{Registry: a.o.Registry, Log: a.log, VerifyRecord: a.o.VerifyRecord},
		JobPortMin: a.o.jobPortMin, JobPortMax: a.o.jobPortMax,
	}
	l.RunReport = a.runReporter(src)
	l.FollowLink = a.followLink(src)
	if n := a.o.standsFor; n != nil {
		l.Executor.Runner, l.WorkRoot, l.Orphaned, l.Placement = n.Runner(), n.WorkRoot(), n.Orphaned, n.Placement
		if g, ok := n.Runner().(executor.OneJobGangs); ok {
			l.GangsShareUID = g.RunsGangAsOneJob()
		}
		// A cluster's jobs outlive the agent: a restarted one finds
		// them again and follows them on from the spool's mark.
		l.Executor.Marks = true
	} else if host.PrivateTmp, err = a.runPrivateTmp(); err != nil {
		return nil, err
	} else if a.o.jobPortMax > 0 {
		// This node takes gang ranks and runs them itself: from its
		// first gang on, their link measurement finds its process
		// started and torch imported. Not before: a node that never
		// takes a gang keeps no torch process (about 200 MB and a
		// second or two of CPU at each agent start) for nothing.
		py := a.o.Python
		if py == "" {
			py = defaultLinkPython
		}
		a.link = newLinkWorkers(py, func() bool { return a.runs.Load() == 0 }, a.log)
	}
	l.Busy = a.busy
	l.Metrics = a.metrics
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
		if a.link != nil {
			a.link.stop()
		}
		if cgroups != nil {
			// Every run's cgroup is gone with its run; the agent's
			// parent of them goes with the agent.
			_ = cgroups.RemoveParents()
		}
	}()
	return func() { <-done }, nil
}

// runPrivateTmp checks that runs can have a /tmp and /dev/shm of their
// own (--run-private-tmp) and says in the log what they get.
func (a *Agent) runPrivateTmp() (*local.PrivateTmp, error) {
	shared := "runs share the node's /tmp, /var/tmp and /dev/shm; what a run's uid adds there is removed at its end, unless jobs run as root"
	if a.o.RunPrivateTmp == "off" {
		a.log.Info(shared, "reason", "--run-private-tmp off")
		return nil, nil
	}
	p := &local.PrivateTmp{ShmSize: a.o.RunShmSize, Keep: []string{a.o.StateDir}}
	err := local.DetectPrivateTmp(*p, a.o.StateDir)
	switch {
	case err != nil && a.o.RunPrivateTmp == "required":
		return nil, fielderr.New(FieldRunPrivateTmp, "required", "%w; run the agent as root where mount namespaces are allowed, or make the {run private tmp} auto", err)
	case err != nil:
		a.log.Warn(shared, "reason", err)
		return nil, nil
	}
	a.log.Info("each run gets a /tmp, /var/tmp and /dev/shm of its own", "how", p.String())
	return p, nil
}

// runCgroups finds where runs' cgroups go (--run-cgroup) and says in the
// log what keeps a run's processes from outliving it.
func (a *Agent) runCgroups() (*local.Cgroups, error) {
	var cg *local.Cgroups
	if a.o.RunCgroup != "off" {
		var err error
		cg, err = local.DetectCgroups(local.CgroupRoot, agentCgroupName(a.o.StateDir))
		switch {
		case err != nil && a.o.RunCgroup == "required":
			return nil, fielderr.New(FieldRunCgroup, "required", "%w; run the agent as root (under systemd with Delegate=yes on cgroup v2), or make the {run cgroup} auto with a {job uid range}", err)
		case err != nil:
			a.log.Info("runs get no cgroup of their own", "reason", err)
			cg = nil
		default:
			cg.PidsMax = a.o.RunPidsMax
			a.log.Info("each run gets a cgroup of its own, killed whole at its end", "where", cg.String())
			if err := cg.Reap(); err != nil {
				a.log.Error("killing what runs of an earlier agent process left", "err", err)
			}
		}
	}
	// A cluster run's processes are jobs on the cluster's nodes, ended
	// by its backend (Slurm: the range's Guard): here a process of the
	// range's uids is none of this agent's (a login node that is a
	// compute node too runs the jobs of the agent's live runs, which a
	// restarted agent follows on).
	if r := a.o.runAsRange; r != nil && a.o.standsFor == nil {
		if err := r.Reap(a.o.RunKillTimeout); err != nil {
			a.log.Error("killing what runs of an earlier agent process left; their uids are not handed out", "err", err)
		}
	}
	if cg == nil && a.o.runAsRange == nil {
		a.log.Warn("nothing holds all of a run's processes (no cgroup, no --run-as-range): one that leaves its process group (setsid) can outlive its run and reach the next; use --run-as-range")
	}
	return cg, nil
}

// agentCgroupName names this agent's runs' cgroups after its state dir:
// two agents on one node (tests, or a login node with several) never reap
// each other's runs.
func agentCgroupName(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return "agent-" + hex.EncodeToString(sum[:6])
}

// cudaHome is the root of the nvcc the suite verified (…/bin/nvcc ->
// …). A simulated toolkit has no files, so none is exported for it.
func (a *Agent) cudaHome() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastFacs == nil || !a.lastFacs.NVCC.Found || a.lastFacs.NVCC.Simulated || a.lastFacs.NVCC.Path == "" {
		return ""
	}
	return filepath.Dir(filepath.Dir(a.lastFacs.NVCC.Path))
}
