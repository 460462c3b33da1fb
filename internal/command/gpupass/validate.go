package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/validate"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/flagalias"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/findings"
	"github.com/gpupass/gpupass/internal/nodeview"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// ValidateOptions are the flags of `gpupass validate`. Other branches add
// fields here (dry run against a broker); keep each group's flags in its
// own AddFlags section.
type ValidateOptions struct {
	Global *GlobalOptions
	// Spec is the spec file; empty: look up SpecFileNames in Dir.
	Spec string
	// Format is the findings format; empty: text, or json with --output json.
	Format string
	// Local checks this machine's runtime against the spec.
	Local bool
	// Python is the interpreter probed by --local.
	Python string
	// DryRun asks the broker which nodes match (validate_dryrun.go).
	DryRun DryRunOptions
	// CodeQuality is the GitLab code quality report that --output gitlab
	// writes.
	CodeQuality string

	// Dir is where the spec is looked up (the working directory).
	Dir string
	// Color enables colour in text output (decided by the caller: only on
	// a terminal).
	Color bool
	// Getenv reads the environment (GITHUB_ACTIONS, GITHUB_OUTPUT).
	Getenv func(string) string
	// Logger receives diagnostics.
	Logger *slog.Logger
	// ErrOut receives human output that must not mix into a JSON stdout
	// (the --local report with --format sarif or gitlab).
	ErrOut io.Writer
}

// AddFlags registers validate's flags.
func (o *ValidateOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVarP(&o.Spec, "spec", "s", "", "spec file (default: gpupass.yaml, or lightning-cloud.yaml, in the working directory)")
	flagalias.Shorthand(f, "spec", "f", cmd.ErrOrStderr) // -f is --follow elsewhere
	f.StringVar(&o.Format, "format", "", "findings format: "+strings.Join(findings.Formats, ", ")+" (default text; json with --output json)")
	f.BoolVar(&o.Local, "local", false, "also check this machine's runtime (driver, nvcc, python, torch, packages) against the spec")
	f.StringVar(&o.Python, "python", probe.DefaultPython, "Python interpreter probed by --local (the one gpupass up runs jobs with)")
	f.StringVar(&o.CodeQuality, "code-quality", "gl-code-quality-report.json", "GitLab code quality report of the findings, written with --output gitlab")
	o.DryRun.AddFlags(cmd)
}

func newValidateCmd(g *GlobalOptions) *cobra.Command {
	o := &ValidateOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check the environment spec and print its fingerprint",
		Long: `Parse and lint gpupass.yaml (or lightning-cloud.yaml): every problem at once,
each with file:line:column, a rule id and a fix hint; print the fingerprint of a
valid spec. --local also checks this machine's runtime against it.

Exit codes: 0 valid (warnings allowed), 1 errors in the spec or runtime
mismatches, 2 usage or I/O error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := os.Getwd()
			if err != nil {
				return fmt.Errorf("finding the working directory: %w", err)
			}
			o.Dir = dir
			o.Getenv = os.Getenv
			o.Logger = g.Logger(cmd.ErrOrStderr())
			o.ErrOut = cmd.ErrOrStderr()
			o.Color = isTerminal(cmd.OutOrStdout()) && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
			return RunValidate(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return CICommand(cmd)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// format resolves --format against the global --output.
func (o *ValidateOptions) format() (string, error) {
	jsonOnly := o.Global.format() == output.JSON
	if _, isCI := CIOutput(o.Global.format()); isCI {
		// The findings are text in the log; the output format adds the
		// annotations or the code quality report.
		if o.Format != "" && o.Format != "text" {
			return "", fmt.Errorf("--format %s with --output %s: the CI output prints text and writes its own reports; drop --format", o.Format, o.Global.Output)
		}
		return "text", nil
	}
	f := o.Format
	if f == "" {
		f = "text"
		if jsonOnly {
			f = "json"
		}
	}
	if !slices.Contains(findings.Formats, f) {
		return "", fmt.Errorf("--format %q: use one of %s", f, strings.Join(findings.Formats, ", "))
	}
	if jsonOnly && (f == "text" || f == "github") {
		return "", fmt.Errorf("--format %s does not print JSON; with --output json use --format json, gitlab or sarif", f)
	}
	return f, nil
}

// validateSpec runs the validate use case and words its errors for the
// command line.
func (o *ValidateOptions) validateSpec(ctx context.Context) (*validate.Result, error) {
	v, err := validate.Run(ctx, validate.Options{Spec: o.Spec, Dir: o.Dir, Logger: o.Logger})
	var ns *validate.NoSpecError
	if errors.As(err, &ns) && ns.Above != "" {
		return nil, fmt.Errorf("%w: pass --spec %s", err, termsafe.ShellQuote(ns.Above))
	}
	if errors.As(err, &ns) {
		return nil, fmt.Errorf("%w, or pass %s", err, CIFlag(o.Global.format(), "spec"))
	}
	return v, err
}

// RunValidate validates the spec and prints the findings in the chosen
// format. It returns an ExitError with ExitFindings when the spec has
// errors or --local found mismatches.
func RunValidate(ctx context.Context, o *ValidateOptions, out io.Writer) error {
	format, err := o.format()
	if err != nil {
		return err
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	kind, isCI := CIOutput(o.Global.format())
	env := ci.New(kind, getenv, o.ErrOut)
	defer env.Group("gpupass validate")()
	v, err := o.validateSpec(ctx)
	if err != nil {
		return err
	}
	res, b := v.Result, v.Source
	results := []*spec.Result{res}

	// With JSON output the local check's report (itself JSON) goes inside
	// the one document under "local", so stdout stays a single JSON value.
	var local json.RawMessage
	var localErr error
	mismatches := 0
	runLocal := o.Local && res.Valid
	if runLocal && format == "json" {
		var buf bytes.Buffer
		mismatches, localErr = localCheck(ctx, o, res.Spec, &buf)
		if json.Valid(buf.Bytes()) {
			local = json.RawMessage(bytes.TrimSpace(buf.Bytes()))
		} else if buf.Len() > 0 {
			local, _ = json.Marshal(buf.String())
		}
		runLocal = false
	}

	// Likewise the broker's dry-run answer goes under "dry_run".
	var dry *gpupassv1.DryRunResponse
	var dryView *nodeview.DryRun
	if o.DryRun.Enabled && res.Valid && format == "json" {
		if dry, err = o.DryRun.run(ctx, b); err != nil {
			return err
		}
		v := nodeview.DryRunOf(dry)
		dryView = &v
	}

	fo := findings.Options{Color: o.Color, Version: buildinfo.Get().Version, Getenv: getenv}
	if format == "json" {
		err = writeJSON(out, validateReport{Result: res, Local: local, DryRun: dryView})
	} else {
		err = findings.Write(out, format, results, fo)
	}
	if err != nil {
		return fmt.Errorf("writing findings: %w", err)
	}
	if (getenv("GITHUB_ACTIONS") == "true" || kind == ci.GitHub) && format != "github" {
		// In a workflow, annotate the spec's lines too; with JSON output,
		// stdout must stay JSON, so only the step output is set.
		w := out
		if format != "text" {
			w = io.Discard
		}
		if err := findings.GitHub(w, results, getenv); err != nil {
			return err
		}
	}
	if isCI {
		if err := ciValidateReports(env, o, results); err != nil {
			return err
		}
	}
	if !res.Valid {
		return Findings(nil)
	}
	if localErr != nil {
		return localErr
	}
	if runLocal {
		w := out
		if format != "text" && o.ErrOut != nil {
			w = o.ErrOut // keep a machine-readable stdout clean
		}
		n, err := localCheck(ctx, o, res.Spec, w)
		if err != nil {
			return err
		}
		mismatches = n
	}
	if o.DryRun.Enabled && dry == nil {
		if dry, err = o.DryRun.run(ctx, b); err != nil {
			return err
		}
		w := out
		if format != "text" && o.ErrOut != nil {
			w = o.ErrOut // keep a machine-readable stdout clean
		}
		if err := writeDryRunText(w, o.DryRun.Broker.URL, dry); err != nil {
			return err
		}
	}
	if mismatches > 0 || (dry != nil && len(dry.Candidates) == 0) {
		return Findings(nil)
	}
	return nil
}

// ciValidateReports renders the typed result for a pipeline (-o github,
// -o gitlab), besides the findings in the log: on GitLab the code quality
// report (GitLab shows it on the merge request's diff) and the
// fingerprint in the dotenv file (on GitHub findings.GitHub set the step
// output), and the job summary.
func ciValidateReports(env *ci.Env, o *ValidateOptions, results []*spec.Result) error {
	res := results[0]
	if env.Kind() == ci.GitLab {
		fo := findings.Options{Version: buildinfo.Get().Version, Getenv: hideCI(o.Getenv)}
		if err := writeFile(o.CodeQuality, func(w io.Writer) error { return findings.Write(w, "gitlab", results, fo) }); err != nil {
			return err
		}
		if res.Fingerprint != "" {
			if err := env.SetOutput("fingerprint", res.Fingerprint); err != nil {
				return err
			}
		}
	}
	if !res.Valid {
		return env.Summary(fmt.Sprintf("### ❌ gpupass validate\n\n`%s` has errors: see the annotations.\n", res.File))
	}
	return env.Summary(fmt.Sprintf("### ✅ gpupass validate\n\n`%s` is valid.\n\nFingerprint: `%s`\n", res.File, res.Fingerprint))
}

// hideCI hides the CI variables from a renderer whose output is only a
// report file, so it sets no outputs and prints no annotations of its own.
func hideCI(getenv func(string) string) func(string) string {
	return func(k string) string {
		switch k {
		case "GITHUB_ACTIONS", "GITLAB_CI", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY":
			return ""
		}
		return getenv(k)
	}
}

// validateReport is validate's JSON document: the spec result, plus the
// local runtime check's report when --local ran. Later checks (a broker
// dry run) add their own field here.
type validateReport struct {
	*spec.Result
	Local json.RawMessage `json:"local,omitempty"`
	// DryRun is the broker's answer to --dry-run (docs/using.md "Nodes and dry
	// runs as JSON").
	DryRun *nodeview.DryRun `json:"dry_run,omitempty"`
}
