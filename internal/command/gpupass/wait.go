package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// WaitOptions are the flags of `gpupass wait`.
type WaitOptions struct {
	Global *GlobalOptions
	Broker BrokerFlags
	// IDs are run group ids and allocation ids (the arguments).
	IDs     []string
	Timeout time.Duration
	// Getenv reads the CI's variables (-o github|gitlab).
	Getenv func(string) string
}

// AddFlags registers wait's flags.
func (o *WaitOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, fmt.Sprintf("stop waiting after this long, e.g. 5h30m, with exit code %d; the runs keep running and the same command picks them up again (0 = no limit)", ExitTimeout))
}

func newWaitCmd(g *GlobalOptions) *cobra.Command {
	o := &WaitOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "wait GROUP|ALLOC… [--timeout D]",
		Short: "Follow runs submitted earlier (a run group or allocation ids) until every one has ended",
		Long: fmt.Sprintf(`Follow the runs of a run group (the id gpupass train prints: "run group
group-…"), or runs named by allocation id, until every one has ended, and exit
as gpupass train --follow would: the logs of each run prefixed by its region,
the runs as ended, and exit code 0 when all succeeded, 1 when any failed or was
cancelled, 2 on bad input or when interrupted (Ctrl-C, SIGTERM).

wait only reads: killing it leaves the runs running, and the same command
started again picks them up where they are (a run that ended meanwhile
counts with its result). With --timeout, a wait that runs out while runs are
still going exits with code %d and says the command to run again; a CI job
near its own limit ends that way and a later job waits on.

With -o github|gitlab it is a pipeline step with the outputs of the train
step (allocation-ids, group; on GitLab the dotenv file).`, ExitTimeout),
		Example: `  gpupass train --detach --region us-west-2,eu-central-1 -- python3 train.py
  gpupass wait group-3f9a1c0d5e7b2a41
  gpupass wait --timeout 5h30m group-3f9a1c0d5e7b2a41
  gpupass wait alloc-9d2f… alloc-41c7…`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("missing GROUP or ALLOC: pass the run group id (group-…) gpupass train printed, or allocation ids (alloc-…): %s GROUP", cmd.CommandPath())
			}
			o.IDs = args
			o.Getenv = os.Getenv
			return RunWait(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd)
	return CICommand(cmd)
}

// RunWait follows the runs o names until every one has ended (or
// Timeout) and renders them as train --follow does.
func RunWait(ctx context.Context, o *WaitOptions, out, errOut io.Writer) error {
	if o.Timeout < 0 {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s %s: must not be negative (0 = no limit)", o.flag("timeout"), o.Timeout)}
	}
	kind, isCI := CIOutput(o.Global.format())
	var env *ci.Env
	if isCI {
		getenv := o.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		env = ci.New(kind, getenv, errOut)
		defer env.Group("gpupass wait")()
	}
	res, err := apptrain.Resume(ctx, o.Broker.DialRuns, o.IDs)
	if err != nil {
		return err
	}
	// The outputs first: a job that hits its own limit while waiting
	// has still handed the runs on.
	if isCI {
		if err := stepOutputs(env, res); err != nil {
			return err
		}
	}
	followCtx := ctx
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		followCtx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	waitErr := showRuns(followCtx, o.Global, res, true, out, errOut)
	switch {
	case o.Timeout > 0 && ctx.Err() == nil && errors.Is(followCtx.Err(), context.DeadlineExceeded):
		waitErr = o.timedOut(ctx, res, out)
	case waitErr != nil && ctx.Err() != nil:
		// Ctrl-C, or the CI job cancelled or past its limit (SIGTERM):
		// say that the runs go on and how to wait on, not "context
		// canceled".
		waitErr = &ExitError{Code: ExitUsage, Err: fmt.Errorf("stopped waiting: the runs keep running; wait again with: %s", waitCommand("", o.IDs))}
	}
	if isCI {
		// The summary as the runs ended (or are, after a timeout).
		return errors.Join(waitErr, env.Summary(trainSummary("wait", res.Runs)))
	}
	return waitErr
}

// timedOut renders the runs as they are when --timeout ran out and says
// that they keep going and how to wait on.
func (o *WaitOptions) timedOut(ctx context.Context, res *apptrain.Result, out io.Writer) error {
	// The runs as they are now; a short context of its own, as the
	// follow's has ended.
	now, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if fresh, err := apptrain.Resume(now, o.Broker.DialRuns, o.IDs); err == nil {
		res.Runs = fresh.Runs
	}
	if o.Global.format() == output.JSON {
		_ = runview.WriteList(out, res.Runs)
	} else {
		fmt.Fprintln(out)
		writeRunTable(out, res.Runs)
	}
	var going []string
	for _, r := range res.Runs {
		if !runview.Terminal(r.State) {
			st := stateName(r.State)
			if r.QueuePosition > 0 {
				st += fmt.Sprintf(" at queue position %d", r.QueuePosition)
			}
			going = append(going, fmt.Sprintf("%s (%s) %s", r.Id, termsafe.String(r.Region), st))
		}
	}
	return &ExitError{Code: ExitTimeout, Err: fmt.Errorf("%s %s ran out with %d of %d runs still going (%s): they keep running; wait again with: %s",
		o.flag("timeout"), o.Timeout, len(going), len(res.Runs), strings.Join(going, ", "), waitCommand("", o.IDs))}
}

// flag names one of wait's flags for the user. wait is no step of the
// Action or the component (a pipeline runs it in a script line), so
// under -o github|gitlab it has no input to name, only the variable.
func (o *WaitOptions) flag(name string) string {
	if _, ok := CIOutput(o.Global.format()); ok {
		return fmt.Sprintf("--%s (%s)", name, EnvName(name))
	}
	return "--" + name
}

// waitCommand is the `gpupass wait` command for a group, or for the
// runs named by ids when there is none.
func waitCommand(group string, ids []string) string {
	if group != "" {
		return "gpupass wait " + termsafe.ShellQuote(group)
	}
	words := []string{"gpupass", "wait"}
	for _, id := range ids {
		words = append(words, termsafe.ShellQuote(id))
	}
	return strings.Join(words, " ")
}
