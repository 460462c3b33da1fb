package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/app/validate"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/report"
)

// CompareOptions are the flags of `gpupass compare`.
type CompareOptions struct {
	Labels           []string
	Prices           []string
	Metric           string
	MetricPattern    string
	Spec             string
	Tolerance        string
	FailOnDivergence bool
	AllowRunning     bool
	Partial          bool
	Tag              string
	CommentBehavior  string
	Post             string
	SVG              string
	PNG              string
	LogY             bool
	DashboardURL     string
	JUnit            string
	JSON             string
	Markdown         string
	GitHubToken      string
	GitLabToken      string
	PullRequest      int64
	// Runs are more runs as one string: NAME=INPUT and INPUT words, or
	// train's allocation-ids output (JSON), as the CI inputs pass them.
	Runs string
	// ReportDir gets the report files (report.md, report.json,
	// junit.xml, chart.svg) that no flag of their own names.
	ReportDir string
	// MetricsRank is the rank of a run across several nodes whose
	// metrics are read (default 0, the run's own).
	MetricsRank int

	// Set by the caller, not by flags.
	Inputs []string
	Output output.Format
	Getenv func(string) string
	// runsGiven says that --runs was set: its words joined Labels and
	// Inputs (expandRuns), so an error about a run names both flags.
	runsGiven bool
	// ErrOut receives the CI log group markers (-o github|gitlab).
	ErrOut io.Writer
	// Poster posts the report (the forge clients, linked in by
	// cmd/gpupass); nil refuses to post (compare.ErrNoPoster).
	Poster compare.Poster
	// Source resolves allocation ids; nil until the broker client exists.
	Source     compare.Source
	HTTPClient *http.Client
	Logger     *slog.Logger
}

// AddFlags registers the compare flags.
func (o *CompareOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringArrayVar(&o.Labels, "label", nil, "name a run: NAME=INPUT (file or allocation id); repeatable")
	f.StringArrayVar(&o.Prices, "price", nil, "hardware price of a run in USD per hour: NAME=3.5; repeatable")
	f.StringVar(&o.Metric, "metric", "", "metric key, CSV column, TensorBoard tag or MLflow key, or the name before the number in a text log (default: the training loss)")
	f.StringVar(&o.MetricPattern, "metric-pattern", "", "Go regular expression (RE2) that finds the value in text log lines: a named group (?P<loss>…) or (?P<value>…), optionally (?P<step>…) (default: the spec's metrics.pattern, else `loss 1.23`, `loss=1.23`, `loss: 1.23`, `'loss': 1.23`)")
	f.StringVar(&o.Spec, "spec", "", "spec whose metrics.pattern reads text logs when --metric-pattern is not given (default: gpupass.yaml, or lightning-cloud.yaml, in the working directory, when there)")
	f.StringVar(&o.Tolerance, "tolerance", "5%", "allowed loss difference at every common step: 0.05 (absolute), 2% (relative) or abs=0.05,rel=2%")
	f.BoolVar(&o.FailOnDivergence, "fail-on-divergence", false, "exit 1 when runs diverge past the tolerance or cannot be compared")
	f.BoolVar(&o.AllowRunning, "allow-running", false, "compare allocations that have not ended yet on their partial curves (default: refuse, the figures are not final)")
	f.BoolVar(&o.Partial, "partial", false, "when some run has not ended, report where each stands (state, last step, last loss, the curves so far) under \"in progress\" and exit 0 instead of refusing; once every run has ended, the verdict as without it")
	f.StringVar(&o.Tag, "tag", "compare", "report kind: one sticky comment per tag")
	f.StringVar(&o.CommentBehavior, "comment-behavior", "update", "existing comment: update, new or delete-and-new")
	f.StringVar(&o.Post, "post", "auto", "where to post: auto (detect CI), github, gitlab or none")
	f.StringVar(&o.SVG, "svg", "", "write the chart as SVG to this path")
	f.StringVar(&o.PNG, "png", "", "write the chart as PNG to this path")
	f.StringVar(&o.DashboardURL, "dashboard-url", "", "public address of the broker's dashboard: the report links each run read from the broker to its page there (empty: the page the broker names, when it has a --public-url, else none)")
	f.BoolVar(&o.LogY, "log-y", false, "draw the SVG/PNG chart's loss axis on a log scale (default: only when the values span two decades or more)")
	f.StringVar(&o.JUnit, "junit", "", "write JUnit XML (one test case per pair and tolerance) to this path")
	f.StringVar(&o.JSON, "json", "", "write the report as JSON to this path")
	f.StringVar(&o.Markdown, "markdown", "", "write the full markdown report to this path (keep it as an artifact: long comments are truncated)")
	f.StringVar(&o.Runs, "runs", "", "runs to compare as one value: NAME=INPUT and INPUT words separated by spaces or newlines (a run group id stands for its runs), or the allocation-ids JSON of train (as CI inputs pass them)")
	f.StringVar(&o.ReportDir, "report-dir", "", "write report.md, report.json, junit.xml and chart.svg into this directory, unless --markdown, --json, --junit or --svg name their own (default with --output github or gitlab: "+ciCompareReportDir+")")
	f.Int64Var(&o.PullRequest, "pull-request", 0, "pull request (GitHub) or merge request iid (GitLab) of the CI's repository to comment on when the CI event names none, e.g. the ci.pull_request of the broker's webhook event (0: the event's)")
	f.IntVar(&o.MetricsRank, "metrics-rank", 0, "for runs across several nodes: read the metrics of this rank (default 0, the run's own; the job logs them from the rank it chooses)")
	f.StringVar(&o.GitHubToken, "github-token", "", "token for PR comments (default $GITHUB_TOKEN); needs pull-requests: write")
	f.StringVar(&o.GitLabToken, "gitlab-token", "", "project access token for MR notes (default $GITLAB_TOKEN); a job token cannot post notes")
	MarkSecret("github-token")
	MarkSecret("gitlab-token")
}

func newCompareCmd(g *GlobalOptions) *cobra.Command {
	o := &CompareOptions{}
	broker := &BrokerFlags{}
	cmd := &cobra.Command{
		Use:   "compare FILE|ALLOC|GROUP...",
		Short: "Compare loss curves of runs across regions and post the report",
		Long: `Compare the training loss of several runs (gpupass JSONL or training logs with
gpupass:metric lines, Lightning CSVLogger metrics.csv, TensorBoard event files
or directories, MLflow file-store runs (mlruns/<experiment>/<run>), allocation
ids) at common steps, and render a verdict against --tolerance as markdown with
a Mermaid chart, SVG, JSON and JUnit.

A script's own log needs no change: lines such as ` + "`loss 7.89`, `loss=7.89`, `Loss: 7.89`" + `
or a printed dict ` + "`{'loss': 7.89}`" + ` (train_loss too; val/valid/eval/test losses are
not the training loss) are read, the step taken from ` + "`step N`/`iter N`" + `, else
` + "`epoch E`" + ` with an ` + "`N/M`" + ` batch position, else the line's order; the report's
notes say which, and how many lines had a value. --metric-pattern (or the
spec's metrics.pattern) reads any other form.

Allocation ids are read from the broker (--broker-url, or the config that
` + "`gpupass up`" + ` left): the series as the run logged it, labelled by region,
with price per hour, restarts and start time from the run record. A run
group id (group-…, as gpupass train prints it; --runs takes it too) stands
for the group's runs, each labelled by its region. A run
that has not ended is refused unless --allow-running (compare its curve so
far) or --partial. With --partial such runs give an in-progress report: each
run's state, last step, last loss and curve so far, headed "in progress", no
verdict and exit code 0; it goes to the same sticky comment as the verdict,
which replaces it once every run has ended (--partial then gives exactly the
verdict; over --allow-running, --partial decides). A run whose log the
broker marked disputed (a seq sent twice with different content) makes
every verdict it is part of inconclusive: its figures are not proof.

In GitHub Actions on a pull request, and in GitLab merge request pipelines,
the report is posted as one sticky comment per --tag; $GITHUB_STEP_SUMMARY is
always written when set. Exit codes: 0 consistent, in progress (--partial) or
no --fail-on-divergence,
1 diverged or not comparable with --fail-on-divergence, 2 bad input or I/O.`,
		Example: `  gpupass compare --label us=runs/us/metrics.jsonl --label eu=runs/eu/metrics.csv
  gpupass compare us.jsonl eu.jsonl --tolerance abs=0.05,rel=2% --fail-on-divergence --svg chart.svg --junit compare.xml
  gpupass compare us/train.log eu/train.log --metric-pattern '\| loss\s+(?P<loss>\S+) \|'
  gpupass compare us/mlruns eu/mlruns
  gpupass compare group-3f9a1c0d5e7b2a41
  gpupass compare --partial group-3f9a1c0d5e7b2a41`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Inputs = args
			o.Output = g.Output
			o.Getenv = os.Getenv
			o.ErrOut = cmd.ErrOrStderr()
			o.Logger = g.Logger(cmd.ErrOrStderr())
			o.Poster = g.Poster
			if err := o.expandRuns(); err != nil {
				return err
			}
			if o.needsBroker() {
				// After `gpupass up` its config names the broker, as for
				// every other broker command.
				if err := broker.fromLocal(); err != nil {
					return err
				}
			}
			if broker.URL != "" {
				src := brokerSource(broker) // allocation ids
				src.Rank = o.MetricsRank
				o.Source = src
			}
			return RunCompare(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	broker.AddFlags(cmd)
	return CICommand(cmd)
}

// expandRuns adds --runs to the positional inputs and labels, once.
func (o *CompareOptions) expandRuns() error {
	labels, inputs, err := compareInputs(o.Runs)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s: %w", o.flag("runs"), err)}
	}
	if o.Runs != "" {
		o.runsGiven = true
	}
	o.Labels, o.Inputs, o.Runs = append(o.Labels, labels...), append(o.Inputs, inputs...), ""
	return nil
}

// flag names one of compare's flags for the user, with its CI input
// under -o github|gitlab (CIFlag).
func (o *CompareOptions) flag(name string) string {
	return CIFlag(o.Output, name)
}

// needsBroker says whether some input is an allocation id rather than a
// file.
func (o *CompareOptions) needsBroker() bool {
	runs, err := o.runs()
	return err == nil && compare.NeedsSource(runs)
}

// runs turns the positional inputs and --label NAME=INPUT into the use
// case's inputs.
func (o *CompareOptions) runs() ([]compare.Input, error) {
	var runs []compare.Input
	for _, ref := range o.Inputs {
		runs = append(runs, compare.Input{Ref: ref})
	}
	for _, l := range o.Labels {
		name, ref, ok := strings.Cut(l, "=")
		if !ok || name == "" || ref == "" {
			return nil, fmt.Errorf("--label %q: want NAME=INPUT, e.g. --label us=runs/us/metrics.jsonl", l)
		}
		runs = append(runs, compare.Input{Name: name, Ref: ref})
	}
	return runs, nil
}

// prices parses --price NAME=USD_PER_HOUR.
func (o *CompareOptions) prices() ([]compare.Price, error) {
	var ps []compare.Price
	for _, p := range o.Prices {
		name, v, ok := strings.Cut(p, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f < 0 {
			return nil, fmt.Errorf("--price %q: want NAME=USD_PER_HOUR, e.g. --price us=3.5", p)
		}
		ps = append(ps, compare.Price{Name: name, PerHour: f})
	}
	return ps, nil
}

// brokerSource reads allocation ids from the broker the flags name.
func brokerSource(b *BrokerFlags) *compare.BrokerSource {
	return &compare.BrokerSource{Dial: b.DialRuns, URL: b.URL}
}

// compareFlagNames maps the use case's option fields to compare's flags.
var compareFlagNames = fielderr.Names{"Runs": "--label", "Prices": "--price", "Post": "--post", compare.FieldMetricPattern: "--metric-pattern", compare.FieldPullRequest: "--pull-request", compare.FieldMetricsRank: "--metrics-rank"}

// specFile is the spec whose metrics.pattern compare uses: --spec, else
// the working directory's spec when there is one.
func (o *CompareOptions) specFile() string {
	if o.Spec != "" || o.MetricPattern != "" {
		return o.Spec
	}
	for _, n := range validate.SpecFileNames {
		if fi, err := os.Stat(n); err == nil && fi.Mode().IsRegular() {
			return n
		}
	}
	return ""
}

// options turns the flags into the use case's options.
func (o *CompareOptions) options() (compare.Options, error) {
	tol, err := report.ParseTolerance(o.Tolerance)
	var te *report.ToleranceError
	if errors.As(err, &te) {
		return compare.Options{}, fmt.Errorf("%s %q: %s", o.flag("tolerance"), te.Value, te.Problem)
	}
	if err != nil {
		return compare.Options{}, err
	}
	behavior, err := forge.ParseBehavior(o.CommentBehavior)
	if err != nil {
		return compare.Options{}, err
	}
	post, err := compare.ParsePostMode(o.Post)
	if err != nil {
		return compare.Options{}, compareFlagNames.Apply(err)
	}
	runs, err := o.runs()
	if err != nil {
		return compare.Options{}, err
	}
	prices, err := o.prices()
	if err != nil {
		return compare.Options{}, err
	}
	if o.DashboardURL != "" {
		if _, ok := report.LinkURL(o.DashboardURL); !ok {
			return compare.Options{}, fmt.Errorf("--dashboard-url %q: not an http:// or https:// URL (the dashboard's public address, e.g. https://gpupass.example.com)", o.DashboardURL)
		}
	}
	// In a CI job the report links back to it: the run (or pipeline)
	// and the artifacts the --markdown file is kept among.
	var links []report.Link
	if o.Getenv != nil {
		reportDir := ""
		if o.Markdown != "" {
			reportDir = filepath.Dir(o.Markdown)
		}
		kind, ok := CIOutput(o.Output)
		if !ok {
			kind = ci.Detect(o.Getenv, io.Discard).Kind()
		}
		links = ciLinks(kind, o.Getenv, reportDir)
	}
	return compare.Options{
		Links: links, DashboardURL: o.DashboardURL,
		Runs: runs, Prices: prices, Metric: o.Metric, MetricPattern: o.MetricPattern, SpecFile: o.specFile(),
		Tolerance: tol, AllowRunning: o.AllowRunning, Partial: o.Partial,
		Files: compare.Files{Markdown: o.Markdown, JSON: o.JSON, SVG: o.SVG, PNG: o.PNG, JUnit: o.JUnit, Chart: report.ChartOptions{LogY: o.LogY}},
		Post:  post, Tag: o.Tag, Behavior: behavior, GitHubToken: o.GitHubToken, GitLabToken: o.GitLabToken, PullRequest: o.PullRequest,
		Getenv: o.Getenv, Poster: o.Poster, Source: o.Source, HTTPClient: o.HTTPClient, Logger: o.Logger,
	}, nil
}

// RunCompare runs the compare use case with the flags, prints the report
// on out and turns divergence into exit code 1 with --fail-on-divergence.
func RunCompare(ctx context.Context, o *CompareOptions, out io.Writer) error {
	if err := o.expandRuns(); err != nil {
		return err
	}
	if err := o.reportFiles(); err != nil {
		return err
	}
	if kind, ok := CIOutput(o.Output); ok {
		return o.runCI(ctx, kind, out)
	}
	res, err := runCompare(ctx, o)
	if res == nil {
		return err
	}
	if rerr := output.Write(out, o.Output, res); rerr != nil {
		return rerr
	}
	if err != nil {
		return err // posting failed after the report was written
	}
	if o.FailOnDivergence {
		return res.Divergence()
	}
	return nil
}

// runCompare runs the use case and words its errors for the CLI.
func runCompare(ctx context.Context, o *CompareOptions) (*compare.Result, error) {
	opts, err := o.options()
	if err != nil {
		return nil, err
	}
	res, err := compare.Run(ctx, opts)
	compare.NameAllowRunning(err, "pass --allow-running")
	compare.NamePatternOption(err, "--metric-pattern")
	switch {
	case errors.Is(err, compare.ErrNothing):
		err = fmt.Errorf("%w, e.g. gpupass compare us.jsonl eu.jsonl", err)
	case errors.Is(err, compare.ErrNoSource):
		err = fmt.Errorf("%w: pass %s and %s, or run `gpupass up` first (or export the run's metrics to a file and pass that)", err, o.flag("broker-url"), o.flag("broker-token"))
	}
	names := compareFlagNames
	if _, isCI := CIOutput(o.Output); isCI {
		names = maps.Clone(names)
		names["Runs"] = o.flag("runs")
		names[compare.FieldPullRequest] = o.flag("pull-request")
	} else if o.runsGiven {
		// --runs words join --label's: the run named may be in either.
		names = maps.Clone(names)
		names["Runs"] = "--label or --runs"
	}
	return res, names.Apply(err)
}
