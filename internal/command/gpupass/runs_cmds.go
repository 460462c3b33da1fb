package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/runlog"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// LogsOptions are the flags of `gpupass logs`.
type LogsOptions struct {
	Global   *GlobalOptions
	Broker   BrokerFlags
	AllocID  string
	Follow   bool
	Metrics  bool
	AfterSeq uint64
	// Rank is the one rank of a gang to show; nil: every rank.
	Rank *int
}

// AddFlags registers logs' flags.
func (o *LogsOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	f := cmd.Flags()
	f.BoolVarP(&o.Follow, "follow", "f", false, "keep streaming until the run ends; exit 1 when it did not succeed or its log is disputed")
	f.BoolVar(&o.Metrics, "metrics", false, "include metric points")
	f.Uint64Var(&o.AfterSeq, "after-seq", 0, "only records after this sequence number (of each rank, for a run across several nodes)")
	f.Var(rankValue{&o.Rank}, "rank", "a run across several nodes: only this rank's log (0 is the run's own; default every rank, each line marked REGION/RANK; no variable sets it: GPUPASS_RANK is every gang job's own rank)")
	flagenv.NoEnv(f, "rank")
}

// rankValue is --rank: unset, it stands for every rank, and its help
// shows no default (an int flag's would be a number meaning none).
type rankValue struct{ p **int }

func (v rankValue) String() string {
	if v.p == nil || *v.p == nil {
		return ""
	}
	return strconv.Itoa(**v.p)
}

func (v rankValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return errors.New("want a rank: 0 (the run's own), 1, …; leave --rank out for every rank")
	}
	*v.p = &n
	return nil
}

func (rankValue) Type() string { return "int" }

func newLogsCmd(g *GlobalOptions) *cobra.Command {
	o := &LogsOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "logs ALLOC",
		Short: "Print a run's events (structured logs)",
		Long: `Print the events of a run in sequence order, one line each:
[2024-04-12 08:23:15.221] INFO runtime.init CUDA driver 535.104.05 loaded (expected 535.104.05)
With --output json, one JSON object per event (seq, ts, level, component, msg, fields).
A log the broker marked disputed (a seq sent twice with different content)
ends with a WARN line on stderr: it is not proof of what the run printed.`,
		Args: allocArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.AllocID = args[0]
			return RunLogs(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// RunLogs prints (and with Follow, streams) a run's records.
func RunLogs(ctx context.Context, o *LogsOptions, out, errOut io.Writer) error {
	c, err := o.Broker.DialRuns()
	if err != nil {
		return err
	}
	resp, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: o.AllocID}))
	if err != nil {
		return rpcError("reading run "+o.AllocID, o.Broker.URL, err)
	}
	if note := runview.QueueNote(resp.Msg.Run); note != "" {
		// On stderr, so --output json stays JSON.
		fmt.Fprintf(errOut, "%s %s\n", resp.Msg.Run.Id, termsafe.String(note))
	}
	p := &runlog.Printer{Out: out, JSON: o.Global.format() == output.JSON}
	run := resp.Msg.Run
	follow := runlog.FollowGang
	if o.Rank != nil {
		if run, err = rankOf(ctx, c, run, *o.Rank, o.Broker.URL); err != nil {
			return err
		}
		follow = runlog.Follow
	}
	fin, err := follow(ctx, c, run, o.AfterSeq, o.Follow, o.Metrics, p, o.Global.logger(errOut))
	if err != nil {
		return err
	}
	if !o.Follow {
		// The run as it is now: it may have been disputed while the
		// records were read.
		if r, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: run.Id})); err == nil {
			fin = r.Msg.Run
		}
	}
	if fin.GetLogDisputed() {
		// On stderr, so --output json stays JSON; a person reading the
		// terminal sees it after the last line.
		fmt.Fprintln(errOut, "WARN "+disputedNote(fin))
	}
	if o.Follow && fin.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		return Findings(fmt.Errorf("run %s %s", fin.Id, events.Outcome(stateName(fin.State), termsafe.String(fin.Reason))))
	}
	if o.Follow && fin.GetLogDisputed() {
		return Findings(fmt.Errorf("run %s succeeded, but %s", fin.Id, disputedNote(fin)))
	}
	return nil
}

// rankOf is rank n of the gang whose run is run (the one `logs --rank`
// shows), or an error naming --rank and the ranks there are.
func rankOf(ctx context.Context, c *client.RunClients, run *gpupassv1.Run, n int, url string) (*gpupassv1.Run, error) {
	nodes := int(run.GetGangNodes())
	switch {
	case nodes < 2:
		if n == 0 {
			return run, nil
		}
		return nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("--rank %d: run %s runs on one node; leave --rank out", n, run.Id)}
	case run.GetGangRank() != 0:
		return nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("--rank %d: %s is rank %d of run %s; give the run's id with --rank", n, run.Id, run.GetGangRank(), strings.TrimSuffix(run.Id, fmt.Sprintf("-r%d", run.GetGangRank())))}
	case n >= nodes:
		return nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("--rank %d: run %s has %d ranks, 0 to %d", n, run.Id, nodes, nodes-1)}
	case n == 0:
		return run, nil
	}
	id := runlog.RankID(run.Id, n)
	r, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		return nil, rpcError("reading rank "+strconv.Itoa(n)+" of run "+run.Id, url, err)
	}
	return r.Msg.Run, nil
}

// disputedNote says what a disputed log means, for every command that
// shows one.
func disputedNote(r *gpupassv1.Run) string { return runview.DisputedNote(r) }

// RunsOptions are the flags of `gpupass runs`.
type RunsOptions struct {
	Global  *GlobalOptions
	Broker  BrokerFlags
	Regions []string
	Group   string
	Limit   int
	// Ranks lists each rank of a run across several nodes after it.
	Ranks bool
}

// AddFlags registers runs' flags.
func (o *RunsOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	f := cmd.Flags()
	f.StringSliceVar(&o.Regions, "region", nil, "only these regions (glob patterns)")
	f.StringVar(&o.Group, "group", "", "only the runs of this run group (the id gpupass train printed), oldest first")
	f.IntVar(&o.Limit, "limit", 50, fmt.Sprintf("newest runs to show (at most %d)", maxRunsLimit))
	f.BoolVar(&o.Ranks, "ranks", false, "list each rank of a run across several nodes (RUN-r1, …: its node, state and reason) after the run")
}

func newRunsCmd(g *GlobalOptions) *cobra.Command {
	o := &RunsOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List runs, newest first, with state, node, score and reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunRuns(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// maxRunsLimit is the broker's cap on ListRuns (broker/runs_service.go).
const maxRunsLimit = 1000

// RunRuns lists runs.
func RunRuns(ctx context.Context, o *RunsOptions, out io.Writer) error {
	// The broker answers a limit past its cap with its default of 100
	// runs, which would look like all there is: refuse instead.
	if o.Limit < 1 || o.Limit > maxRunsLimit {
		return fmt.Errorf("--limit %d: must be 1 to %d (the most the broker returns at once; narrow with --region)", o.Limit, maxRunsLimit)
	}
	if o.Group != "" {
		if err := api.CheckGroupID(o.Group); err != nil {
			return fmt.Errorf("--group: %w", err)
		}
	}
	c, err := o.Broker.DialRuns()
	if err != nil {
		return err
	}
	resp, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Regions: o.Regions, Limit: int32(o.Limit), Group: o.Group}))
	if err != nil {
		return rpcError("listing runs", o.Broker.URL, err)
	}
	runs := resp.Msg.Runs
	if o.Ranks {
		var all []*gpupassv1.Run
		for _, r := range runs {
			ranks, err := runlog.Ranks(ctx, c, r)
			if err != nil {
				return err
			}
			all = append(all, ranks...)
		}
		runs = all
	}
	return output.Write(out, o.Global.format(), runList{List: runview.ListOf(runs), runs: runs})
}

// runList is what `runs` prints: as JSON, runview's document.
type runList struct {
	runview.List
	runs []*gpupassv1.Run
}

func (l runList) WriteText(out io.Writer) error {
	if len(l.runs) == 0 {
		_, err := fmt.Fprintln(out, "no runs in scope")
		return err
	}
	writeRunTable(out, l.runs)
	return nil
}

// CancelOptions are the flags of `gpupass cancel`.
type CancelOptions struct {
	Global  *GlobalOptions
	Broker  BrokerFlags
	AllocID string
	Reason  string
}

// AddFlags registers cancel's flags.
func (o *CancelOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	cmd.Flags().StringVar(&o.Reason, "reason", "", `why (stored as the run's reason; default "cancelled by user")`)
}

func newCancelCmd(g *GlobalOptions) *cobra.Command {
	o := &CancelOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "cancel ALLOC",
		Short: "Cancel a run (SIGTERM, then SIGKILL after its grace period)",
		Args:  allocArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.AllocID = args[0]
			return RunCancel(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// RunCancel cancels a run.
func RunCancel(ctx context.Context, o *CancelOptions, out io.Writer) error {
	c, err := o.Broker.DialRuns()
	if err != nil {
		return err
	}
	resp, err := c.Run.Cancel(ctx, connect.NewRequest(&gpupassv1.CancelRequest{AllocId: o.AllocID, Reason: o.Reason}))
	if err != nil {
		return rpcError("cancelling "+o.AllocID, o.Broker.URL, err)
	}
	r := resp.Msg.Run
	return output.Write(out, o.Global.format(), cancelled{Run: runview.FromProto(r), run: r})
}

// cancelled is what `cancel` prints: as JSON, runview's Run document.
type cancelled struct {
	runview.Run
	run *gpupassv1.Run
}

func (c cancelled) WriteText(out io.Writer) error {
	r := c.run
	var err error
	switch {
	case terminal(r.State):
		_, err = fmt.Fprintf(out, "%s %s\n", r.Id, events.Outcome(stateName(r.State), termsafe.String(r.Reason)))
	default:
		_, err = fmt.Fprintf(out, "%s cancel requested (%s on %s); follow with: gpupass logs --follow %s\n", r.Id, stateName(r.State), termsafe.String(r.NodeId), r.Id)
	}
	return err
}
