package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

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
	// ErrOut receives human output that must not mix into a document on
	// stdout (the --local report and the dry run with -o sarif).
	ErrOut io.Writer
}

// AddFlags registers validate's flags.
func (o *ValidateOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVarP(&o.Spec, "spec", "s", "", "spec file (default: gpupass.yaml, or lightning-cloud.yaml, in the working directory)")
	flagalias.Shorthand(f, "spec", "f", cmd.ErrOrStderr) // -f is --follow elsewhere
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

-o picks the findings' format: text (the default), json (one document, with
--local's and --dry-run's answers in it), sarif (SARIF 2.1.0, for code
scanning), github or gitlab (a CI step: the text, plus annotations on the
spec's lines or the code quality report in --code-quality).

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
	// The findings' formats are -o's: SARIF besides the CI formats.
	output.Supports(cmd, output.Text, output.JSON, output.GitHub, output.GitLab, output.SARIF)
	output.Alias(cmd, "format", "deprecated: use -o (text, json, github, gitlab or sarif)")
	return cmd
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

// RunValidate validates the spec and prints the findings in the -o
// format, with the local check's and the dry run's answers when asked
// for. It returns an ExitError with ExitFindings when the spec has
// errors, --local found mismatches or the dry run no candidate.
func RunValidate(ctx context.Context, o *ValidateOptions, out io.Writer) error {
	f := o.Global.format()
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	kind, isCI := CIOutput(f)
	env := ci.New(kind, getenv, o.ErrOut)
	defer env.Group("gpupass validate")()
	v, err := o.validateSpec(ctx)
	if err != nil {
		return err
	}
	res := v.Result
	results := []*spec.Result{res}
	r := validateReport{Result: res, fo: findings.Options{Color: o.Color, Version: buildinfo.Get().Version, Getenv: getenv}, people: o.ErrOut}
	// The local check and the dry run are of a valid spec only; an error
	// of either comes after the findings, which are printed all the same.
	var checkErr error
	if res.Valid && o.Local {
		r.Local, checkErr = localCheck(ctx, o, res.Spec)
	}
	if res.Valid && o.DryRun.Enabled && checkErr == nil {
		r.dry, checkErr = o.DryRun.run(ctx, v.Source)
		// Dial resolved the broker from the flags, a context or gpupass
		// up's state: the URL is known only now ("dry-run at :" before).
		r.url = o.DryRun.Broker.URL
		if r.dry != nil {
			dv := nodeview.DryRunOf(r.dry)
			r.DryRun = &dv
		}
	}
	if err := output.Write(out, f, r); err != nil {
		return fmt.Errorf("writing findings: %w", err)
	}
	if getenv("GITHUB_ACTIONS") == "true" || kind == ci.GitHub {
		// In a workflow, annotate the spec's lines too; a document on
		// stdout stays one, so only the step output is set.
		w := out
		if f.Document() {
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
	if checkErr != nil {
		return checkErr
	}
	if (r.Local != nil && len(r.Local.Mismatches) > 0) || (r.dry != nil && len(r.dry.Candidates) == 0) {
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
		if err := writeFile(o.CodeQuality, func(w io.Writer) error { return findings.GitLab(w, results) }); err != nil {
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

// validateReport is what validate prints: the spec's findings, and the
// local runtime check's and the broker's dry run's answers when asked for.
// As JSON it is one document (docs/using.md "Nodes and dry runs as
// JSON"); as SARIF the findings, the rest going to people on stderr.
type validateReport struct {
	*spec.Result
	Local *LocalResult `json:"local,omitempty"`
	// DryRun is the broker's answer to --dry-run.
	DryRun *nodeview.DryRun `json:"dry_run,omitempty"`

	fo     findings.Options
	dry    *gpupassv1.DryRunResponse
	url    string
	people io.Writer
}

func (r validateReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

func (r validateReport) WriteText(w io.Writer) error {
	if err := findings.Text(w, []*spec.Result{r.Result}, r.fo.Color); err != nil {
		return err
	}
	return r.writeChecks(w)
}

func (r validateReport) WriteSARIF(w io.Writer) error {
	if err := findings.SARIF(w, []*spec.Result{r.Result}, r.fo.Version); err != nil {
		return err
	}
	people := r.people
	if people == nil {
		people = io.Discard
	}
	return r.writeChecks(people)
}

// writeChecks is the local check's and the dry run's text.
func (r validateReport) writeChecks(w io.Writer) error {
	if r.Local != nil {
		if err := r.Local.WriteText(w); err != nil {
			return err
		}
	}
	if r.dry != nil {
		return writeDryRunText(w, r.url, r.dry)
	}
	return nil
}
