package gpupass

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/app/compare"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/workdir"
)

// CISteps are the steps the GitHub Action and the GitLab components run,
// by the names of the action's `command` input.
var CISteps = []string{"validate", "train", "compare-report", "bundle-push", "bundle-pull", "audit", "audit-verify"}

// CIStepOptions are the inputs of the GitHub Action and the GitLab
// components, one flag each, so every input arrives as GPUPASS_<INPUT>
// through `env:` or `variables:` and never through the script text.
type CIStepOptions struct {
	Command          string
	Spec             string
	BrokerURL        string
	BrokerToken      string
	Regions          string
	Name             string
	TrainCommand     string
	TimeLimit        string
	Workdir          string
	GitHubToken      string
	GitLabToken      string
	CommentBehavior  string
	Tag              string
	Tolerance        string
	FailOnDivergence bool
	Runs             string
	RegistryRef      string
	Wheelhouse       string
	PlainHTTP        bool
	InsecureHTTP     bool
	CosignKey        string
	CosignPassword   string
	AgentKey         string
	Allocation       string
	RunFile          string
	AuditPath        string
	ReportDir        string
	DashboardURL     string
	CodeQuality      string

	// Set by the caller.
	Global *GlobalOptions
	Getenv func(string) string
	ErrOut io.Writer
	Logger *slog.Logger
}

// AddFlags registers the step inputs.
func (o *CIStepOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Command, "command", "", "step to run: "+strings.Join(CISteps, ", "))
	f.StringVar(&o.Spec, "spec", "", "spec file (default: gpupass.yaml in the working directory)")
	f.StringVar(&o.BrokerURL, "broker-url", "", "broker URL (train; compare-report and audit with allocation ids)")
	f.StringVar(&o.BrokerToken, "broker-token", "", "broker token (train: a submit token; compare-report, audit: a read token); region-scoped tokens are separate secrets")
	f.StringVar(&o.Regions, "regions", "", "regions to train in, comma-separated (train)")
	f.StringVar(&o.Name, "name", "", "run name (train; default: the spec's name); the region and the short commit are added")
	f.StringVar(&o.TrainCommand, "train-command", "", `command each node runs (train), e.g. "python3 train.py --steps 200"; quote words with ' or ", or give a JSON list`)
	f.StringVar(&o.TimeLimit, "time-limit", "", "wall-clock limit of each run, e.g. 90m (train; overrides the spec's resources.time-limit): a run past it ends failed with TIMEOUT")
	f.StringVar(&o.Workdir, "workdir", ".", "directory shipped to each node as the command's work dir (train); empty ships nothing")
	f.StringVar(&o.GitHubToken, "github-token", "", "token for the PR comment (compare-report); needs pull-requests: write")
	f.StringVar(&o.GitLabToken, "gitlab-token", "", "project access token with api scope for the MR note (compare-report); a job token cannot post notes")
	f.StringVar(&o.CommentBehavior, "comment-behavior", "update", "existing report comment: update, new or delete-and-new (compare-report)")
	f.StringVar(&o.Tag, "tag", "compare", "report kind: one sticky comment per tag (compare-report)")
	f.StringVar(&o.Tolerance, "tolerance", "5%", "allowed loss difference: 0.05, 2% or abs=0.05,rel=2% (compare-report)")
	f.BoolVar(&o.FailOnDivergence, "fail-on-divergence", true, "fail the step when the runs diverge (compare-report)")
	f.StringVar(&o.Runs, "runs", "", "runs to compare: NAME=FILE|ALLOC or FILE entries separated by spaces or newlines, or the allocation-ids JSON of train (compare-report)")
	f.StringVar(&o.RegistryRef, "registry-ref", "", "OCI reference of the wheel bundle (bundle-push, bundle-pull)")
	f.StringVar(&o.Wheelhouse, "wheelhouse", "", "wheelhouse directory to push from or pull into (bundle-push, bundle-pull)")
	f.BoolVar(&o.PlainHTTP, "plain-http", false, "plain HTTP to a loopback test registry (bundle-push, bundle-pull)")
	f.BoolVar(&o.InsecureHTTP, "insecure-http", false, "send the broker token over plain http:// to a broker that is not on loopback (refused without it; warned of in the log)")
	f.StringVar(&o.CosignKey, "cosign-key", "", "cosign key: a file or the PEM itself; private for audit, public for audit-verify")
	f.StringVar(&o.CosignPassword, "cosign-password", "", "password of the cosign private key (audit)")
	f.StringVar(&o.AgentKey, "agent-key", "", "the node's agent public key, a file or the PEM itself (or the broker's JSON key list), that the conformance report must be signed with (audit-verify); without it that layer warns: unpinned")
	f.StringVar(&o.Allocation, "allocation", "", "allocation id to audit (audit)")
	f.StringVar(&o.RunFile, "run-file", "", "JSON run record (audit.Run) to audit offline instead of --allocation (audit)")
	f.StringVar(&o.AuditPath, "audit-path", "audit-report.zip", "audit report zip to write or verify (audit, audit-verify)")
	f.StringVar(&o.ReportDir, "report-dir", "gpupass-report", "directory for the report files: markdown, JSON, JUnit, SVG (compare-report)")
	f.StringVar(&o.DashboardURL, "dashboard-url", "", "public address of the broker's dashboard: the report links each run read from the broker to its page there (compare-report); empty links none, as broker-url may be an address only the runners reach")
	f.StringVar(&o.CodeQuality, "code-quality", "gl-code-quality-report.json", "GitLab code quality report of the spec findings (validate, on GitLab)")
	for _, s := range []string{"broker-token", "github-token", "gitlab-token", "cosign-key", "cosign-password"} {
		MarkSecret(s)
	}
}

func newCICmd(g *GlobalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ci",
		Short: "Run gpupass as a CI step (the GitHub Action and the GitLab components)",
	}
	o := &CIStepOptions{Global: g}
	step := &cobra.Command{
		Use:   "step --command STEP [flags]",
		Short: "Run one pipeline step with the action's inputs",
		Long: `Run one pipeline step (` + strings.Join(CISteps, ", ") + `)
the way the GitHub Action and the GitLab components do: inputs come as flags
or GPUPASS_<INPUT> variables, results go to step outputs (GITHUB_OUTPUT) or
to the dotenv file (GPUPASS_DOTENV, default gpupass.env) as GPUPASS_<OUTPUT>,
with a job summary, masked secrets and collapsible log sections.

Outputs: fingerprint (validate), allocation-ids (train), report-path and
verdict (compare-report), bundle-digest (bundle-push), audit-path (audit).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Getenv = os.Getenv
			o.ErrOut = cmd.ErrOrStderr()
			o.Logger = g.Logger(cmd.ErrOrStderr())
			return RunCIStep(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(step)
	cmd.AddCommand(step)
	return cmd
}

// RunCIStep runs the step named by o.Command. A library's error names
// the step's input, not the flag a CLI user would type.
func RunCIStep(ctx context.Context, o *CIStepOptions, out io.Writer) (err error) {
	defer func() {
		err = o.Global.fieldNames().inputs.Apply(err)
	}()
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.ErrOut == nil {
		o.ErrOut = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Global == nil {
		o.Global = &GlobalOptions{Output: "text"}
	}
	env := ci.Detect(o.Getenv, o.ErrOut)
	if o.Command == "" {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("input command is required: one of %s", strings.Join(CISteps, ", "))}
	}
	if !slices.Contains(CISteps, o.Command) {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("input command %q: unknown step; use one of %s", o.Command, strings.Join(CISteps, ", "))}
	}
	// The audit and bundle steps live with their commands (plugin.go).
	var plugin Plugin
	switch o.Command {
	case "audit", "audit-verify":
		plugin = o.Global.Audit
	case "bundle-push", "bundle-pull":
		plugin = o.Global.Bundle
	}
	if plugin == nil && o.Command != "validate" && o.Command != "train" && o.Command != "compare-report" {
		return fmt.Errorf("step %s: its commands are not linked into this program (build cmd/gpupass)", o.Command)
	}
	if plugin != nil {
		return plugin.CIStep(ctx, o, env, out)
	}
	// The steps moved onto their real commands run them with the CI
	// output format of the detected system (`gpupass -o github validate`).
	switch o.Command {
	case "validate":
		dir, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("finding the working directory: %w", err)
		}
		return RunValidate(ctx, &ValidateOptions{Global: o.ciGlobal(env), Spec: o.Spec, CodeQuality: o.CodeQuality, Dir: dir,
			Getenv: o.Getenv, Logger: o.Logger, ErrOut: o.ErrOut}, out)
	case "compare-report":
		return RunCompare(ctx, &CompareOptions{Runs: o.Runs, Spec: o.Spec, Tolerance: o.Tolerance, FailOnDivergence: o.FailOnDivergence,
			Tag: o.Tag, CommentBehavior: o.CommentBehavior, Post: string(compare.PostAuto), Poster: o.Global.Poster, ReportDir: o.ReportDir,
			DashboardURL: o.DashboardURL, GitHubToken: o.GitHubToken, GitLabToken: o.GitLabToken,
			Output: o.ciGlobal(env).Output, Getenv: o.Getenv, ErrOut: o.ErrOut, Logger: o.Logger, Source: brokerSource(o.Broker())}, out)
	case "train":
		spec := o.Spec
		if spec == "" {
			spec = "gpupass.yaml"
		}
		return RunTrain(ctx, &TrainOptions{Global: o.ciGlobal(env), Broker: *o.Broker(), Follow: true, CommandLine: o.TrainCommand,
			Options: apptrain.Options{Spec: spec, Regions: []string{o.Regions}, Name: o.Name, MaxRestarts: 3, MinHealthScore: api.DefaultMinHealthScore,
				TimeLimit: o.TimeLimit, Workdir: o.Workdir, NoWorkdir: o.Workdir == "", WorkdirLimits: workdir.Default(), Getenv: o.Getenv}}, out, o.ErrOut)
	}
	return nil // unreachable: the command was checked against CISteps
}

// require checks required inputs, given as name, value pairs, and names
// every missing one at once.
// Require fails the step when an input in (name, value) pairs is empty.
func (o *CIStepOptions) Require(pairs ...string) error {
	var missing []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if strings.TrimSpace(pairs[i+1]) == "" {
			missing = append(missing, pairs[i])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf("step %s: missing required input %s", o.Command, strings.Join(missing, ", "))}
}

// ciGlobal is o's global options with the CI output format of env.
func (o *CIStepOptions) ciGlobal(env *ci.Env) *GlobalOptions {
	g := *o.Global
	g.Output = string(env.Kind())
	if env.Kind() == ci.None {
		g.Output = "text"
	}
	return &g
}

// KeyFile returns a path for the cosign-key input: the file it names, or
// a private temporary file holding the PEM it carries.
func (o *CIStepOptions) KeyFile() (path string, done func(), err error) {
	return KeyFile("input cosign-key", o.CosignKey)
}

// AgentKeyFile is KeyFile for the agent-key input, which may also carry
// the broker's JSON key list.
func (o *CIStepOptions) AgentKeyFile() (path string, done func(), err error) {
	return KeyFile("input agent-key", o.AgentKey)
}

// Broker is the broker the step's inputs name (broker-url, broker-token,
// insecure-http), with the plain HTTP warning going to the step's log.
func (o *CIStepOptions) Broker() *BrokerFlags {
	return &BrokerFlags{URL: o.BrokerURL, Token: o.BrokerToken, InsecureHTTP: o.InsecureHTTP, ErrOut: o.ErrOut}
}
