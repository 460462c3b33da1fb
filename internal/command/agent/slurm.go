package agent

import (
	"encoding/json"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/agent"
)

// addExecutorFlags registers --executor and the --slurm-* flags
// (agent/slurm.go holds what they do).
func addExecutorFlags(cmd *cobra.Command, o *daemon.Options) {
	f := cmd.Flags()
	f.StringVar(&o.Executor, "executor", daemon.ExecutorLocal, "where runs go: local (processes on this node) slurm (batch jobs on a Slurm cluster's compute nodes, each enrolled as a node of its own; see --slurm-*) or kubernetes (Jobs on a cluster's GPU nodes, each enrolled as a node of its own; see --kube-*)")
	f.StringSliceVar(&o.SlurmSimulate, "slurm-simulate", nil, "with --executor slurm: NODE=PROFILE, a simulated hardware profile for one compute node (repeatable; --simulate applies to the others)")
	s := &o.Slurm
	f.StringSliceVar(&s.Partitions, "slurm-partition", nil, "with --executor slurm: partition whose compute nodes the agent enrolls (repeatable; default: every partition)")
	f.StringVar(&s.SharedDir, "slurm-shared-dir", "", "with --executor slurm: directory the login node and every compute node see (runs' work dirs, output and metrics files)")
	f.DurationVar(&s.TimeLimit, "slurm-time-limit", 0, "with --executor slurm: sbatch --time of each run's job, rounded up to minutes (0: the partition's limit)")
	f.DurationVar(&s.Refresh, "slurm-refresh", 30*time.Second, "with --executor slurm: how often node states are read from Slurm (a drained node stops being certified within one)")
	f.StringVar(&s.LedgerDir, "slurm-ledger-dir", "", "with --executor slurm: directory on the login node, which no compute node mounts, where the agent records each job it submits; every other job of its account is cancelled, so agents sharing one account must share it (default: --state-dir/slurm/ledger)")
	f.StringVar(&s.AgentBinary, "slurm-agent-binary", "", "with --executor slurm: gpupass-agent binary the conformance job step runs on each compute node (default: this one; it must be at the same path there)")
}

// factsCommand is `gpupass-agent facts`: the probes of the suite, run on
// a compute node as a job step, printing what they found as JSON for
// the agent on the login node, which checks and signs it. It holds no
// key: the compute node's identity stays with the agent.
func factsCommand() *cobra.Command {
	o := &daemon.Options{SuiteInterval: time.Hour, StorageClass: "standard"}
	cmd := &cobra.Command{
		Use:    "facts",
		Short:  "Measure the node and print the facts as JSON (the Slurm executor's conformance job step)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(false); err != nil {
				return err
			}
			a, err := daemon.New(o, slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			f, err := a.Facts(cmd.Context())
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(f)
		},
	}
	addProbeFlags(cmd, o)
	cmd.Flags().StringVar(&o.StateDir, "state-dir", "", "directory for the throwaway key that seeds a simulated profile")
	return cmd
}
