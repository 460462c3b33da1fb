package gpupass

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/workdir"
)

// TrainOptions are the flags of `gpupass train`.
type TrainOptions struct {
	// Options are the use case's: the flags fill them, and the command
	// adds only what the CLI has of its own (the broker flags, --follow).
	// Dial is set from Broker when the command runs.
	apptrain.Options
	Global *GlobalOptions
	Broker BrokerFlags
	Follow bool
	// Detach submits and exits without following, as train does
	// without --follow: said outright, so a pipeline's wait input of
	// false reads as what it does.
	Detach bool
	// ListWorkdir prints what the work dir ships and what it leaves
	// out, and submits nothing.
	ListWorkdir bool
	// CommandLine is the training command as one string (--command),
	// split into words as a shell would, never run through one.
	CommandLine string
	// ModelRef is where the run's model is pushed once it ended
	// (--model-ref, modelref.go).
	ModelRef string
}

// AddFlags registers train's flags.
func (o *TrainOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVarP(&o.Spec, "spec", "s", "gpupass.yaml", "the run's spec file")
	f.StringSliceVar(&o.Regions, "region", nil, "region to train in; repeat or comma-separate for one run per region (required)")
	f.StringVar(&o.CommandLine, "command", "", `the training command as one string instead of after --, e.g. "python3 train.py --steps 200": split into words as a shell would ('…', "…", \ escapes; no expansion), or a JSON list of words; the node never runs it through a shell`)
	f.StringVar(&o.Name, "name", "", "run name (default: the spec's name); the region and, in CI, the short commit are added")
	f.BoolVarP(&o.Follow, "follow", "f", false, "stream the logs of every run (prefixed by region) and exit with the worst result")
	f.StringVar(&o.ModelRef, "model-ref", "", modelRefUsage+"; needs --follow and one --region")
	f.BoolVar(&o.Detach, "detach", false, "submit, print the allocation ids and the run group, and exit without following (what train does without --follow); wait for the runs later with gpupass wait GROUP")
	f.Float64Var(&o.MaxPrice, "max-price", 0, "highest node price in USD per hour (0 = no limit)")
	f.IntVar(&o.MaxRestarts, "max-restarts", 3, "restarts after a NaN/Inf loss, from the newest checkpoint")
	f.BoolVar(&o.ResumeElsewhere, "resume-elsewhere", false, "when a node is lost mid-run, restart on another candidate from the newest checkpoint instead of failing")
	f.BoolVar(&o.RequireBandwidth, "require-bandwidth", false, "for a run across several nodes (resources.nodes): fail the run when the all-reduce bandwidth measured between its nodes at gang start is below the spec's resources.network.bandwidth_gbps (without it, a shortfall is recorded in each rank's signed run report and the run goes on)")
	f.StringVar(&o.TimeLimit, "time-limit", "", "wall-clock limit of each run, e.g. 90m or 2h (overrides the spec's resources.time-limit; the broker caps it): a run past it is stopped and ends failed with TIMEOUT; NaN restarts share it")
	f.StringVar(&o.QueueTimeout, "queue-timeout", "", "how long each run may wait in its region's queue while every certified node that could take it is busy, e.g. 30m (1s to 168h; overrides the spec's resources.queue-timeout): a run still waiting then ends failed with where it stood; default: wait until a node frees")
	f.StringVar(&o.MetricPattern, "metric-pattern", "", "Go regular expression (RE2) with which the agent finds the loss in the job's own log lines: a named group (?P<loss>…), optionally (?P<step>…); sets the run spec's metrics.pattern (default: the spec's, else `loss 1.23`, `loss=1.23`, `loss: 1.23`, `'loss': 1.23`)")
	f.Float64Var(&o.MinHealthScore, "min-health-score", api.DefaultMinHealthScore, "lowest node health score to place on")
	f.StringVar(&o.Workdir, "workdir", "", "directory shipped to each node as the command's work dir (default: the spec's directory; at most 64 MiB compressed); .gitignore and .gpupassignore rules apply and gpupass state dirs never ship")
	f.BoolVar(&o.NoWorkdir, "no-workdir", false, "ship no work dir (the command finds its files on the node)")
	f.StringSliceVar(&o.WorkdirInclude, "include", nil, "ship this file of the work dir although it looks like a secret (*.key, *.pem, .env, a token); repeat or comma-separate for more")
	f.BoolVar(&o.ListWorkdir, "list-workdir", false, "print every file the work dir would ship and what is left out, by which rule; submit nothing")
	f.IntVar(&o.WorkdirLimits.MaxEntries, "workdir-max-entries", workdir.DefaultMaxEntries, "most files and directories --workdir may hold (the broker checks its own limit)")
	f.IntVar(&o.WorkdirLimits.MaxDepth, "workdir-max-depth", workdir.DefaultMaxDepth, "most directory levels in --workdir")
	f.Int64Var(&o.WorkdirLimits.MaxBytes, "workdir-max-bytes", workdir.DefaultMaxBytes, "most bytes of files in --workdir")
	f.IntVar(&o.WorkdirLimits.MaxPath, "workdir-max-path", workdir.DefaultMaxPath, "longest path (bytes) under --workdir")
}

func newTrainCmd(g *GlobalOptions) *cobra.Command {
	o := &TrainOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "train --spec FILE --region R [--region R2 …] [flags] -- COMMAND [ARG…] | --command 'COMMAND ARG…'",
		Short: "Run the training command on certified nodes, one run per region",
		Long: `Submit one run per --region to the broker. Each is placed on the best certified
node of its region (the order of validate --dry-run) and printed with its
allocation id, node and health score. With --follow, the logs of all runs are
streamed, each line prefixed by its region, and the exit code is the worst
result: 0 all succeeded, 1 any failed or was cancelled, 2 bad input.

The spec's directory is shipped to each node as the command's work dir
(--workdir ships another, --no-workdir none). Left out: .git, __pycache__,
gpupass state dirs (up's .gpupass: broker database, tokens), and whatever
.gitignore and .gpupassignore (same syntax, read after .gitignore) ignore.
Files that look like secrets (*.key, *.pem, .env, .env.*, SSH keys, files
holding a private key or a gpupass token, a config.json with a token) are
refused by name until left out or named with --include. --list-workdir
prints what would ship.`,
		Example: `  gpupass train --spec gpupass.yaml --region us-west-2 --region eu-central-1 --follow -- python3 train.py
  gpupass train --spec project/gpupass.yaml --region us-west-2 --list-workdir
  gpupass train --region us-west-2 --max-price 30 --workdir . --include certs/ca.pem -- python3 train.py --epochs 3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() < 0 && len(args) > 0 || cmd.ArgsLenAtDash() > 0 {
				return fmt.Errorf("put the training command after --: gpupass train … -- %s", strings.Join(args, " "))
			}
			o.Command = args
			o.Getenv = os.Getenv
			o.MaxRestartsSet = cmd.Flags().Changed("max-restarts")
			if o.ListWorkdir {
				return ListWorkdir(o, cmd.OutOrStdout())
			}
			return RunTrain(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd)
	return CICommand(cmd)
}

// trainFlagNames maps the use case's option fields to train's flags.
var trainFlagNames = fielderr.Names{
	"Regions": "--region", "Command": "--command or the training command after --", "MaxPrice": "--max-price", "MaxRestarts": "--max-restarts",
	"Spec": "--spec", "Workdir": "--workdir", "Name": "--name", "TimeLimit": "--time-limit", "QueueTimeout": "--queue-timeout", "MetricPattern": "--metric-pattern",
	"NoWorkdir": "--no-workdir", "WorkdirInclude": "--include",
	// The broker's request fields: it names no client's flags.
	api.FieldSubmitCommand: "--command or the training command after --", api.FieldSubmitName: "--name", api.FieldSubmitWorkdir: "--workdir", api.FieldSubmitTimeLimit: "--time-limit",
	api.FieldSubmitQueueTimeout: "--queue-timeout",
}

// options are the use case's options, dialling the broker of the flags.
func (o *TrainOptions) options() apptrain.Options {
	opts := o.Options
	opts.Dial = o.Broker.DialRuns
	opts.StateDirs = stateDirs(opts.Getenv)
	return opts
}

// ciContext is the CI job train submits from (trainCIContext), for its
// run group; why there is none, when the job's variables make none, is
// a warning on errOut.
func (o *TrainOptions) ciContext(errOut io.Writer) *gpupassv1.CIContext {
	if o.Getenv == nil {
		return nil
	}
	kind, ok := CIOutput(o.Global.format())
	if !ok {
		kind = ci.Detect(o.Getenv, io.Discard).Kind()
	}
	return trainCIContext(kind, o.Getenv, o.Global.logger(errOut))
}

// RunTrain submits the runs and, with Follow, streams them to the end.
func RunTrain(ctx context.Context, o *TrainOptions, out, errOut io.Writer) error {
	if err := o.commandLine(); err != nil {
		return err
	}
	if o.Detach && o.Follow {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s and %s contradict each other: pass one (--detach submits and exits; --follow streams the runs to the end)", CIFlag(o.Global.format(), "detach"), CIFlag(o.Global.format(), "follow"))}
	}
	// Regions may come as one value (an input): "us-west-2, eu-central-1".
	var regions []string
	for _, r := range o.Regions {
		regions = append(regions, strings.FieldsFunc(r, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })...)
	}
	o.Regions = regions
	if o.ModelRef != "" {
		// Refused before anything is submitted: the model of a run
		// not followed, or of which of several runs, is not known.
		if !o.Follow {
			return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s pushes the model once the run ended: it needs %s; for a detached run, push it later with gpupass model push RUN REF", CIFlag(o.Global.format(), "model-ref"), CIFlag(o.Global.format(), "follow"))}
		}
		if err := modelRefRuns(CIFlag(o.Global.format(), "model-ref"), len(o.Regions)); err != nil {
			return err
		}
		if err := checkModelRef(o.Global, o.ModelRef); err != nil {
			return err
		}
	}
	if kind, ok := CIOutput(o.Global.format()); ok {
		return o.runCI(ctx, kind, out, errOut)
	}
	res, err := runTrain(ctx, o, trainFlagNames, out, errOut)
	if err != nil {
		return err
	}
	return o.pushModel(ctx, res, out, errOut)
}

// pushModel pushes the model of the run that ended well, with
// --model-ref.
func (o *TrainOptions) pushModel(ctx context.Context, res *apptrain.Result, out, errOut io.Writer) error {
	if o.ModelRef == "" || res == nil {
		return nil
	}
	if err := modelRefRuns(CIFlag(o.Global.format(), "model-ref"), len(res.Runs)); err != nil {
		return err
	}
	return o.Global.PushModel(ctx, ModelPush{AllocationID: res.Runs[0].Id, Ref: o.ModelRef, Broker: o.Broker}, out, errOut)
}

// commandLine splits --command into the training command's words.
func (o *TrainOptions) commandLine() error {
	if o.CommandLine == "" {
		return nil
	}
	if len(o.Command) > 0 {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("the training command is given twice: pass %s or the words after --, not both", CIFlag(o.Global.format(), "command"))}
	}
	words, err := apptrain.SplitCommand(o.CommandLine)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s: %w", CIFlag(o.Global.format(), "command"), err)}
	}
	o.Command, o.CommandLine = words, ""
	return nil
}

// runTrain runs the use case and renders it: the table of runs as
// submitted, the followed logs, and the runs as ended (or the JSON list).
// The result holds the runs submitted even when an error comes with it;
// names words option errors for the caller's door (flags or inputs).
func runTrain(ctx context.Context, o *TrainOptions, names fielderr.Names, out, errOut io.Writer) (*apptrain.Result, error) {
	opts := o.options()
	opts.CI = o.ciContext(errOut)
	res, err := apptrain.Submit(ctx, opts)
	if err != nil {
		return res, workdirHint(limitHint(names.Apply(err)), names)
	}
	if res.Workdir != nil {
		// On stderr: stdout is the table, or only JSON.
		fmt.Fprintln(errOut, workdirSummary(res.Workdir, names))
	}
	return res, showRuns(ctx, o.Global, res, o.Follow, out, errOut)
}

// showRuns renders runs as train and wait show them: the table of runs
// as they are, the group, and with follow the followed logs and the runs
// as ended (or, with JSON, only the list); the error is res.Err(): which
// runs did not succeed.
func showRuns(ctx context.Context, g *GlobalOptions, res *apptrain.Result, follow bool, out, errOut io.Writer) error {
	jsonOut := g.format() == output.JSON
	var submitted bytes.Buffer
	if !jsonOut {
		if err := apptrain.WriteTable(io.MultiWriter(out, &submitted), res.Runs); err != nil {
			return err
		}
		groupLine(out, res.Group)
		if !follow {
			followHint(errOut, res.Runs, res.Group)
		}
	}
	if follow {
		if err := apptrain.Follow(ctx, apptrain.FollowOptions{Out: out, JSON: jsonOut, Logger: g.logger(errOut)}, res); err != nil {
			return err
		}
	}
	if jsonOut {
		if err := runview.WriteList(out, res.Runs); err != nil {
			return err
		}
	} else if follow {
		// The runs as they ended, unless that is the table above again
		// (every run had ended when it was submitted).
		var ended bytes.Buffer
		if err := apptrain.WriteTable(&ended, res.Runs); err != nil {
			return err
		}
		if !bytes.Equal(ended.Bytes(), submitted.Bytes()) {
			fmt.Fprintln(out)
			if _, err := out.Write(ended.Bytes()); err != nil {
				return err
			}
		}
	}
	return res.Err()
}

// logger tolerates a nil GlobalOptions (library callers).
func (o *GlobalOptions) logger(w io.Writer) *slog.Logger {
	if o == nil {
		return (&GlobalOptions{}).Logger(w)
	}
	return o.Logger(w)
}

// writeRunTable prints runs: id, region, state, node, score, price.
func writeRunTable(out io.Writer, runs []*gpupassv1.Run) { _ = apptrain.WriteTable(out, runs) }
