package gpupass

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/report"
)

// What `gpupass compare -o github|gitlab` does besides comparing: the
// compare-report step of the GitHub Action and the GitLab components.

// ciCompareReportDir is where -o github|gitlab writes the report files
// when --report-dir is not given (the inputs' default).
const ciCompareReportDir = "gpupass-report"

// runCI runs compare as a pipeline step: the report files in
// --report-dir, the text report in the log, the report-path and verdict
// outputs, on GitLab the annotations report linking the markdown report
// among the job's artifacts; the job summary and the PR comment / MR
// note are the use case's (compare.Run).
func (o *CompareOptions) runCI(ctx context.Context, kind ci.Kind, out io.Writer) error {
	env := ci.New(kind, o.Getenv, o.ErrOut)
	// The section keeps the step's name: job logs (gpupass_compare-report)
	// and the pipelines that read them know it by that.
	defer env.Group("gpupass compare-report")()
	if len(o.Inputs)+len(o.Labels) == 0 {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("nothing to compare: set %s, e.g. us=us.jsonl eu=eu.jsonl or train's allocation-ids output", o.flag("runs"))}
	}
	// Text logs are read with the spec's metrics.pattern; the spec input
	// is set for every step and need not be there for this one.
	o.Spec = ciCompareSpec(o.Spec)
	if o.ReportDir == "" {
		o.ReportDir = ciCompareReportDir
		if err := o.reportFiles(); err != nil {
			return err
		}
	}
	res, runErr := runCompare(ctx, o)
	if res == nil {
		return runErr // no report was built: the error says why
	}
	if err := res.WriteText(out); err != nil {
		return err
	}
	if runErr == nil && o.FailOnDivergence {
		runErr = res.Divergence()
	}
	rep := res.Report
	for _, kv := range [][2]string{{"report-path", o.Markdown}, {"verdict", rep.Verdict}} {
		if err := env.SetOutput(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if env.Kind() == ci.GitLab {
		if err := gitlabAnnotations(o.Getenv, o.ReportDir, o.Markdown, rep.Verdict); err != nil {
			return err
		}
	}
	return runErr
}

// reportFiles names the report files in --report-dir that no flag of
// their own names, and creates the directory.
func (o *CompareOptions) reportFiles() error {
	if o.ReportDir == "" {
		return nil
	}
	for _, f := range []struct {
		path *string
		name string
	}{{&o.Markdown, "report.md"}, {&o.JSON, "report.json"}, {&o.JUnit, "junit.xml"}, {&o.SVG, "chart.svg"}} {
		if *f.path == "" {
			*f.path = filepath.Join(o.ReportDir, f.name)
		}
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return fmt.Errorf("creating the report directory %s: %w", o.ReportDir, err)
	}
	return nil
}

// ciCompareSpec is the spec whose metrics.pattern compare-report reads
// text logs with: the spec input when that file is there (the same input
// is set for every step, and compare-report runs need no spec), else
// compare's default, the working directory's.
func ciCompareSpec(spec string) string {
	if spec == "" {
		return ""
	}
	if fi, err := os.Stat(spec); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return spec
}

// compareInputs turns --runs into compare's labels and inputs: JSON from
// train's allocation-ids output ({"us":"alloc-1"} or a list), or
// NAME=REF / REF words.
func compareInputs(runs string) (labels, inputs []string, err error) {
	runs = strings.TrimSpace(runs)
	switch {
	case strings.HasPrefix(runs, "{"):
		var m map[string]string
		if err := json.Unmarshal([]byte(runs), &m); err != nil {
			return nil, nil, fmt.Errorf("not a JSON object of name to allocation id: %w", err)
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			labels = append(labels, k+"="+m[k])
		}
		return labels, nil, nil
	case strings.HasPrefix(runs, "["):
		if err := json.Unmarshal([]byte(runs), &inputs); err != nil {
			return nil, nil, fmt.Errorf("not a JSON list of allocation ids: %w", err)
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

// ciLinks lead from the report back to the CI run and its artifacts:
// on GitHub the run (this attempt of it) and its artifacts section, where
// the workflow's uploads (the audit zip, the report directory) are; on
// GitLab the pipeline (the audit job is one of its jobs) and the report
// directory among this job's artifacts, which the component keeps.
// Outside either, or without the variables, there are none.
func ciLinks(kind ci.Kind, getenv func(string) string, reportDir string) []report.Link {
	switch kind {
	case ci.GitHub:
		server, repo, id := getenv("GITHUB_SERVER_URL"), getenv("GITHUB_REPOSITORY"), getenv("GITHUB_RUN_ID")
		if server == "" || repo == "" || id == "" {
			return nil
		}
		run := strings.TrimRight(server, "/") + "/" + repo + "/actions/runs/" + url.PathEscape(id)
		links := []report.Link{{Label: "CI run", URL: run}}
		if a := getenv("GITHUB_RUN_ATTEMPT"); a != "" {
			links[0].URL += "/attempts/" + url.PathEscape(a)
		}
		return append(links, report.Link{Label: "artifacts", URL: run + "#artifacts"})
	case ci.GitLab:
		var links []report.Link
		if p := getenv("CI_PIPELINE_URL"); p != "" {
			links = append(links, report.Link{Label: "CI pipeline", URL: p})
		}
		if j := getenv("CI_JOB_URL"); j != "" {
			browse := j + "/artifacts/browse"
			if d := filepath.ToSlash(filepath.Clean(reportDir)); reportDir != "" && !filepath.IsAbs(reportDir) && d != "." && !strings.HasPrefix(d, "../") {
				browse += "/" + (&url.URL{Path: d}).EscapedPath()
			}
			links = append(links, report.Link{Label: "report artifacts", URL: browse})
		}
		return links
	}
	return nil
}

// gitlabAnnotations writes the annotations report GitLab shows on the
// job page: a link to the full report among the job's artifacts.
func gitlabAnnotations(getenv func(string) string, reportDir, md, verdict string) error {
	link := map[string]string{"label": "gpupass compare report: " + verdict}
	if u := getenv("CI_JOB_URL"); u != "" {
		link["url"] = u + "/artifacts/file/" + filepath.ToSlash(md)
	} else {
		return nil // nothing to link to outside a real GitLab job
	}
	doc := map[string][]map[string]map[string]string{"gpupass": {{"external_link": link}}}
	return writeFile(filepath.Join(reportDir, "annotations.json"), func(w io.Writer) error { return writeJSON(w, doc) })
}
