package agent

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/probe"
)

// Backend is an executor, where runs go (--executor NAME): the local
// node's processes, a Slurm cluster's batch jobs, a Kubernetes cluster's
// Jobs. Each lives in a package of its own (agent/executor/NAME), owns
// its flags and is listed once where the binary is wired
// (internal/command/agent); the agent itself never names one. Backends
// import this package, never the other way round, so a build leaves out
// a backend (and what it links, client-go for Kubernetes) by not listing
// it.
type Backend interface {
	// Name is the --executor value.
	Name() string
	// Usage is its part of --executor's help: what runs become.
	Usage() string
	// AddFlags registers the backend's own flags, bound to its own
	// settings; each also reads GPUPASS_<FLAG>, as every flag does.
	AddFlags(f FlagSet)
	// FlagNames maps the Field of each *fielderr.Error the backend
	// returns to the flag that sets it.
	FlagNames() map[string]string
	// Serve runs the agent (or, for a cluster, one agent per node it
	// stands for) with o, validated, until ctx ends.
	Serve(ctx context.Context, o *Options, log *slog.Logger) error
}

// FlagSet is where a backend registers its flags: a *pflag.FlagSet,
// which the command layer (internal/command/agent) hands it; the daemon
// itself links no flag package (internal/depcheck).
type FlagSet interface {
	StringVar(p *string, name, value, usage string)
	StringSliceVar(p *[]string, name string, value []string, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
	IntVar(p *int, name string, value int, usage string)
	DurationVar(p *time.Duration, name string, value time.Duration, usage string)
}

// About is a backend's Name and Usage.
type About struct {
	// Executor is the --executor value, Help its part of the help.
	Executor, Help string
}

// Spec is an executor whose settings are a value of S: its package gives
// the settings and what it does with them, Define the Backend around
// them (the shape every executor would otherwise write again).
type Spec[S any] struct {
	About
	// Bind registers the backend's flags, bound to s (nil: none).
	Bind func(f FlagSet, s *S)
	// Fields is Backend.FlagNames.
	Fields map[string]string
	// Root, when set, is why job users need root there (RootReasoner).
	Root string
	// Stack, when set, places one region's agent of a gpupass up stack
	// (Regional.InStack).
	Stack func(s *S, stackDir, region string) error
	// StandsFor, when set, is what one agent stands for ("every compute
	// node"): a gpupass up stack starts one agent per region, since two
	// would enroll each node twice (Regional.StandsFor).
	StandsFor string
	// StackFlags are flag values (name without --: value) that a gpupass
	// up stack's agents get unless the user sets the flag: what suits a
	// cluster beside this machine rather than a site's service
	// (Regional.StackFlags).
	StackFlags map[string]string
	// PodJobs says the jobs run in pods (PodRendezvous).
	PodJobs bool
	// Run is Backend.Serve, with the settings.
	Run func(ctx context.Context, o *Options, s *S, log *slog.Logger) error
}

// Define is the Backend of spec, with settings of its own: the command
// layer calls an executor's constructor once per command tree, so trees
// built side by side (tests) share none.
func Define[S any](spec Spec[S]) Backend { return &defined[S]{spec: spec} }

type defined[S any] struct {
	spec     Spec[S]
	settings S
}

func (d *defined[S]) Name() string                 { return d.spec.Executor }
func (d *defined[S]) Usage() string                { return d.spec.Help }
func (d *defined[S]) FlagNames() map[string]string { return d.spec.Fields }
func (d *defined[S]) RootReason() string           { return d.spec.Root }

func (d *defined[S]) AddFlags(f FlagSet) {
	if d.spec.Bind != nil {
		d.spec.Bind(f, &d.settings)
	}
}

func (d *defined[S]) StandsFor() string             { return d.spec.StandsFor }
func (d *defined[S]) StackFlags() map[string]string { return d.spec.StackFlags }
func (d *defined[S]) PodJobs() bool                 { return d.spec.PodJobs }

func (d *defined[S]) InStack(stackDir, region string) error {
	if d.spec.Stack == nil {
		return nil
	}
	return d.spec.Stack(&d.settings, stackDir, region)
}

func (d *defined[S]) Serve(ctx context.Context, o *Options, log *slog.Logger) error {
	return d.spec.Run(ctx, o, &d.settings, log)
}

// Regional is a Backend that `gpupass up` starts once in each region of
// one local stack (gpupass-agent --stack-dir): InStack moves what the
// regions' agents must not share (a work dir in the shared dir) into a
// place of the region's own, and points what they must share (Slurm's
// ledger: they submit as one account) into the stack's dir. It runs
// before Serve, on the backend's own settings; up and its use case
// (internal/app/localstack) never name an executor.
//
// gpupass does not link the backends: what it needs of them (their flags,
// StandsFor, StackFlags) reaches it as data that gpupass-docs writes
// (internal/command/executorflags), and it hands the flags the user set
// to the agents, whose backend checks them (InStack, Serve).
type Regional interface {
	InStack(stackDir, region string) error
	// StandsFor is what one agent stands for; "" when a region may have
	// several agents (the local executor).
	StandsFor() string
	// StackFlags are the stack's defaults for the backend's flags.
	StackFlags() map[string]string
}

// InRegion is dir's part for one region's agent of a gpupass up stack,
// where a Regional backend keeps that agent's work; "" stays "" (the
// backend's own check names the missing flag).
func InRegion(dir, region string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "up-"+region)
}

// RootReasoner is a Backend that says why starting jobs as other users
// needs the agent to run as root there (Options.RootReason).
type RootReasoner interface {
	RootReason() string
}

// PodRendezvous is a Backend whose jobs run in pods, each with an IP of
// its own: its nodes take gang ranks with --job-ports alone, and its
// runner puts rank 0's pod IP in the rendezvous (Options.PodJobs).
type PodRendezvous interface {
	PodJobs() bool
}

// Node is a broker node that a cluster backend stands for: measured
// through the cluster and running its runs there. An agent without one
// (Options.StandFor not called) is this machine, running runs as local
// processes.
type Node interface {
	// Suite is the node's conformance suite (RemoteSuite).
	Suite(o *Options) *suite.Suite
	// Checks are the backend's checks every report of the node carries,
	// given what the suite measured: first go before the suite's checks
	// (where and how the node was measured is the cause when the rest
	// fail, and the broker keeps only the first few failed checks), last
	// after them.
	Checks(f *probe.Facts) (first, last []conformance.Check)
	// Runner runs the node's attempts. Its jobs outlive the agent: a
	// restarted agent follows them on from the spool's mark.
	Runner() executor.Runner
	// WorkRoot holds the node's runs' work dirs (a dir the cluster's
	// nodes see) instead of --state-dir/runs.
	WorkRoot() string
	// Orphaned stops what a run left running when the agent died under
	// it and cannot follow it on, and returns the run's reason.
	Orphaned(ctx context.Context, allocID string) string
	// Placement is where the run's batch job is, nil when not known.
	Placement(allocID string) *SlurmPlacement
	// JobDir, when not "", is the dir a job user must reach to get to
	// its run's work dir, instead of the state dir.
	JobDir() string
}

// StandFor makes an agent built from o stand for n (ClusterAgents.Start
// does it for each node of a cluster).
func (o *Options) StandFor(n Node) { o.standsFor = n }

// JobUser is the user jobs run as (--run-as), nil for the agent's own.
func (o *Options) JobUser() *executor.RunAs { return o.runAs }

// JobUIDRange hands out a uid of its own to each run (--run-as-range);
// nil without one.
func (o *Options) JobUIDRange() *local.UIDRange { return o.runAsRange }

// ExecutorLocal is --executor local: the runs are processes on this
// machine, which is the node.
const ExecutorLocal = "local"

// ExecutorSlurm is --executor slurm (package executor/slurm registers
// it): named here for the options that differ on a Slurm cluster.
const ExecutorSlurm = "slurm"

// LocalBackend is the local executor: this machine is the node.
func LocalBackend() Backend {
	return Define(Spec[struct{}]{About: About{Executor: ExecutorLocal, Help: "processes on this node"},
		Run: func(ctx context.Context, o *Options, _ *struct{}, log *slog.Logger) error {
			a, err := New(o, log)
			if err != nil {
				return err
			}
			return a.Run(ctx)
		}})
}
