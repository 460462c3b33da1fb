package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/ci"
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
	CosignKey        string
	CosignPassword   string
	Allocation       string
	RunFile          string
	AuditPath        string
	ReportDir        string
	CodeQuality      string

	// Set by the caller.
	Global *GlobalOptions
	Getenv func(string) string
	Setenv func(key, value string) error
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
	f.StringVar(&o.CosignKey, "cosign-key", "", "cosign key: a file or the PEM itself; private for audit, public for audit-verify")
	f.StringVar(&o.CosignPassword, "cosign-password", "", "password of the cosign private key (audit)")
	f.StringVar(&o.Allocation, "allocation", "", "allocation id to audit (audit)")
	f.StringVar(&o.RunFile, "run-file", "", "JSON run record (audit.Run) to audit offline instead of --allocation (audit)")
	f.StringVar(&o.AuditPath, "audit-path", "audit-report.zip", "audit report zip to write or verify (audit, audit-verify)")
	f.StringVar(&o.ReportDir, "report-dir", "gpupass-report", "directory for the report files: markdown, JSON, JUnit, SVG (compare-report)")
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
			o.Setenv = os.Setenv
			o.ErrOut = cmd.ErrOrStderr()
			o.Logger = g.Logger(cmd.ErrOrStderr())
			return RunCIStep(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(step)
	cmd.AddCommand(step)
	return cmd
}

// RunCIStep runs the step named by o.Command.
func RunCIStep(ctx context.Context, o *CIStepOptions, out io.Writer) error {
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
	end := env.Group("gpupass " + o.Command)
	defer end()
	switch o.Command {
	case "validate":
		return o.validate(ctx, env, out)
	case "train":
		return o.train(ctx, env, out)
	case "compare-report":
		return o.compare(ctx, env, out)
	case "bundle-push":
		return o.bundlePush(ctx, env, out)
	case "bundle-pull":
		if err := o.require("registry-ref", o.RegistryRef, "wheelhouse", o.Wheelhouse); err != nil {
			return err
		}
		return o.dispatch(ctx, out, o.bundleFlags("bundle", "pull", o.RegistryRef, "--to", o.Wheelhouse)...)
	case "audit":
		return o.audit(ctx, env, out)
	case "audit-verify":
		if err := o.require("cosign-key", o.CosignKey); err != nil {
			return err
		}
		key, done, err := o.keyFile()
		if err != nil {
			return err
		}
		defer done()
		return o.dispatch(ctx, out, "audit", "verify", o.AuditPath, "--key", key)
	}
	return nil // unreachable: the command was checked against CISteps
}

// require checks required inputs, given as name, value pairs, and names
// every missing one at once.
func (o *CIStepOptions) require(pairs ...string) error {
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

// newDispatchRoot is NewRoot, set at init: the root lists `ci` among its
// commands, so a direct reference would be an initialization cycle.
var newDispatchRoot func() *cobra.Command

func init() { newDispatchRoot = NewRoot }

// dispatch runs a gpupass command line in this process, so every step is
// the very command a user would type.
func (o *CIStepOptions) dispatch(ctx context.Context, out io.Writer, args ...string) error {
	root := newDispatchRoot()
	if o.Global.Verbose {
		args = append(args, "--verbose")
	}
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(o.ErrOut)
	return root.ExecuteContext(ctx)
}

// hideCI hides the CI variables from a command whose output is only read
// back, so it sets no outputs and prints no annotations of its own.
func hideCI(getenv func(string) string) func(string) string {
	return func(k string) string {
		switch k {
		case "GITHUB_ACTIONS", "GITLAB_CI", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY":
			return ""
		}
		return getenv(k)
	}
}

func (o *CIStepOptions) validate(ctx context.Context, env *ci.Env, out io.Writer) error {
	// Read the result quietly first, for the outputs and the report files.
	var doc bytes.Buffer
	q := &ValidateOptions{Global: o.Global, Spec: o.Spec, Format: "json", Getenv: hideCI(o.Getenv), Logger: o.Logger}
	qerr := RunValidate(ctx, q, &doc)
	var res struct {
		File        string `json:"file"`
		Valid       bool   `json:"valid"`
		Fingerprint string `json:"fingerprint"`
	}
	if doc.Len() > 0 {
		if err := json.Unmarshal(doc.Bytes(), &res); err != nil {
			return fmt.Errorf("reading the validate report: %w", err)
		}
	}
	// Then the visible run: findings in the log, annotations on the spec's
	// lines and the fingerprint step output on GitHub.
	v := &ValidateOptions{Global: o.Global, Spec: o.Spec, Getenv: o.Getenv, Logger: o.Logger, ErrOut: o.ErrOut}
	verr := RunValidate(ctx, v, out)
	if qerr != nil && doc.Len() == 0 {
		return verr // the spec could not be read: one error, not two
	}
	if env.Kind() == ci.GitLab {
		// GitLab shows code quality findings on the merge request's diff.
		g := &ValidateOptions{Global: o.Global, Spec: o.Spec, Format: "gitlab", Getenv: hideCI(o.Getenv), Logger: o.Logger}
		if err := writeFile(o.CodeQuality, func(w io.Writer) error {
			if err := RunValidate(ctx, g, w); err != nil && Findings(err) == nil {
				return err
			}
			return nil
		}); err != nil {
			return err
		}
		if res.Fingerprint != "" {
			if err := env.SetOutput("fingerprint", res.Fingerprint); err != nil {
				return err
			}
		}
	}
	if res.Valid {
		if err := env.Summary(fmt.Sprintf("### ✅ gpupass validate\n\n`%s` is valid.\n\nFingerprint: `%s`\n", res.File, res.Fingerprint)); err != nil {
			return err
		}
	} else if res.File != "" {
		if err := env.Summary(fmt.Sprintf("### ❌ gpupass validate\n\n`%s` has errors: see the annotations.\n", res.File)); err != nil {
			return err
		}
	}
	return verr
}

// compareInputs turns the runs input into compare's labels and inputs:
// JSON from train's allocation-ids output ({"us":"alloc-1"} or a list), or
// NAME=REF / REF words.
func compareInputs(runs string) (labels, inputs []string, err error) {
	runs = strings.TrimSpace(runs)
	switch {
	case strings.HasPrefix(runs, "{"):
		var m map[string]string
		if err := json.Unmarshal([]byte(runs), &m); err != nil {
			return nil, nil, fmt.Errorf("input runs: not a JSON object of name to allocation id: %w", err)
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			labels = append(labels, k+"="+m[k])
		}
		return labels, nil, nil
	case strings.HasPrefix(runs, "["):
		if err := json.Unmarshal([]byte(runs), &inputs); err != nil {
			return nil, nil, fmt.Errorf("input runs: not a JSON list of allocation ids: %w", err)
		}
		return nil, inputs, nil
	}
	for _, w := range strings.Fields(runs) {
		if strings.Contains(w, "=") {
			labels = append(labels, w)
		} else {
			inputs = append(inputs, w)
		}
	}
	return labels, inputs, nil
}

func (o *CIStepOptions) compare(ctx context.Context, env *ci.Env, out io.Writer) error {
	if err := o.require("runs", o.Runs); err != nil {
		return err
	}
	labels, inputs, err := compareInputs(o.Runs)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return fmt.Errorf("creating the report directory: %w", err)
	}
	md := filepath.Join(o.ReportDir, "report.md")
	js := filepath.Join(o.ReportDir, "report.json")
	c := &CompareOptions{
		Labels: labels, Inputs: inputs,
		Tolerance: o.Tolerance, FailOnDivergence: o.FailOnDivergence,
		Tag: o.Tag, CommentBehavior: o.CommentBehavior, Post: "auto",
		Markdown: md, JSON: js,
		JUnit:       filepath.Join(o.ReportDir, "junit.xml"),
		SVG:         filepath.Join(o.ReportDir, "chart.svg"),
		GitHubToken: o.GitHubToken, GitLabToken: o.GitLabToken,
		Output: "text", Getenv: o.Getenv, Logger: o.Logger,
		// Allocation ids (train's output) are read from the broker; a
		// local `gpupass up` stack is found without the inputs.
		Source: &BrokerMetrics{Broker: &BrokerFlags{URL: o.BrokerURL, Token: o.BrokerToken}},
	}
	runErr := RunCompare(ctx, c, out)
	b, err := os.ReadFile(js)
	if err != nil {
		return runErr // no report was written: the error says why
	}
	var rep struct {
		Verdict string `json:"verdict"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("reading %s: %w", js, err)
	}
	for _, kv := range [][2]string{{"report-path", md}, {"verdict", rep.Verdict}} {
		if err := env.SetOutput(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if env.Kind() == ci.GitLab {
		if err := o.gitlabAnnotations(md, rep.Verdict); err != nil {
			return err
		}
	}
	return runErr
}

// gitlabAnnotations writes the annotations report GitLab shows on the
// job page: a link to the full report among the job's artifacts.
func (o *CIStepOptions) gitlabAnnotations(md, verdict string) error {
	link := map[string]string{"label": "gpupass compare report: " + verdict}
	if u := o.Getenv("CI_JOB_URL"); u != "" {
		link["url"] = u + "/artifacts/file/" + filepath.ToSlash(md)
	} else {
		return nil // nothing to link to outside a real GitLab job
	}
	doc := map[string][]map[string]map[string]string{"gpupass": {{"external_link": link}}}
	return writeFile(filepath.Join(o.ReportDir, "annotations.json"), func(w io.Writer) error { return writeJSON(w, doc) })
}

func (o *CIStepOptions) bundleFlags(args ...string) []string {
	if o.PlainHTTP {
		args = append(args, "--plain-http")
	}
	return args
}

func (o *CIStepOptions) bundlePush(ctx context.Context, env *ci.Env, out io.Writer) error {
	if err := o.require("registry-ref", o.RegistryRef, "wheelhouse", o.Wheelhouse); err != nil {
		return err
	}
	args := o.bundleFlags("bundle", "push", o.RegistryRef, "--wheelhouse", o.Wheelhouse, "--output", "json")
	if o.Spec != "" {
		args = append(args, "--spec", o.Spec)
	}
	var doc bytes.Buffer
	err := o.dispatch(ctx, &doc, args...)
	if _, werr := out.Write(doc.Bytes()); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	var res struct {
		Reference string `json:"reference"`
		Digest    string `json:"digest"`
	}
	if err := json.Unmarshal(doc.Bytes(), &res); err != nil {
		return fmt.Errorf("reading the bundle push result: %w", err)
	}
	if err := env.SetOutput("bundle-digest", res.Digest); err != nil {
		return err
	}
	return env.Summary(fmt.Sprintf("### gpupass bundle push\n\nPushed `%s`\n", res.Reference))
}

func (o *CIStepOptions) audit(ctx context.Context, env *ci.Env, out io.Writer) error {
	if o.Allocation == "" && o.RunFile == "" {
		return o.require("allocation", "")
	}
	if err := o.require("cosign-key", o.CosignKey); err != nil {
		return err
	}
	key, done, err := o.keyFile()
	if err != nil {
		return err
	}
	defer done()
	if o.CosignPassword != "" && o.Setenv != nil {
		// The signer reads the password from COSIGN_PASSWORD, as cosign does.
		if err := o.Setenv("COSIGN_PASSWORD", o.CosignPassword); err != nil {
			return err
		}
	}
	args := []string{"audit", "--out", o.AuditPath, "--key", key}
	if o.Allocation != "" {
		args = append(args, o.brokerArgs()...)
	}
	if o.RunFile != "" {
		args = append(args, "--run-file", o.RunFile)
	}
	if o.Allocation != "" {
		args = append(args, o.Allocation)
	}
	if err := o.dispatch(ctx, out, args...); err != nil {
		return err
	}
	return env.SetOutput("audit-path", o.AuditPath)
}

// brokerArgs passes the broker inputs on to a command that reads runs
// from the broker.
func (o *CIStepOptions) brokerArgs() []string {
	var args []string
	if o.BrokerURL != "" {
		args = append(args, "--broker-url", o.BrokerURL)
	}
	if o.BrokerToken != "" {
		args = append(args, "--broker-token", o.BrokerToken)
	}
	return args
}

// keyFile returns a path for the cosign-key input: the file it names, or
// a private temporary file holding the PEM it carries.
func (o *CIStepOptions) keyFile() (path string, done func(), err error) {
	k := o.CosignKey
	if !strings.Contains(k, "-----BEGIN") {
		if _, err := os.Stat(k); err != nil {
			// Never echo the value: it may be a mangled secret.
			return "", nil, errors.New("input cosign-key: neither a readable file nor a PEM key")
		}
		return k, func() {}, nil
	}
	f, err := os.CreateTemp("", "gpupass-cosign-*.key") // mode 0600
	if err != nil {
		return "", nil, fmt.Errorf("writing the cosign key: %w", err)
	}
	done = func() { os.Remove(f.Name()) }
	_, err = f.WriteString(k + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		done()
		return "", nil, fmt.Errorf("writing the cosign key: %w", err)
	}
	return f.Name(), done, nil
}
