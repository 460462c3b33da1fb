package gpupass

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/forge"
	ghforge "github.com/gpupass/gpupass/internal/forge/github"
	glforge "github.com/gpupass/gpupass/internal/forge/gitlab"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
)

// MetricsSource fetches the metric series of an allocation (the broker's
// runs API). The broker side must return the points in logging order with
// step, value and UTC time, the run start, restarts, the price per hour
// when known, the region as Label, and Simulated for simulated hardware.
type MetricsSource interface {
	Metrics(ctx context.Context, allocID, metric string) (*metrics.Series, error)
}

// CompareOptions are the flags of `gpupass compare`.
type CompareOptions struct {
	Labels           []string
	Prices           []string
	Metric           string
	Tolerance        string
	FailOnDivergence bool
	AllowRunning     bool
	Tag              string
	CommentBehavior  string
	Post             string
	SVG              string
	PNG              string
	JUnit            string
	JSON             string
	Markdown         string
	GitHubToken      string
	GitLabToken      string

	// Set by the caller, not by flags.
	Inputs []string
	Output string // text | json
	Getenv func(string) string
	// Source resolves allocation ids; nil until the broker client exists.
	Source     MetricsSource
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Observe, when set, receives the report once it is built (ci step
	// reads the verdict from it).
	Observe func(*report.Report)
}

// AddFlags registers the compare flags.
func (o *CompareOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringArrayVar(&o.Labels, "label", nil, "name a run: NAME=INPUT (file or allocation id); repeatable")
	f.StringArrayVar(&o.Prices, "price", nil, "hardware price of a run in USD per hour: NAME=3.5; repeatable")
	f.StringVar(&o.Metric, "metric", "", "metric key, CSV column or TensorBoard tag (default: the training loss)")
	f.StringVar(&o.Tolerance, "tolerance", "5%", "allowed loss difference at every common step: 0.05 (absolute), 2% (relative) or abs=0.05,rel=2%")
	f.BoolVar(&o.FailOnDivergence, "fail-on-divergence", false, "exit 1 when runs diverge past the tolerance or cannot be compared")
	f.BoolVar(&o.AllowRunning, "allow-running", false, "compare allocations that have not ended yet on their partial curves (default: refuse, the figures are not final)")
	f.StringVar(&o.Tag, "tag", "compare", "report kind: one sticky comment per tag")
	f.StringVar(&o.CommentBehavior, "comment-behavior", "update", "existing comment: update, new or delete-and-new")
	f.StringVar(&o.Post, "post", "auto", "where to post: auto (detect CI), github, gitlab or none")
	f.StringVar(&o.SVG, "svg", "", "write the chart as SVG to this path")
	f.StringVar(&o.PNG, "png", "", "write the chart as PNG to this path")
	f.StringVar(&o.JUnit, "junit", "", "write JUnit XML (one test case per pair and tolerance) to this path")
	f.StringVar(&o.JSON, "json", "", "write the report as JSON to this path")
	f.StringVar(&o.Markdown, "markdown", "", "write the full markdown report to this path (keep it as an artifact: long comments are truncated)")
	f.StringVar(&o.GitHubToken, "github-token", "", "token for PR comments (default $GITHUB_TOKEN); needs pull-requests: write")
	f.StringVar(&o.GitLabToken, "gitlab-token", "", "project access token for MR notes (default $GITLAB_TOKEN); a job token cannot post notes")
	MarkSecret("github-token")
	MarkSecret("gitlab-token")
}

func newCompareCmd(g *GlobalOptions) *cobra.Command {
	o := &CompareOptions{}
	broker := &BrokerFlags{}
	cmd := &cobra.Command{
		Use:   "compare FILE|ALLOC...",
		Short: "Compare loss curves of runs across regions and post the report",
		Long: `Compare the training loss of several runs (gpupass JSONL or training logs with
gpupass:metric lines, Lightning CSVLogger metrics.csv, TensorBoard event files
or directories, allocation ids) at common steps, and render a verdict against
--tolerance as markdown with a Mermaid chart, SVG, JSON and JUnit.

Allocation ids are read from the broker (--broker-url, or the config that
` + "`gpupass up`" + ` left): the series as the run logged it, labelled by region,
with price per hour, restarts and start time from the run record. A run
that has not ended is refused unless --allow-running. A run whose log the
broker marked disputed (a seq sent twice with different content) makes
every verdict it is part of inconclusive: its figures are not proof.

In GitHub Actions on a pull request, and in GitLab merge request pipelines,
the report is posted as one sticky comment per --tag; $GITHUB_STEP_SUMMARY is
always written when set. Exit codes: 0 consistent (or no --fail-on-divergence),
1 diverged or not comparable with --fail-on-divergence, 2 bad input or I/O.`,
		Example: `  gpupass compare --label us=runs/us/metrics.jsonl --label eu=runs/eu/metrics.csv
  gpupass compare us.jsonl eu.jsonl --tolerance abs=0.05,rel=2% --fail-on-divergence --svg chart.svg --junit compare.xml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Inputs = args
			o.Output = g.Output
			o.Getenv = os.Getenv
			o.Logger = g.Logger(cmd.ErrOrStderr())
			if o.needsBroker() {
				// After `gpupass up` its config names the broker, as for
				// every other broker command.
				if err := broker.fromLocal(); err != nil {
					return err
				}
			}
			if broker.URL != "" {
				o.Source = &BrokerMetrics{Broker: broker} // allocation ids
			}
			return RunCompare(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	broker.AddFlags(cmd)
	return cmd
}

type input struct {
	label, ref string
	price      float64
}

// needsBroker says whether some input is an allocation id rather than a
// file.
func (o *CompareOptions) needsBroker() bool {
	refs := append([]string(nil), o.Inputs...)
	for _, l := range o.Labels {
		_, ref, _ := strings.Cut(l, "=")
		refs = append(refs, ref)
	}
	for _, ref := range refs {
		if _, err := os.Stat(ref); err != nil && looksLikeAlloc(ref) {
			return true
		}
	}
	return false
}

// RunNotDoneError is a MetricsSource's answer for an allocation that has
// not ended: its figures (final loss, cost, wall time) are not final yet.
// Series holds the points logged so far.
type RunNotDoneError struct {
	ID, Region, State string
	Series            *metrics.Series
}

func (e *RunNotDoneError) Error() string {
	wait := fmt.Sprintf("`gpupass logs %s --follow` waits for it", e.ID)
	if e.Series == nil || len(e.Series.Points) == 0 {
		return fmt.Sprintf("%s (%s) is still %s and has logged no metrics yet; compare it once it has ended (%s)", e.ID, e.Region, e.State, wait)
	}
	p := e.Series.Points
	return fmt.Sprintf("%s (%s) is still %s (%d points so far, last step %d): its final figures are not known yet; compare it once it has ended (%s), or pass --allow-running to compare the partial curve",
		e.ID, e.Region, e.State, len(p), p[len(p)-1].Step, wait)
}

// resolveInputs pairs each input with its label and price.
func (o *CompareOptions) resolveInputs() ([]input, error) {
	var ins []input
	index := map[string]int{}
	add := func(ref string) int {
		if i, ok := index[ref]; ok {
			return i
		}
		ins = append(ins, input{ref: ref})
		index[ref] = len(ins) - 1
		return len(ins) - 1
	}
	for _, ref := range o.Inputs {
		add(ref)
	}
	labelled := map[string]bool{}
	for _, l := range o.Labels {
		name, ref, ok := strings.Cut(l, "=")
		if !ok || name == "" || ref == "" {
			return nil, fmt.Errorf("--label %q: want NAME=INPUT, e.g. --label us=runs/us/metrics.jsonl", l)
		}
		if labelled[name] {
			return nil, fmt.Errorf("--label %q: the name %q is given twice; each run needs its own", l, name)
		}
		labelled[name] = true
		ins[add(ref)].label = name
	}
	if len(ins) == 0 {
		return nil, errors.New("nothing to compare: give metric files or allocation ids, e.g. gpupass compare us.jsonl eu.jsonl")
	}
	for _, p := range o.Prices {
		name, v, ok := strings.Cut(p, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f < 0 {
			return nil, fmt.Errorf("--price %q: want NAME=USD_PER_HOUR, e.g. --price us=3.5", p)
		}
		found := false
		for i := range ins {
			if ins[i].label == name || (ins[i].label == "" && defaultLabel(ins[i].ref) == name) {
				ins[i].price, found = f, true
			}
		}
		if !found {
			return nil, fmt.Errorf("--price %q: no run named %q", p, name)
		}
	}
	return ins, nil
}

// defaultLabel names a file run: the file name without extension, or the
// directory name when the file name is a logger default (metrics.csv,
// events.out.tfevents.*).
func defaultLabel(ref string) string {
	base := filepath.Base(ref)
	stem := strings.TrimSuffix(base, filepath.Ext(base))
	switch {
	case strings.HasPrefix(base, "events.out.tfevents"), stem == "metrics", stem == "train", stem == "loss", stem == "log":
		if d := filepath.Base(filepath.Dir(ref)); d != "." && d != "/" {
			return d
		}
	}
	return stem
}

func (o *CompareOptions) load(ctx context.Context, ins []input) ([]*metrics.Series, error) {
	series := make([]*metrics.Series, len(ins))
	errs := make([]error, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() {
			s, err := o.loadOne(ctx, in)
			series[i], errs[i] = s, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return series, nil
}

func (o *CompareOptions) loadOne(ctx context.Context, in input) (*metrics.Series, error) {
	var s *metrics.Series
	if _, err := os.Stat(in.ref); err == nil {
		s, err = metrics.ReadFile(in.ref, metrics.Options{Metric: o.Metric})
		if err != nil {
			return nil, err
		}
		if in.label == "" {
			s.Label = defaultLabel(in.ref)
		}
	} else {
		if !looksLikeAlloc(in.ref) {
			return nil, fmt.Errorf("%s: no such file", in.ref)
		}
		if o.Source == nil {
			return nil, fmt.Errorf("%s: no such file, and allocation ids need the broker: pass --broker-url and --broker-token, or run `gpupass up` first (or export the run's metrics to a file and pass that)", in.ref)
		}
		s, err = o.Source.Metrics(ctx, in.ref, o.Metric)
		var notDone *RunNotDoneError
		if errors.As(err, &notDone) {
			if !o.AllowRunning || notDone.Series == nil || len(notDone.Series.Points) == 0 {
				return nil, err
			}
			s, err = notDone.Series, nil
			s.Notes = append(s.Notes, fmt.Sprintf("%s was still %s when compared: its figures are partial", in.ref, notDone.State))
		}
		if err != nil {
			if strings.HasPrefix(err.Error(), in.ref+":") {
				return nil, err // already names the allocation
			}
			return nil, fmt.Errorf("fetching metrics of %s: %w", in.ref, err)
		}
		s.Normalize()
		if s.Label == "" {
			s.Label = in.ref
		}
	}
	if in.label != "" {
		s.Label = in.label
	}
	if in.price > 0 {
		s.PricePerHour = in.price
	}
	return s, nil
}

// disambiguate names allocations that share their default label (two runs
// in one region) by region and id; explicit --label names and file labels
// are left alone, so a clash there stays an error that names the fix.
func disambiguate(ins []input, series []*metrics.Series) {
	count := map[string]int{}
	for _, s := range series {
		count[s.Label]++
	}
	for i, s := range series {
		if ins[i].label == "" && count[s.Label] > 1 && looksLikeAlloc(ins[i].ref) && s.Label != ins[i].ref {
			s.Label += " " + ins[i].ref
		}
	}
}

func looksLikeAlloc(ref string) bool {
	return strings.HasPrefix(ref, "alloc-") && !strings.ContainsAny(ref, `/\.`)
}

// compareJSON is what --output json prints: the report and what posting did.
type compareJSON struct {
	*report.Report
	Posted *forge.Result `json:"posted,omitempty"`
}

// RunCompare reads the inputs, builds the report, writes the requested
// files, posts to the forge and prints the report on out.
func RunCompare(ctx context.Context, o *CompareOptions, out io.Writer) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	tol, err := report.ParseTolerance(o.Tolerance)
	var te *report.ToleranceError
	if errors.As(err, &te) {
		return fmt.Errorf("--tolerance %q: %s", te.Value, te.Problem)
	}
	if err != nil {
		return err
	}
	behavior, err := forge.ParseBehavior(o.CommentBehavior)
	if err != nil {
		return err
	}
	switch o.Post {
	case "auto", "github", "gitlab", "none":
	default:
		return fmt.Errorf("--post %q: must be auto, github, gitlab or none", o.Post)
	}
	ins, err := o.resolveInputs()
	if err != nil {
		return err
	}
	series, err := o.load(ctx, ins)
	if err != nil {
		return err
	}
	disambiguate(ins, series)
	for _, s := range series {
		if s.Problems.Count > 0 {
			log.Warn("skipped malformed input", "run", s.Label, "source", s.Source, "problems", s.Problems.String())
		}
	}
	rep, err := report.Build(series, tol)
	if err != nil {
		return err
	}
	if o.Observe != nil {
		o.Observe(rep)
	}
	var md bytes.Buffer
	if err := report.Markdown(&md, rep); err != nil {
		return err
	}
	files := []struct {
		path   string
		render func(io.Writer, *report.Report) error
	}{
		{o.Markdown, func(w io.Writer, _ *report.Report) error { _, err := w.Write(md.Bytes()); return err }},
		{o.JSON, report.JSON}, {o.SVG, report.SVG}, {o.PNG, report.PNG}, {o.JUnit, report.JUnit},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if err := writeFile(f.path, func(w io.Writer) error { return f.render(w, rep) }); err != nil {
			return err
		}
	}
	if p := getenv("GITHUB_STEP_SUMMARY"); p != "" {
		if err := appendFile(p, md.Bytes()); err != nil {
			return fmt.Errorf("writing GITHUB_STEP_SUMMARY: %w", err)
		}
	}
	posted, postErr := o.post(ctx, getenv, behavior, md.String(), log)
	if o.Output == "json" {
		if err := report.EncodeJSON(out, compareJSON{Report: rep, Posted: posted}); err != nil {
			return err
		}
	} else if _, err := out.Write(md.Bytes()); err != nil {
		return err
	}
	if postErr != nil {
		return postErr
	}
	if posted != nil {
		log.Info("report posted", "action", posted.Action, "reason", posted.Reason, "url", posted.URL)
	}
	if o.FailOnDivergence && rep.Verdict != report.Consistent {
		var why []string
		for _, p := range rep.Pairs {
			if p.Error != "" {
				why = append(why, p.Error)
			}
		}
		for _, r := range rep.Runs {
			if r.Disputed != "" {
				why = append(why, r.Label+": "+r.Disputed)
			}
		}
		if rep.Verdict == report.Inconclusive && len(why) > 0 {
			return Findings(fmt.Errorf("runs cannot be compared: %s", strings.Join(why, "; ")))
		}
		return Findings(fmt.Errorf("runs %s (tolerance %s)", rep.Verdict, rep.Tolerance))
	}
	return nil
}

func (o *CompareOptions) post(ctx context.Context, getenv func(string) string, b forge.Behavior, md string, log *slog.Logger) (*forge.Result, error) {
	mode := o.Post
	if mode == "none" {
		return nil, nil
	}
	if mode == "auto" {
		switch {
		case getenv("GITHUB_ACTIONS") == "true":
			mode = "github"
		case getenv("GITLAB_CI") == "true":
			mode = "gitlab"
		default:
			return nil, nil
		}
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	rt := hc.Transport
	if _, ok := rt.(*forge.Retry); !ok {
		// Each try is bounded, not the whole: a client timeout would
		// also count the waits a Retry-After asks for.
		c := *hc
		c.Transport = &forge.Retry{Base: rt, Logger: log, AttemptTimeout: 30 * time.Second}
		hc = &c
	}
	full := "the job log"
	if o.Markdown != "" {
		full = "`" + filepath.Base(o.Markdown) + "` among the job's artifacts"
	}
	var store forge.Store
	var meta forge.Meta
	switch mode {
	case "github":
		tgt, run, ok, err := ghforge.FromEnv(getenv)
		if err != nil {
			return nil, err
		}
		if !ok {
			if o.Post == "auto" {
				log.Info("not a pull request event: nothing posted")
				return nil, nil
			}
			return nil, errors.New("--post github: the workflow was not triggered by a pull request (no pull_request in GITHUB_EVENT_PATH)")
		}
		token := firstNonEmpty(o.GitHubToken, getenv("GITHUB_TOKEN"))
		c, err := ghforge.New(tgt, token, hc)
		if err != nil {
			return nil, err
		}
		store, meta = c, forge.Meta{Tag: o.Tag, RunID: run.RunID, SHA: run.SHA}
	case "gitlab":
		tgt, run, ok, err := glforge.FromEnv(getenv)
		if err != nil {
			return nil, err
		}
		if !ok {
			if o.Post == "auto" {
				log.Info("not a merge request pipeline: nothing posted")
				return nil, nil
			}
			return nil, errors.New("--post gitlab: not a merge request pipeline (CI_MERGE_REQUEST_IID is not set)")
		}
		token := firstNonEmpty(o.GitLabToken, getenv("GITLAB_TOKEN"))
		if token == "" && getenv("CI_JOB_TOKEN") != "" {
			return nil, errors.New("only CI_JOB_TOKEN is available: " + glforge.TokenHelp)
		}
		c, err := glforge.New(tgt, token, hc)
		if err != nil {
			return nil, err
		}
		store, meta = c, forge.Meta{Tag: o.Tag, RunID: run.PipelineID, SHA: run.SHA, CommitTime: run.CommitTime}
	}
	body := forge.Compose(meta, md, forge.MaxChars-1, full)
	res, err := forge.Post(ctx, store, meta, body, b)
	if err != nil {
		return nil, fmt.Errorf("posting the report to %s: %w", mode, err)
	}
	return &res, nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

func writeFile(path string, render func(io.Writer) error) error {
	var b bytes.Buffer
	if err := render(&b); err != nil {
		return err
	}
	// Rendered in full first, then replaced atomically, so a failed or
	// killed run never leaves half a report.
	return fsutil.WriteFileAtomic(path, b.Bytes(), 0o644)
}

func appendFile(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
