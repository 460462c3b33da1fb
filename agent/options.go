package agent

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Options configure the agent. internal/command/agent binds them to
// flags (--broker-url, --broker-token, ...), named in the errors below.
type Options struct {
	BrokerURL string
	Token     string
	// TLSCA is a PEM bundle of CAs trusted for an https broker URL, in
	// addition to the system roots (a private CA or a self-signed broker).
	TLSCA     string
	StateDir  string
	QueryAddr string
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

	StoragePath   string
	Python        string
	NVCC          string
	Simulate      string
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
	runAsRange *executor.UIDRange
	// RunCgroup is auto, required or off: whether each run gets a
	// cgroup that all its processes stay in.
	RunCgroup string
	// RunPidsMax bounds a run's processes and threads (pids.max); 0 for
	// no bound.
	RunPidsMax int64
	// RunKillTimeout bounds the wait for a run's processes to be gone
	// after SIGKILL at its end.
	RunKillTimeout time.Duration
	// Registry is how wheel bundles are pulled (bundleinstall.go).
	Registry RegistryFlags
	// RunLogLinesPerSecond and RunLogMaxMB bound each run's output
	// (executor.OutputLimits); -1 turns one off.
	RunLogLinesPerSecond int
	RunLogMaxMB          int
	// Executor is where runs go: local (processes on this node) or
	// slurm (batch jobs on a cluster's compute nodes; agent/slurm.go).
	Executor      string
	Slurm         SlurmFlags
	SlurmSimulate []string
	// slurm, set by RunSlurm, makes this agent stand for one compute node.
	slurm *slurmNode
}

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid

var storageClasses = []string{"standard", "high-iops-nvme", "ultra-nvme"}

// Validate checks the options and fills defaults.
func (o *Options) Validate(daemon bool) error {
	if daemon {
		if o.BrokerURL == "" {
			return fmt.Errorf("--broker-url is required (or GPUPASS_BROKER_URL)")
		}
		if o.Token == "" {
			return fmt.Errorf("--broker-token is required (or GPUPASS_BROKER_TOKEN, GPUPASS_BROKER_TOKEN_FILE): the agent token from gpupass-broker token create --role agent")
		}
		if strings.TrimSpace(o.Region) == "" {
			return fmt.Errorf("--region is required, e.g. --region us-west-2")
		}
	}
	ok := false
	for _, c := range storageClasses {
		ok = ok || c == o.StorageClass
	}
	if !ok {
		return fmt.Errorf("--storage-class %q: use one of %s", o.StorageClass, strings.Join(storageClasses, ", "))
	}
	if o.PricePerHour < 0 || o.BandwidthGbps < 0 {
		return fmt.Errorf("--price-per-hour and --bandwidth-gbps must not be negative")
	}
	if o.SuiteInterval < time.Second {
		return fmt.Errorf("--suite-interval %s: must be at least 1s", o.SuiteInterval)
	}
	if o.RunLogLinesPerSecond < -1 || o.RunLogMaxMB < -1 {
		return fmt.Errorf("--run-log-lines-per-second %d, --run-log-max-mb %d: each must be 1 or more (-1: no limit)", o.RunLogLinesPerSecond, o.RunLogMaxMB)
	}
	if o.KeepRuns < 0 {
		return fmt.Errorf("--keep-runs %d: must be 0 (keep all) or more", o.KeepRuns)
	}
	if o.ReadProbeMB < 0 || o.ReadProbeMB > 4096 {
		return fmt.Errorf("--read-probe-mb %d: must be between 0 and 4096", o.ReadProbeMB)
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
			return fmt.Errorf("--run-as %s: starting jobs as another user needs the agent to run as root (it runs as uid %d); run the agent as root, or drop --run-as", o.RunAs, euid)
		}
		o.runAs = r
	}
	if o.RunAsRange != "" {
		if o.RunAs != "" {
			return fmt.Errorf("--run-as %s and --run-as-range %s: give one (--run-as-range gives each run a uid of its own)", o.RunAs, o.RunAsRange)
		}
		r, err := executor.ParseUIDRange(o.RunAsRange)
		if err != nil {
			return err
		}
		if euid := geteuid(); euid != 0 {
			return fmt.Errorf("--run-as-range %s: starting jobs as other users needs the agent to run as root (it runs as uid %d); run the agent as root, or drop --run-as-range", o.RunAsRange, euid)
		}
		o.runAsRange = r
	}
	switch o.RunCgroup {
	case "":
		o.RunCgroup = "auto"
	case "auto", "required", "off":
	default:
		return fmt.Errorf("--run-cgroup %q: use auto, required or off", o.RunCgroup)
	}
	if o.RunPidsMax < 0 {
		return fmt.Errorf("--run-pids-max %d: must be 0 (no limit) or more", o.RunPidsMax)
	}
	if o.RunKillTimeout == 0 {
		o.RunKillTimeout = executor.DefaultKillTimeout
	}
	if o.RunKillTimeout < time.Second {
		return fmt.Errorf("--run-kill-timeout %s: must be at least 1s", o.RunKillTimeout)
	}
	if o.Hostname == "" {
		o.Hostname, _ = os.Hostname()
	}
	return nil
}

// jobUser is the user jobs run as (a sample of --run-as-range's uids)
// and the flag that set it; nil when jobs run as the agent's own user.
func (o *Options) jobUser() (*executor.RunAs, string) {
	switch {
	case o.runAs != nil:
		return o.runAs, "--run-as"
	case o.runAsRange != nil:
		return o.runAsRange.Sample(), "--run-as-range"
	}
	return nil, ""
}

func (o *Options) labels() *gpupassv1.NodeLabels {
	return &gpupassv1.NodeLabels{
		Provider: o.Provider, Region: o.Region, Zone: o.Zone, PricePerHour: o.PricePerHour,
		StorageClass: o.StorageClass, BandwidthGbps: o.BandwidthGbps, Hostname: o.Hostname,
	}
}

func (o *Options) node() conformance.Node {
	return conformance.Node{
		Provider: o.Provider, Region: o.Region, Zone: o.Zone, PricePerHour: o.PricePerHour,
		BandwidthGbps: o.BandwidthGbps, Hostname: o.Hostname,
	}
}

// outputLimits turns the --run-log-* flags into the executor's limits;
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
