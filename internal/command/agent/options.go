package agent

import (
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/registryflags"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Secrets are marked once: roots are built concurrently in tests, and
// each flag reads GPUPASS_<FLAG>_FILE too. Alias marks --token.
func init() {
	flagenv.MarkSecret("broker-token")
}

// AddFlags registers the daemon's flags.
func addFlags(cmd *cobra.Command, o *daemon.Options, reg *registryflags.Flags, bs []daemon.Backend) {
	f := cmd.Flags()
	flagenv.ListVar(f, &o.BrokerURL, "broker-url", "broker URL, http://HOST:PORT or https://HOST:PORT (required); repeat it or give a comma-separated list for several replicas of one broker: the agent moves to the next when one stops answering")
	f.StringVar(&o.Token, "broker-token", "", "agent token the broker gave this node (gpupass-broker token create --role agent); secret: prefer GPUPASS_BROKER_TOKEN_FILE")
	// The CLI's name for a broker token; --token (and GPUPASS_TOKEN,
	// GPUPASS_TOKEN_FILE) is what agents were started with before.
	flagenv.Alias(f, "broker-token", "token")
	f.StringVar(&o.TLSCA, "tls-ca", "", "PEM file of CA certificates to trust for an https broker URL (besides the system roots)")
	f.BoolVar(&o.InsecureHTTP, "insecure-http", false, "send the broker token over plain http:// to a broker that is not on loopback (refused without it: anyone on the path could read the token); warned of at every start")
	f.StringVar(&o.StateDir, "state-dir", "/var/lib/gpupass-agent", "directory for the identity key (0600), agent id and last signed report")
	f.StringVar(&o.QueryAddr, "query-addr", "127.0.0.1:7465", "local query endpoint (HTTP JSON); loopback unless you mean otherwise")
	f.StringVar(&o.AddrFile, "addr-file", "", "write the query endpoint URL to this file once listening")
	f.StringVar(&o.Provider, "provider", "", "label: provider (coreweave, lambda, aws, onprem, …)")
	f.StringVar(&o.Region, "region", "", "label: region, e.g. us-west-2 (required)")
	f.StringVar(&o.Zone, "zone", "", "label: zone")
	f.Float64Var(&o.PricePerHour, "price-per-hour", 0, "label: USD per hour for the whole node")
	f.StringVar(&o.StorageClass, "storage-class", "standard", "label: storage class: standard, high-iops-nvme or ultra-nvme")
	f.Float64Var(&o.BandwidthGbps, "bandwidth-gbps", 0, "label: network bandwidth in Gbit/s")
	f.StringVar(&o.Hostname, "hostname", "", "label: hostname (default: this machine's)")
	f.StringVar(&o.JobAddress, "job-address", "", "this node's address (IP or host name) that the other nodes of a run across several nodes reach its jobs at; with --job-ports the node takes ranks of such runs, rank 0 hosting the rendezvous (MASTER_ADDR) (local executor; a Kubernetes agent takes --job-ports alone, rank 0's pod IP being the address; a Slurm agent's nodes each advertise their NodeAddr)")
	f.StringVar(&o.JobPorts, "job-ports", "", "FIRST-LAST: the TCP ports a rank 0 on this node may be given as MASTER_PORT, e.g. 29500-29599 (with --job-address; alone with --executor kubernetes, or --executor slurm for every compute node, which then take ranks of a run across several nodes as one sbatch -N job); other jobs on the node can reach them too")
	f.StringVar(&o.StackDir, "stack-dir", "", "set by gpupass up: its state dir, under which an executor that stands for a cluster keeps each region's agent's work apart (and shares what they must)")
	addProbeFlags(cmd, o)
	f.BoolVar(&o.NoWork, "no-work", false, "do not take runs from the broker (enroll, heartbeat and report only)")
	f.StringVar(&o.RunAs, "run-as", "", "run jobs as this unprivileged USER, UID, USER:GROUP or UID:GID (the agent must run as root); without it jobs run as the agent's own user and can read its identity key")
	f.StringVar(&o.RunAsRange, "run-as-range", "", "run each job as a uid of its own from FIRST-LAST (recommended, e.g. 200000-200999: uids no user or other service has); the gid is the uid unless FIRST-LAST:GROUP names a group; every process of the uid is killed when the run ends, and a process left by one run cannot reach another (the agent must run as root; instead of --run-as); with --executor slurm each run's jobs are submitted as its uid (sbatch --uid) and are cancelled when it ends, and every uid of the range must be an account on the login node and every compute node")
	f.StringVar(&o.RunCgroup, "run-cgroup", "auto", "give each run a cgroup its processes cannot leave, killed whole at the run's end: auto (when the agent can make one: root, cgroup v2 delegated or v1 freezer), required (refuse to start without), off")
	f.StringVar(&o.RunPrivateTmp, "run-private-tmp", "auto", "give each run its own /tmp and /var/tmp (its TMPDIR) and /dev/shm (a tmpfs) in a mount namespace, so nothing a run leaves there reaches the next: auto (when the agent can: root, mount namespaces allowed; else what a run's uid adds to the node's is removed at its end), required (refuse to start without), off")
	f.StringVar(&o.RunShmSize, "run-shm-size", local.DefaultShmSize, "size of each run's own /dev/shm (tmpfs size=: bytes with k, m, g or t, or a percentage of RAM); what a run keeps there is RAM")
	f.Int64Var(&o.RunPidsMax, "run-pids-max", 0, "most processes and threads a run may have at once (its cgroup's pids.max; 0: no limit)")
	f.DurationVar(&o.RunKillTimeout, "run-kill-timeout", local.DefaultKillTimeout, "how long the agent waits for a run's processes to be gone after SIGKILL at its end; a run whose processes outlast it fails, and its uid is not reused")
	f.IntVar(&o.Workdir.MaxEntries, "workdir-max-entries", workdir.DefaultMaxEntries, "most files and directories a run's work dir archive may unpack to (keep it as the broker's --workdir-max-entries)")
	f.IntVar(&o.Workdir.MaxDepth, "workdir-max-depth", workdir.DefaultMaxDepth, "most directory levels in a run's work dir archive")
	f.Int64Var(&o.Workdir.MaxBytes, "workdir-max-bytes", workdir.DefaultMaxBytes, "most bytes a run's work dir archive may unpack to")
	f.IntVar(&o.Workdir.MaxPath, "workdir-max-path", workdir.DefaultMaxPath, "longest entry name (bytes) in a run's work dir archive")
	f.IntVar(&o.KeepRuns, "keep-runs", 3, "work dirs (files, checkpoints) of the newest runs kept under the state dir, the starting run's included; older ones are deleted as a run starts (0 keeps them all)")
	f.IntVar(&o.RunLogLinesPerSecond, "run-log-lines-per-second", executor.DefaultLinesPerSecond, "lines a run may print per second (stdout and stderr together); the rest are dropped and a WARN event counts them (-1: no limit)")
	f.IntVar(&o.RunLogMaxMB, "run-log-max-mb", executor.DefaultMaxLogBytes>>20, "MB of log a run's output may add in all; further output is dropped after an ERROR event, and the run goes on (-1: no limit); keep it below the broker's --run-max-log-mb")
	f.DurationVar(&o.SuiteInterval, "suite-interval", 10*time.Minute, "how often the conformance suite runs again")
	addRegistryFlags(cmd, reg, o)
	addExecutorFlags(cmd, o, bs)
}

func addProbeFlags(cmd *cobra.Command, o *daemon.Options) {
	f := cmd.Flags()
	f.StringVar(&o.StoragePath, "storage-path", "", "work path whose storage is probed (default: the state dir)")
	f.StringVar(&o.Python, "python", "python3", "Python interpreter of the jobs")
	f.StringVar(&o.NVCC, "nvcc", "", "nvcc to probe (default: on PATH, then /usr/local/cuda/bin)")
	f.StringVar(&o.Simulate, "simulate", "", "simulated hardware profile: a built-in name (h100-sxm5-8x, a100-80gb-4x, rtx-4090-1x) or PROFILE.json")
	f.IntVar(&o.ReadProbeMB, "read-probe-mb", 64, "size of the sequential read-throughput probe in MiB")
}

// addRegistryFlags registers the registry flags gpupass registers too
// (registryflags.Flags: --plain-http, --registry-username, ...) and the
// agent's --verify-record; bindRegistry hands their values to the daemon.
func addRegistryFlags(cmd *cobra.Command, r *registryflags.Flags, o *daemon.Options) {
	f := cmd.Flags()
	r.AddFlags(f)
	f.BoolVar(&o.VerifyRecord, "verify-record", false, "re-check every pulled wheel's zip and RECORD hashes, as push did (always done for bundles without a gpupass lock layer)")
}

func bindRegistry(r *registryflags.Flags, o *daemon.Options) {
	o.Registry = r.Options(buildinfo.UserAgent("gpupass-agent"))
}
