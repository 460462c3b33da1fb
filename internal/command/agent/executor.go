package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// addExecutorFlags registers --executor and each backend's own flags.
func addExecutorFlags(cmd *cobra.Command, o *daemon.Options, bs []daemon.Backend) {
	f := cmd.Flags()
	var kinds []string
	for _, b := range bs {
		kinds = append(kinds, b.Name()+" ("+b.Usage()+")")
		b.AddFlags(f)
	}
	f.StringVar(&o.Executor, "executor", daemon.ExecutorLocal, "where runs go: "+strings.Join(kinds, ", "))
}

// backendFor is the backend --executor names.
func backendFor(bs []daemon.Backend, name string) (daemon.Backend, error) {
	var names []string
	for _, b := range bs {
		if b.Name() == name {
			return b, nil
		}
		names = append(names, b.Name())
	}
	why := ""
	if m := missingBackends[name]; m != "" {
		why = " (" + m + ")"
	}
	return nil, fielderr.New(daemon.FieldExecutor, name, "unknown executor%s: use one of %s", why, strings.Join(names, ", "))
}

// executorsCommand is `gpupass-agent executors`: the --executor values
// this build has, one a line. gpupass up asks the agent it starts, so an
// executor added to the agent is one up takes too.
func executorsCommand(bs []daemon.Backend) *cobra.Command {
	return &cobra.Command{
		Use:   "executors",
		Short: "List the executors this gpupass-agent has (--executor values), one a line",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, b := range bs {
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), b.Name()); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// factsCommand is `gpupass-agent facts`: the probes of the suite, run on
// a compute node as a job step, printing what they found as JSON for
// the agent on the login node, which checks and signs it. It holds no
// key: the compute node's identity stays with the agent.
func factsCommand() *cobra.Command {
	o := &daemon.Options{SuiteInterval: time.Hour, StorageClass: "standard"}
	cmd := &cobra.Command{
		Use:    "facts",
		Short:  "Measure the node and print the facts as JSON (a cluster executor's conformance step)",
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
