package agent

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Options configure the agent. internal/command/agent binds them to
// flags; Validate's errors are *fielderr.Error with the Field* names below,
// which the command layer renames to its flags.
type Options struct {
	BrokerURL string
	Token     string
	// TLSCA is a PEM bundle of CAs trusted for an https broker URL, in
	// addition to the system roots (a private CA or a self-signed broker).
	TLSCA string
	// InsecureHTTP lets the token go over plain http:// to a broker that
	// is not on loopback (client.Options.InsecureHTTP); Run warns of it.
	InsecureHTTP bool
	StateDir     string
	QueryAddr    string
	// AddrFile, when set, receives the query endpoint's URL once it
	// listens (useful with --query-addr 127.0.0.1:0).
	AddrFile string

	Provider      string
	Region        string
	Zone          string
	PricePerHour  float64
	StorageClass  string
	BandwidthGbps float64
	Hostname      string
	// JobAddress and JobPorts (FIRST-LAST) are where the other nodes of
	// a gang reach this node's jobs: a run across several nodes has its
	// rendezvous (MASTER_ADDR, MASTER_PORT) on rank 0's node, at this
	// address and a port of this range. Without them the node takes no
	// gang rank. jobPortMin..jobPortMax is JobPorts parsed by Validate.
	JobAddress string
	JobPorts   string
	jobPortMin int
	jobPortMax int

	StoragePath string
	Python      string
	NVCC        string
	Simulate    string
	// StackDir, set by gpupass up, is the state dir of the local stack
	// this agent is one region's agent of (Regional).
	StackDir      string
	SuiteInterval time.Duration
	ReadProbeMB   int
	// NoWork keeps the agent from taking runs (registry and reports only).
	NoWork bool
	// KeepRuns is how many runs' work dirs stay on the node (RunLoop).
	KeepRuns int
	// Workdir bounds a run's work dir archive on unpack (RunLoop).
	Workdir workdir.Limits
	// RunAs is --run-as as given; runAs is what Validate resolved it to.
	RunAs string
	runAs *executor.RunAs
	// RunAsRange is --run-as-range as given; runAsRange hands out its
	// uids, one per run.
	RunAsRange string
	runAsRange *local.UIDRange
	// RunCgroup is auto, required or off: whether each run gets a
	// cgroup that all its processes stay in.
	RunCgroup string
	// RunPrivateTmp is auto, required or off: whether each run of the
	// local executor gets a /tmp, /var/tmp and /dev/shm of its own (a
	// mount namespace).
	RunPrivateTmp string
	// RunShmSize is the size= of a run's own /dev/shm tmpfs.
	RunShmSize string
	// RunPidsMax bounds a run's processes and threads (pids.max); 0 for
	// no bound.
	RunPidsMax int64
	// RunKillTimeout bounds the wait for a run's processes to be gone
	// after SIGKILL at its end.
	RunKillTimeout time.Duration
	// Registry is how wheel bundles are pulled (bundleinstall.go).
	Registry bundle.RegistryOptions
	// VerifyRecord re-checks every pulled wheel's zip and RECORD hashes,
	// as push did (always done for bundles without a gpupass lock layer).
	VerifyRecord bool
	// RunLogLinesPerSecond and RunLogMaxMB bound each run's output
	// (executor.OutputLimits); -1 turns one off.
	RunLogLinesPerSecond int
	RunLogMaxMB          int
	// Executor is where runs go: the Name of a Backend (--executor).
	Executor string
	// RootReason, set from the executor's Backend (RootReasoner), says
	// in Validate's errors why job users need the agent to run as root.
	RootReason string
	// PodJobs, set from the executor's Backend (PodRendezvous), says its
	// jobs run in pods with IPs of their own: the node takes gang ranks
	// with --job-ports alone, advertising rendezvous.PodAddress.
	PodJobs bool
	// standsFor, set by StandFor, makes this agent stand for one node of a
	// cluster; nil: this machine is the node.
	standsFor Node
}

// Fields of the errors Validate returns, in the agent's terms (with
// executor.FieldRunAs and executor.FieldUIDRange).
const (
	FieldBrokerURL      = "broker URL"
	FieldStateDir       = "state dir"
	FieldBrokerToken    = "broker token"
	FieldRegion         = "region"
	FieldStorageClass   = "storage class"
	FieldPricePerHour   = "price per hour"
	FieldBandwidth      = "bandwidth"
	FieldJobAddress     = "job address"
	FieldJobPorts       = "job ports"
	FieldSuiteInterval  = "suite interval"
	FieldRunLogLines    = "run log lines per second"
	FieldRunLogMB       = "run log MB"
	FieldKeepRuns       = "kept runs"
	FieldReadProbeMB    = "read probe MiB"
	FieldRunCgroup      = "run cgroup"
	FieldRunPidsMax     = "run pids max"
	FieldRunPrivateTmp  = "run private tmp"
	FieldRunShmSize     = "run shm size"
	FieldRunKillTimeout = "run kill timeout"
	FieldExecutor       = "executor"
)

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid

var storageClasses = []string{"standard", "high-iops-nvme", "ultra-nvme"}

// Validate checks the options and fills defaults.
func (o *Options) Validate(daemon bool) error {
	if daemon {
		if o.BrokerURL == "" {
			return &fielderr.Error{Field: FieldBrokerURL, Problem: "is required"}
		}
		if o.Token == "" {
			return &fielderr.Error{Field: FieldBrokerToken, Problem: "is required: the agent token from gpupass-broker token create --role agent"}
		}
		if strings.TrimSpace(o.Region) == "" {
			return &fielderr.Error{Field: FieldRegion, Problem: "is required, e.g. us-west-2"}
		}
	}
	ok := false
	for _, c := range storageClasses {
		ok = ok || c == o.StorageClass
	}
	if !ok {
		return fielderr.New(FieldStorageClass, o.StorageClass, "use one of %s", strings.Join(storageClasses, ", "))
	}
	if o.PricePerHour < 0 {
		return fielderr.New(FieldPricePerHour, fmt.Sprint(o.PricePerHour), "must not be negative")
	}
	if o.BandwidthGbps < 0 {
		return fielderr.New(FieldBandwidth, fmt.Sprint(o.BandwidthGbps), "must not be negative")
	}
	if err := o.validateJobPorts(); err != nil {
		return err
	}
	if o.SuiteInterval < time.Second {
		return fielderr.New(FieldSuiteInterval, o.SuiteInterval.String(), "must be at least 1s")
	}
	if o.RunLogLinesPerSecond < -1 {
		return fielderr.New(FieldRunLogLines, fmt.Sprint(o.RunLogLinesPerSecond), "must be 1 or more (-1: no limit)")
	}
	if o.RunLogMaxMB < -1 {
		return fielderr.New(FieldRunLogMB, fmt.Sprint(o.RunLogMaxMB), "must be 1 or more (-1: no limit)")
	}
	if o.KeepRuns < 0 {
		return fielderr.New(FieldKeepRuns, fmt.Sprint(o.KeepRuns), "must be 0 (keep all) or more")
	}
	if o.ReadProbeMB < 0 || o.ReadProbeMB > 4096 {
		return fielderr.New(FieldReadProbeMB, fmt.Sprint(o.ReadProbeMB), "must be between 0 and 4096")
	}
	if err := o.Registry.Validate(); err != nil {
		return err
	}
	if o.RunAs != "" {
		r, err := executor.LookupRunAs(o.RunAs)
		if err != nil {
			return err
		}
		if euid := geteuid(); euid != 0 {
			return fielderr.New(executor.FieldRunAs, o.RunAs, "starting jobs as another user needs the agent to run as root (it runs as uid %d)%s; run the agent as root, or drop the {job user}", euid, o.rootWhy())
		}
		o.runAs = r
	}
	if o.RunAsRange != "" {
		if o.RunAs != "" {
			return fielderr.New(executor.FieldRunAs, o.RunAs, "and {job uid range} %q exclude each other: give one (the {job uid range} gives each run a uid of its own)", o.RunAsRange)
		}
		r, err := local.ParseUIDRange(o.RunAsRange)
		if err != nil {
			return err
		}
		if euid := geteuid(); euid != 0 {
			return fielderr.New(executor.FieldUIDRange, o.RunAsRange, "starting jobs as other users needs the agent to run as root (it runs as uid %d)%s; run the agent as root, or drop the {job uid range}", euid, o.rootWhy())
		}
		o.runAsRange = r
	}
	if err := checkMode(FieldRunCgroup, &o.RunCgroup); err != nil {
		return err
	}
	if err := checkMode(FieldRunPrivateTmp, &o.RunPrivateTmp); err != nil {
		return err
	}
	if o.RunShmSize == "" {
		o.RunShmSize = local.DefaultShmSize
	}
	if err := local.CheckShmSize(o.RunShmSize); err != nil {
		return fielderr.New(FieldRunShmSize, o.RunShmSize, "%v", err)
	}
	if o.RunPidsMax < 0 {
		return fielderr.New(FieldRunPidsMax, fmt.Sprint(o.RunPidsMax), "must be 0 (no limit) or more")
	}
	if o.RunKillTimeout == 0 {
		o.RunKillTimeout = local.DefaultKillTimeout
	}
	if o.RunKillTimeout < time.Second {
		return fielderr.New(FieldRunKillTimeout, o.RunKillTimeout.String(), "must be at least 1s")
	}
	if o.Hostname == "" {
		o.Hostname, _ = os.Hostname()
	}
	return nil
}

// validateJobPorts checks the job address and ports: both or neither
// for the local executor, whose jobs are processes of this machine; the
// ports alone for an executor whose jobs run in pods (PodJobs), where
// rank 0's pod IP is the address, known only once the pod is; the ports
// alone for the Slurm executor, whose gang is one batch job and whose
// nodes each advertise their Slurm NodeAddr (ClusterAgents.StartAt).
func (o *Options) validateJobPorts() error {
	o.JobAddress, o.JobPorts = strings.TrimSpace(o.JobAddress), strings.TrimSpace(o.JobPorts)
	if o.JobAddress == "" && o.JobPorts == "" {
		return nil
	}
	slurm := o.Executor == ExecutorSlurm
	if o.JobPorts == "" {
		return fielderr.New(FieldJobPorts, "", "is required with a job address: the ports jobs of a gang may listen on here, e.g. 29500-29599")
	}
	switch {
	case o.PodJobs:
		if o.JobAddress != "" {
			return fielderr.New(FieldJobAddress, o.JobAddress, "the %s executor's jobs are reached at rank 0's pod IP: leave it out (--job-ports alone)", o.Executor)
		}
		o.JobAddress = rendezvous.PodAddress
	case slurm:
		if o.JobAddress != "" {
			return fielderr.New(FieldJobAddress, o.JobAddress, "is each compute node's own with the %s executor (its NodeAddr in scontrol show node): leave it out", ExecutorSlurm)
		}
	case o.Executor != "" && o.Executor != ExecutorLocal:
		return fielderr.New(FieldJobPorts, o.JobPorts, "only the %s, %s and kubernetes executors take ranks of a run across several nodes (this agent's is %s): leave it out", ExecutorLocal, ExecutorSlurm, o.Executor)
	case o.JobAddress == "":
		return fielderr.New(FieldJobAddress, "", "is required with job ports: this node's address the other nodes of a gang reach, e.g. 10.0.0.7")
	}
	if !slurm {
		if err := rendezvous.CheckAddr(o.JobAddress); err != nil {
			return fielderr.New(FieldJobAddress, o.JobAddress, "%v", err)
		}
	}
	lo, hi, err := rendezvous.ParseJobPorts(o.JobPorts)
	if err != nil {
		return fielderr.New(FieldJobPorts, o.JobPorts, "%v", err)
	}
	o.jobPortMin, o.jobPortMax = lo, hi
	return nil
}

// rootWhy is " " and RootReason, when the executor gave one.
func (o *Options) rootWhy() string {
	if o.RootReason == "" {
		return ""
	}
	return " " + o.RootReason
}

// jobUser is the user jobs run as (a sample of the job uid range) and
// the field that set it; nil when jobs run as the agent's own user.
func (o *Options) jobUser() (*executor.RunAs, string) {
	switch {
	case o.runAs != nil:
		return o.runAs, executor.FieldRunAs
	case o.runAsRange != nil:
		return o.runAsRange.Sample(), executor.FieldUIDRange
	}
	return nil, ""
}

func (o *Options) labels() *gpupassv1.NodeLabels {
	return &gpupassv1.NodeLabels{
		Provider: o.Provider, Region: o.Region, Zone: o.Zone, PricePerHour: o.PricePerHour,
		StorageClass: o.StorageClass, BandwidthGbps: o.BandwidthGbps, Hostname: o.Hostname,
		JobAddress: o.JobAddress, JobPortMin: int32(o.jobPortMin), JobPortMax: int32(o.jobPortMax),
	}
}

func (o *Options) node() conformance.Node {
	return conformance.Node{
		Provider: o.Provider, Region: o.Region, Zone: o.Zone, PricePerHour: o.PricePerHour,
		BandwidthGbps: o.BandwidthGbps, Hostname: o.Hostname,
	}
}

// outputLimits turns the run log settings into the executor's limits;
// unset (0, as in Options built by tests) takes the defaults.
func (o *Options) outputLimits() executor.OutputLimits {
	l := executor.OutputLimits{LinesPerSecond: o.RunLogLinesPerSecond, MaxBytes: int64(o.RunLogMaxMB) << 20}
	if o.RunLogLinesPerSecond == 0 {
		l.LinesPerSecond = executor.DefaultLinesPerSecond
	}
	switch {
	case o.RunLogMaxMB < 0:
		l.MaxBytes = -1
	case o.RunLogMaxMB == 0:
		l.MaxBytes = executor.DefaultMaxLogBytes
	}
	return l
}

// checkMode checks an auto, required or off setting (a run's cgroup, its
// private /tmp), auto when unset.
func checkMode(field string, mode *string) error {
	switch *mode {
	case "":
		*mode = "auto"
	case "auto", "required", "off":
	default:
		return fielderr.New(field, *mode, "use auto, required or off")
	}
	return nil
}
