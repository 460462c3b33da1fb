// Package gpupass wires gpupass's commands: cobra commands -> options structs
// (AddFlags) -> Run functions that do not import cobra.
package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/executorflags"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
)

// GlobalOptions are the flags every command shares.
type GlobalOptions struct {
	Output  output.Format
	Verbose bool
	// Context names the context of the config file that broker
	// commands use (BrokerFlags.fromLocal reads it from the flag).
	Context string

	// Poster posts compare reports to the forges, as cmd/gpupass links
	// it (set by NewRoot; nil in a test that builds the root without).
	Poster compare.Poster
	// Executors are the agent's executors whose flags up offers (set by
	// NewRoot; nil: the list gpupass was built with, executorflags).
	Executors []executorflags.Executor

	// run runs another command of this gpupass in-process, with the same
	// commands linked in (set by NewRoot): a step's --model-ref runs
	// `model push`, which lives in a package this one cannot import.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// AddFlags registers the global flags.
func (o *GlobalOptions) AddFlags(cmd *cobra.Command) {
	output.Register(cmd, &o.Output)
	cmd.PersistentFlags().Lookup(output.Flag).Usage = "output format: text or json; sarif for validate's findings (SARIF 2.1.0); github or gitlab for a CI step (validate, compare, train, wait, audit, audit verify, bundle push, bundle pull, model push)"
	cmd.PersistentFlags().BoolVarP(&o.Verbose, "verbose", "v", false, "print debug diagnostics on stderr")
	cmd.PersistentFlags().StringVar(&o.Context, "context", "", "broker context to use, from the config file (gpupass context ls lists them)")
}

// format is the --output format; text for a nil GlobalOptions (library
// callers).
func (o *GlobalOptions) format() output.Format {
	if o == nil {
		return output.Text
	}
	return o.Output
}

// Logger returns the diagnostics logger for the command (stderr).
func (o *GlobalOptions) Logger(w io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if o.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// NewRoot builds the root command with every subcommand: this package's
// and those opts link in (the audit and bundle trees), and posting
// compare reports as opts link it.
func NewRoot(opts ...Option) *cobra.Command {
	return newRoot(newRootConfig(opts))
}

func newRoot(cfg *rootConfig) *cobra.Command { return newRootFor(cfg, "") }

// newRootFor builds the root command with every subcommand, or with only
// the one named only when only is not "". A process runs one command:
// building the others' subtrees and flags was a third of what a short
// command such as validate allocated at start-up, which on this kind of
// VM is most of its CPU time. Help, completion and unknown commands get
// the whole tree (Main decides).
func newRootFor(cfg *rootConfig, only string) *cobra.Command {
	g := &GlobalOptions{Poster: cfg.poster, Executors: cfg.executors}
	g.run = func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return mainWith(ctx, cfg, args, strings.NewReader(""), stdout, stderr)
	}
	root := &cobra.Command{
		Use:   "gpupass",
		Short: "Reproducible, verifiable GPU training across clouds and regions",
		Long: `gpupass makes the training environment a contract: a strict spec with a
fingerprint, certified GPU nodes, signed conformance reports, cross-region
comparison and signed audits.

Exit codes: 0 ok, 1 findings (spec problems, mismatches, failed checks),
2 usage or I/O error, 3 wait --timeout ran out with runs still going.
Every flag can be set with GPUPASS_<FLAG>.`,
		Version:       buildinfo.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// The typo check knows every command's variables: a partial
			// tree builds the whole one when it must look.
			all := func() *cobra.Command { return newRootFor(cfg, "") }
			if err := applyEnv(cmd, os.Getenv, all); err != nil {
				return err
			}
			return output.Check(cmd)
		},
	}
	g.AddFlags(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	// `gpupass completion` gets the whole tree (rootFor), so a partial
	// one need not build cobra's completion command on every start.
	root.CompletionOptions.DisableDefaultCmd = only != ""
	for _, c := range cfg.commands {
		if only == "" || only == c.Name {
			root.AddCommand(c.New(g))
		}
	}
	return root
}

// commands are this package's top-level commands, one file per command;
// cmd/gpupass links the others in (WithCommands).
var commands = []Subcommand{
	{Name: "version", New: newVersionCmd},
	{Name: "nodes", New: newNodesCmd},
	{Name: "validate", New: newValidateCmd},
	{Name: "init", New: newInitCmd},
	{Name: "up", New: newUpCmd},
	{Name: "compare", New: newCompareCmd},
	{Name: "train", New: newTrainCmd},
	{Name: "wait", New: newWaitCmd},
	{Name: "logs", New: newLogsCmd},
	{Name: "runs", New: newRunsCmd},
	{Name: "cancel", New: newCancelCmd},
	{Name: "context", New: newContextCmd},
}

// rootFor builds the root command for args: with only the subcommand
// args name when cobra, given that tree, resolves args to it; otherwise
// (no command, help, completion, a misspelt command that cobra suggests
// a fix for) with all of them.
func rootFor(cfg *rootConfig, args []string) *cobra.Command {
	if name := commandName(args, cfg.commands); name != "" {
		root := newRootFor(cfg, name)
		if c, _, err := root.Find(args); err == nil && c != root {
			for c.HasParent() && c.Parent() != root {
				c = c.Parent()
			}
			if c.Name() == name {
				return root
			}
		}
	}
	return newRoot(cfg)
}

// commandName is the first argument that is not a global flag or its
// value: the one of cmds args would run, or "" when it cannot tell.
// Which global flags take a value is read from GlobalOptions.AddFlags.
func commandName(args []string, cmds []Subcommand) string {
	globals := &cobra.Command{}
	new(GlobalOptions).AddFlags(globals)
	takesValue := func(a string) bool {
		var f *pflag.Flag
		if name, ok := strings.CutPrefix(a, "--"); ok {
			f = globals.PersistentFlags().Lookup(name)
		} else if len(a) == 2 {
			f = globals.PersistentFlags().ShorthandLookup(a[1:])
		}
		return f != nil && f.NoOptDefVal == ""
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return ""
		case strings.HasPrefix(a, "-") && len(a) > 1:
			if takesValue(a) {
				i++ // its value follows, as --output json
			}
		default:
			if !slices.ContainsFunc(cmds, func(c Subcommand) bool { return c.Name == a }) {
				return ""
			}
			return a
		}
	}
	return ""
}

// Main runs the CLI with args and returns the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, opts ...Option) int {
	return mainWith(ctx, newRootConfig(opts), args, stdin, stdout, stderr)
}

func mainWith(ctx context.Context, cfg *rootConfig, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := rootFor(cfg, args)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	// Libraries name the field they refuse; the user typed a flag, or in
	// a pipeline step set the input of the same name. The root's -o is
	// the one every command shares.
	err = ciFlagNames(cfg.names.flags, output.Of(root)).Apply(err)
	// A variable a step's input set is named by the input too: the
	// pipeline's author wrote wait: maybe, not GPUPASS_FOLLOW.
	if ve := (*flagenv.ValueError)(nil); errors.As(err, &ve) {
		if _, ok := CIOutput(output.Of(root)); ok {
			ve.Where = CIFlag(output.Of(root), ve.Flag)
		}
	}
	if err != nil {
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Err != nil {
			// In a workflow the error is one annotation, titled with the
			// command, instead of a plain line.
			title := "gpupass"
			if c, _, ferr := root.Find(args); ferr == nil && c != root {
				title = c.CommandPath()
			}
			if !ci.Detect(os.Getenv, stderr).Error(title, err.Error()) {
				fmt.Fprintf(stderr, "gpupass: %v\n", err)
			}
		}
	}
	return ExitCode(err)
}

func newVersionCmd(g *GlobalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gpupass version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return output.Write(cmd.OutOrStdout(), g.Output, version(buildinfo.Get()))
		},
	}
}

// version is what `gpupass version` prints.
type version buildinfo.Info

func (v version) WriteText(w io.Writer) error {
	_, err := fmt.Fprintln(w, "gpupass", buildinfo.Info(v).String())
	return err
}

// WriteJSON keeps the one-line document version has always printed.
func (v version) WriteJSON(w io.Writer) error { return output.WriteCompactJSON(w, buildinfo.Info(v)) }
