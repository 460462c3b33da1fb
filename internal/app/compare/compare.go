// Package compare is the compare use case: read the metric series of
// several runs (files, or allocation ids through a Source), build the
// report against a tolerance, write the requested files, and post the
// report to the forge of the CI it runs in (through a Poster: the forge
// clients live in compare/forgepost). It returns a typed Result;
// rendering it (markdown or JSON) is Render's job, choosing the exit code
// the caller's (Result.Divergence). No cobra, no flag names: bad options
// are *fielderr.Error naming the Options field.
package compare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/spec"
)

// Source fetches the metric series of an allocation (the broker's runs
// API). It must return the points in logging order with step, value and
// UTC time, the run start, restarts, the price per hour when known, the
// region as Label, and Simulated for simulated hardware; a run that has
// not ended is a *RunNotDoneError.
type Source interface {
	Metrics(ctx context.Context, allocID, metric string) (*metrics.Series, error)
}

// Input is one run to compare: a metrics file or an allocation id, with an optional
// name (default: the file's stem, or the allocation's region).
type Input struct {
	Name string
	Ref  string
}

// Price is the hardware price of the run named Name, in USD per hour.
type Price struct {
	Name    string
	PerHour float64
}

// Files are the paths to write the report to; empty ones are skipped.
type Files struct {
	Markdown, JSON, SVG, PNG, JUnit string
	// Chart says how the SVG and PNG draw (a log y axis).
	Chart report.ChartOptions
}

// PostMode says where the report is posted.
type PostMode string

// The post modes.
const (
	PostAuto   PostMode = "auto" // detect the CI: GitHub Actions or GitLab CI
	PostGitHub PostMode = "github"
	PostGitLab PostMode = "gitlab"
	PostNone   PostMode = "none"
)

// ParsePostMode checks a post mode.
func ParsePostMode(s string) (PostMode, error) {
	switch m := PostMode(s); m {
	case PostAuto, PostGitHub, PostGitLab, PostNone:
		return m, nil
	}
	return "", fielderr.New("Post", s, "must be auto, github, gitlab or none")
}

// Destination is where a report with post mode m goes: github, gitlab or
// none. Auto is the forge of the CI that getenv describes.
func Destination(m PostMode, getenv func(string) string) PostMode {
	switch m {
	case PostGitHub, PostGitLab:
		return m
	case PostAuto:
		switch {
		case getenv("GITHUB_ACTIONS") == "true":
			return PostGitHub
		case getenv("GITLAB_CI") == "true":
			return PostGitLab
		}
	}
	return PostNone
}

// Poster posts a report's markdown md to forge `to` (github or gitlab)
// as the sticky comment of o.Tag, and says what it did; nil, nil when
// there is nothing to post to (o.Post auto and no pull or merge
// request). o's Getenv and Logger are set. The forge clients cost every
// process that links them start-up time, so they are not linked here:
// forgepost.Poster is the implementation.
type Poster interface {
	Post(ctx context.Context, to PostMode, o Options, md string) (*forge.Result, error)
}

// FieldPullRequest is the Options field naming the pull or merge
// request to comment on (fielderr.Error.Field).
const FieldPullRequest = "PullRequest"

// ErrNoPoster: the options say to post, and no Poster was given.
var ErrNoPoster = errors.New("the report is to be posted to a forge and no Poster was given")

// Options say what to compare and where the report goes.
type Options struct {
	// Runs are compared in this order; a Ref given twice is one run.
	Runs   []Input
	Prices []Price
	// Metric is a metric key, CSV column or TensorBoard tag; empty is
	// the training loss.
	Metric string
	// MetricPattern finds the metric in text logs (metrics.Pattern);
	// empty uses the pattern of SpecFile, else the built-in forms.
	MetricPattern string
	// SpecFile is a spec whose metrics.pattern applies when
	// MetricPattern is empty; empty for none.
	SpecFile  string
	Tolerance report.Tolerance
	// AllowRunning compares allocations that have not ended on their
	// partial curves.
	AllowRunning bool
	// Partial reports on runs that have not ended instead of refusing
	// them: an in-progress report (report.InProgress) with each run's
	// state and figures so far. When every run has ended the report is
	// the verdict, as without it.
	Partial bool
	Files   Files
	Post    PostMode // empty is PostNone
	// Tag names the sticky comment (one per tag); Behavior says what
	// happens to an existing one.
	Tag         string
	Behavior    forge.Behavior
	GitHubToken string // default $GITHUB_TOKEN
	GitLabToken string // default $GITLAB_TOKEN
	// PullRequest is the pull request (GitHub) or merge request iid
	// (GitLab) of the CI's own repository or project to comment on when
	// the CI event names none (a workflow started by the broker's
	// webhook: the event's ci.pull_request); 0: none.
	PullRequest int64

	// Getenv reads the CI's variables (event, tokens, step summary).
	Getenv func(string) string
	// Poster posts the report when Post resolves to a forge
	// (Destination); nil is an error then (ErrNoPoster).
	Poster Poster
	// Source resolves allocation ids; nil means files only.
	Source Source
	// Links go at the end of the report (report.Link): the CI run and
	// its artifacts, say. Runs read from the broker also get a link to
	// their page on DashboardURL, the broker's public address, when it
	// is set: the URL the runs were read from may be internal.
	Links        []report.Link
	DashboardURL string
	HTTPClient   *http.Client
	Logger       *slog.Logger
}

// Result is the report, its markdown and what posting did.
type Result struct {
	Report *report.Report
	// Markdown is the full report as markdown (what WriteText prints
	// as text and the forge comment is composed from).
	Markdown []byte
	// Posted is nil when nothing was posted.
	Posted *forge.Result
}

// Run reads the inputs, builds the report, writes the files and posts
// it. A posting error comes with a non-nil Result: the report was built
// and written, and the caller may still render it.
func Run(ctx context.Context, o Options) (*Result, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if o.Post == "" {
		o.Post = PostNone
	}
	if o.PullRequest < 0 {
		return nil, fielderr.New(FieldPullRequest, fmt.Sprint(o.PullRequest), "must be a pull or merge request number, or 0 for the CI event's own")
	}
	if _, err := ParsePostMode(string(o.Post)); err != nil {
		return nil, err
	}
	if o.Behavior == "" {
		o.Behavior = forge.Update
	}
	// Checked before any work: a report built only to fail would leave
	// files behind that a forwarded run writes again.
	to := Destination(o.Post, getenv)
	if to != PostNone && o.Poster == nil {
		return nil, ErrNoPoster
	}
	runs, err := expandGroups(ctx, o.Runs, o.Source)
	if err != nil {
		return nil, err
	}
	ins, err := resolveInputs(runs, o.Prices)
	if err != nil {
		return nil, err
	}
	pat, err := metricPattern(o.MetricPattern, o.SpecFile)
	if err != nil {
		return nil, err
	}
	series, err := load(ctx, o, pat, ins)
	if err != nil {
		return nil, err
	}
	disambiguate(ins, series)
	for _, s := range series {
		if s.Problems.Count > 0 {
			log.Warn("skipped malformed input", "run", s.Label, "source", s.Source, "problems", s.Problems.String())
		}
	}
	build := report.Build
	for _, s := range series {
		if s.Running {
			build = report.BuildProgress
		}
	}
	rep, err := build(series, o.Tolerance)
	if err != nil {
		return nil, err
	}
	rep.Links = append(append([]report.Link(nil), o.Links...), DashboardLinks(o.DashboardURL, rep.Runs)...)
	var md bytes.Buffer
	if err := report.Markdown(&md, rep); err != nil {
		return nil, err
	}
	files := []struct {
		path   string
		render func(io.Writer, *report.Report) error
	}{
		{o.Files.Markdown, func(w io.Writer, _ *report.Report) error { _, err := w.Write(md.Bytes()); return err }},
		{o.Files.JSON, report.JSON}, {o.Files.SVG, o.Files.Chart.SVG}, {o.Files.PNG, o.Files.Chart.PNG}, {o.Files.JUnit, report.JUnit},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if err := writeFile(f.path, func(w io.Writer) error { return f.render(w, rep) }); err != nil {
			return nil, err
		}
	}
	if p := getenv("GITHUB_STEP_SUMMARY"); p != "" {
		if err := appendFile(p, md.Bytes()); err != nil {
			return nil, fmt.Errorf("writing GITHUB_STEP_SUMMARY: %w", err)
		}
	}
	res := &Result{Report: rep, Markdown: md.Bytes()}
	if to == PostNone {
		return res, nil
	}
	o.Getenv, o.Logger = getenv, log
	posted, err := o.Poster.Post(ctx, to, o, md.String())
	if err != nil {
		return res, err
	}
	res.Posted = posted
	if posted != nil {
		log.Info("report posted", "action", posted.Action, "reason", posted.Reason, "url", posted.URL)
	}
	return res, nil
}

// Divergence is nil when the runs are consistent, else a findings error
// (exit code 1) that says why: the pairs that could not be compared and
// the disputed logs, or the verdict against the tolerance. An
// in-progress report (Options.Partial) is no verdict: nil.
func (r *Result) Divergence() error {
	rep := r.Report
	if rep.Verdict == report.Consistent || rep.Verdict == report.InProgress {
		return nil
	}
	var why []string
	for _, p := range rep.Pairs {
		if p.Error != "" {
			why = append(why, p.Error)
		}
	}
	for _, run := range rep.Runs {
		if run.Disputed != "" {
			why = append(why, run.Label+": "+run.Disputed)
		}
	}
	if rep.Verdict == report.Inconclusive && len(why) > 0 {
		return &exitcode.Error{Code: exitcode.Findings, Err: fmt.Errorf("runs cannot be compared: %s", strings.Join(why, "; "))}
	}
	return &exitcode.Error{Code: exitcode.Findings, Err: fmt.Errorf("runs %s (tolerance %s)", rep.Verdict, rep.Tolerance)}
}

// jsonResult is the JSON rendering: the report and what posting did.
type jsonResult struct {
	*report.Report
	Posted *forge.Result `json:"posted,omitempty"`
}

// WriteText writes r as text: the markdown report.
func (r *Result) WriteText(w io.Writer) error {
	_, err := w.Write(r.Markdown)
	return err
}

// WriteJSON writes r as JSON: the report (in the form of its --json
// file) and what posting did.
func (r *Result) WriteJSON(w io.Writer) error {
	return report.EncodeJSON(w, jsonResult{Report: r.Report, Posted: r.Posted})
}

// DashboardLinks are the dashboard pages of the runs read from the
// broker: /ui/runs/ID on base when it is given (--dashboard-url), else
// the page the broker named for each run (its --public-url), else none.
func DashboardLinks(base string, runs []report.Run) []report.Link {
	var out []report.Link
	for _, r := range runs {
		id, ok := strings.CutPrefix(r.Source, "broker:")
		if !ok {
			continue
		}
		page := r.DashboardURL
		if base != "" {
			page = strings.TrimRight(base, "/") + "/ui/runs/" + url.PathEscape(id)
		}
		if page != "" {
			out = append(out, report.Link{Label: "run " + r.Label, URL: page})
		}
	}
	return out
}

// RunNotDoneError is a Source's answer for an allocation that has not
// ended: its figures (final loss, cost, wall time) are not final yet.
// Series holds the points logged so far.
type RunNotDoneError struct {
	ID, Region, State string
	Series            *metrics.Series
	// Allow says how to compare the partial curve anyway; the command
	// layer sets it to its flag or input (NameAllowRunning).
	Allow string
}

// NameAllowRunning sets Allow on every *RunNotDoneError in err's tree
// (Run returns one per run, joined), so the message names the option as
// the user gives it ("pass --allow-running"). Run never wraps them with
// fmt.Errorf, whose message is fixed when made.
func NameAllowRunning(err error, allow string) {
	walkErrors(err, func(e error) {
		if rn, ok := e.(*RunNotDoneError); ok {
			rn.Allow = allow
		}
	})
}

// NamePatternOption sets PatternOption on every *metrics.EmptyError in
// err's tree, so "no loss values found" names the option that takes a
// metric pattern as the user gives it ("--metric-pattern").
func NamePatternOption(err error, name string) {
	walkErrors(err, func(e error) {
		if ee, ok := e.(*metrics.EmptyError); ok {
			ee.PatternOption = name
		}
	})
}

// walkErrors calls f on err and every error in its tree.
func walkErrors(err error, f func(error)) {
	if err == nil {
		return
	}
	f(err)
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walkErrors(e, f)
		}
	case interface{ Unwrap() error }:
		walkErrors(u.Unwrap(), f)
	}
}

func (e *RunNotDoneError) Error() string {
	wait := fmt.Sprintf("`gpupass logs %s --follow` waits for it", e.ID)
	if e.Series == nil || len(e.Series.Points) == 0 {
		return fmt.Sprintf("%s (%s) is still %s and has logged no metrics yet; compare it once it has ended (%s)", e.ID, e.Region, e.State, wait)
	}
	allow := e.Allow
	if allow == "" {
		allow = "set AllowRunning"
	}
	p := e.Series.Points
	return fmt.Sprintf("%s (%s) is still %s (%d points so far, last step %d): its final figures are not known yet; compare it once it has ended (%s), or %s to compare the partial curve",
		e.ID, e.Region, e.State, len(p), p[len(p)-1].Step, wait, allow)
}

// metricPattern compiles the pattern given, else the spec's
// metrics.pattern; nil when there is none.
func metricPattern(expr, specFile string) (*metrics.Pattern, error) {
	if expr != "" {
		p, err := metrics.CompilePattern(expr)
		if err != nil {
			return nil, &fielderr.Error{Field: FieldMetricPattern, Value: expr, Problem: err.Error()}
		}
		return p, nil
	}
	if specFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(specFile)
	if err != nil {
		return nil, fmt.Errorf("reading the spec for its metrics.pattern: %w", err)
	}
	doc, _ := spec.Parse(specFile, data)
	if doc == nil || doc.Spec.Metrics.Pattern == "" {
		// A spec that does not parse is validate's business; compare
		// only needs the pattern, and there is none to use.
		return nil, nil
	}
	p, err := metrics.CompilePattern(doc.Spec.Metrics.Pattern)
	if err != nil {
		at := doc.At("metrics.pattern")
		return nil, fmt.Errorf("%s:%d:%d: metrics.pattern: %w", specFile, at.Line, at.Column, err)
	}
	return p, nil
}

// FieldMetricPattern is the field of a bad Options.MetricPattern.
const FieldMetricPattern = "MetricPattern"

func load(ctx context.Context, o Options, pat *metrics.Pattern, ins []input) ([]*metrics.Series, error) {
	series := make([]*metrics.Series, len(ins))
	errs := make([]error, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() {
			series[i], errs[i] = loadOne(ctx, o, pat, in)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return series, nil
}

// ErrNoSource is an allocation id given without a Source to read it.
var ErrNoSource = errors.New("no such file, and allocation ids need the broker")

func loadOne(ctx context.Context, o Options, pat *metrics.Pattern, in input) (*metrics.Series, error) {
	var s *metrics.Series
	if _, err := os.Stat(in.ref); err == nil {
		s, err = metrics.ReadFile(in.ref, metrics.Options{Metric: o.Metric, Pattern: pat})
		if err != nil {
			return nil, err
		}
		if in.label == "" {
			s.Label = defaultLabel(in.ref)
		}
	} else {
		if !LooksLikeAlloc(in.ref) {
			return nil, fmt.Errorf("%s: no such file", in.ref)
		}
		if o.Source == nil {
			return nil, fmt.Errorf("%s: %w", in.ref, ErrNoSource)
		}
		s, err = o.Source.Metrics(ctx, in.ref, o.Metric)
		var notDone *RunNotDoneError
		if errors.As(err, &notDone) && o.Partial && notDone.Series != nil {
			// Where the run stands, even before its first point.
			s, err = notDone.Series, nil
			s.Running = true
		} else if errors.As(err, &notDone) {
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
