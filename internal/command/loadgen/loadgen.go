// Package loadgen is the command layer of gpupass-loadgen: flags, then
// internal/loadgen.Run, then a table or JSON of what it measured.
package loadgen

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/loadgen"
)

// Options are gpupass-loadgen's flags.
type Options struct {
	Brokers                            []string
	AgentToken, SubmitToken, ReadToken string
	Agents, Runs                       int
	HeartbeatEvery, Duration           time.Duration
	LinesPerSecond, Lines              int
	MetricsPerSecond                   int
	Submitters                         int
	DryRunEvery                        time.Duration
	Enrolling, ClientsPerBroker        int
	Output                             output.Format
	Verbose                            bool
	InsecureHTTP                       bool
}

// AddFlags declares o's flags on cmd.
func (o *Options) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&o.Brokers, "brokers", nil, "broker URLs (comma-separated); agent i talks to broker i mod n, submitters to the first")
	f.StringVar(&o.AgentToken, "agent-token", "", "agent-role token that enrolls the simulated nodes")
	f.StringVar(&o.SubmitToken, "submit-token", "", "submit-role token for the runs and their logs")
	f.StringVar(&o.ReadToken, "read-token", "", "read-role token for the dry-runs")
	for _, s := range []string{"agent-token", "submit-token", "read-token"} {
		flagenv.MarkSecret(s)
	}
	f.IntVar(&o.Agents, "agents", 100, "simulated nodes that only heartbeat")
	f.IntVar(&o.Runs, "runs", 10, "runs, each on its own simulated node running the agent's run loop")
	f.DurationVar(&o.HeartbeatEvery, "heartbeat-every", 10*time.Second, "each agent's heartbeat interval")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long heartbeats and dry-runs are measured")
	f.IntVar(&o.LinesPerSecond, "lines-per-second", 100, "lines each run prints per second")
	f.IntVar(&o.Lines, "lines", 1000, "lines each run prints")
	f.IntVar(&o.MetricsPerSecond, "metrics-per-second", 10, "metric points each run writes per second to $GPUPASS_METRICS_FILE while it prints lines (negative: none)")
	f.IntVar(&o.Submitters, "submitters", 1, "clients doing dry-runs")
	f.DurationVar(&o.DryRunEvery, "dry-run-every", time.Second, "each submitter's dry-run interval")
	f.IntVar(&o.Enrolling, "enrolling", 16, "enrollments in flight")
	f.IntVar(&o.ClientsPerBroker, "clients-per-broker", 32, "HTTP/2 connections the heartbeating agents of one broker share")
	output.Register(cmd, &o.Output)
	f.BoolVarP(&o.Verbose, "verbose", "v", false, "log warnings (failed beats, dry-runs) to stderr")
	f.BoolVar(&o.InsecureHTTP, "insecure-http", false, "send the tokens over plain http:// to brokers that are not on loopback (refused without it); warned of at every start")
}

// Main runs gpupass-loadgen with args and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "gpupass-loadgen: %v\n", flagNames.Apply(err))
		return exitcode.Of(err)
	}
	return 0
}

// NewCommand builds the gpupass-loadgen command (Main runs it; the CLI
// reference in docs/cli is generated from it).
func NewCommand() *cobra.Command {
	o := &Options{}
	root := &cobra.Command{
		Use:   "gpupass-loadgen",
		Short: "drive gpupass brokers with a simulated fleet and report latencies and lost records",
		Long: `gpupass-loadgen enrolls simulated agents (each its own key, signed
simulated reports, MAC'd heartbeats), runs streaming jobs on some of them
through the agent's own run loop, dry-runs from submitters, then reads
every run's log back and counts lost and duplicated lines.

Every flag can be set with GPUPASS_<FLAG>; tokens also with GPUPASS_<FLAG>_FILE.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagenv.Apply(cmd, os.Getenv); err != nil {
				return err
			}
			return output.Check(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(root)
	root.AddCommand(&cobra.Command{
		Use:    "emit RATE COUNT [METRICS_RATE]",
		Short:  "print COUNT numbered, timestamped lines at RATE per second and write METRICS_RATE metric points a second to $GPUPASS_METRICS_FILE (the runs' job)",
		Hidden: true,
		Args:   cobra.RangeArgs(2, 3),
		RunE:   func(_ *cobra.Command, args []string) error { return loadgen.EmitMain(args) },
	})
	return root
}

// Run makes the load o describes and prints what it measured.
func Run(ctx context.Context, o *Options, out, diag io.Writer) error {
	if len(o.Brokers) == 0 {
		return fmt.Errorf("--brokers: give at least one broker URL")
	}
	if o.AgentToken == "" || (o.Runs > 0 && o.SubmitToken == "") || (o.Submitters > 0 && o.ReadToken == "") {
		return fmt.Errorf("--agent-token, --submit-token (with --runs) and --read-token (with --submitters) are required")
	}
	for _, b := range o.Brokers {
		if u := client.PlainHTTPOffHost(b); u != "" && o.InsecureHTTP {
			fmt.Fprintf(diag, "warning: the tokens go over plain HTTP, unencrypted, to %s (--insecure-http): anyone on the network path can read them and use them; use an https:// broker URL\n", u)
		}
	}
	level := slog.LevelError
	if o.Verbose {
		level = slog.LevelWarn
	}
	res, err := loadgen.Run(ctx, loadgen.Config{
		BrokerURLs: o.Brokers, AgentToken: o.AgentToken, SubmitToken: o.SubmitToken, ReadToken: o.ReadToken,
		Agents: o.Agents, Runs: o.Runs, HeartbeatEvery: o.HeartbeatEvery, Duration: o.Duration,
		LinesPerSecond: o.LinesPerSecond, Lines: o.Lines, MetricsPerSecond: o.MetricsPerSecond, Submitters: o.Submitters, DryRunEvery: o.DryRunEvery,
		Enrolling: o.Enrolling, ClientsPerBroker: o.ClientsPerBroker, InsecureHTTP: o.InsecureHTTP,
		Log: slog.New(slog.NewTextHandler(diag, &slog.HandlerOptions{Level: level})),
	})
	if err != nil {
		return err
	}
	if err := output.Write(out, o.Output, measured{res, len(o.Brokers)}); err != nil {
		return err
	}
	if res.LinesLost != 0 || res.LinesDuplicated != 0 || res.MetricsLost != 0 || res.MetricsDuplicated != 0 || len(res.RunsFailed) != 0 {
		return fmt.Errorf("%d lines lost, %d duplicated; %d metric points lost, %d duplicated; %d runs failed",
			res.LinesLost, res.LinesDuplicated, res.MetricsLost, res.MetricsDuplicated, len(res.RunsFailed))
	}
	return nil
}

// measured is what gpupass-loadgen prints: as JSON, the loadgen.Result.
type measured struct {
	*loadgen.Result
	brokers int
}

func (m measured) WriteText(out io.Writer) error {
	res := m.Result
	lat := func(l loadgen.Latency) string {
		return fmt.Sprintf("p50 %.1f ms, p95 %.1f ms, p99 %.1f ms (n=%d)", l.P50, l.P95, l.P99, l.N)
	}
	fmt.Fprintf(out, "agents          %d + %d runners on %d broker(s), enrolled in %s\n", res.Agents, res.Runs, m.brokers, res.EnrollTime.Round(time.Millisecond))
	fmt.Fprintf(out, "heartbeats      %s, %.0f/s, %d errors\n", lat(res.Heartbeats), res.HeartbeatsPerSec, res.HeartbeatErrors)
	if res.Runs > 0 {
		fmt.Fprintf(out, "  while streaming %s\n", lat(res.HeartbeatsStreaming))
	}
	fmt.Fprintf(out, "dry-runs        %s, %d errors, %d nodes judged\n", lat(res.DryRuns), res.DryRunErrors, res.DryRunNodes)
	fmt.Fprintf(out, "line to client  %s\n", lat(res.LineLatency))
	fmt.Fprintf(out, "lines           %d emitted, %d stored (%.0f/s), %d lost, %d duplicated\n", res.LinesEmitted, res.LinesStored, res.StoredPerSecond, res.LinesLost, res.LinesDuplicated)
	fmt.Fprintf(out, "metric points   %d emitted, %d stored, %d lost, %d duplicated\n", res.MetricsEmitted, res.MetricsStored, res.MetricsLost, res.MetricsDuplicated)
	_, err := fmt.Fprintf(out, "runs            %d succeeded, %d failed %q\n", res.RunsSucceeded, len(res.RunsFailed), res.RunsFailed)
	return err
}

// flagNames renames the libraries' fields (*fielderr.Error) to the flags
// that set them.
var flagNames = fielderr.Names{api.FieldInsecureHTTP: "--insecure-http (or GPUPASS_INSECURE_HTTP=true)"}
