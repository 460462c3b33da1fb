package gpupass

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/output"
)

// writeMetrics writes a gpupass JSONL loss series whose loss is offset
// from a common curve by delta.
func writeMetrics(t *testing.T, path string, delta float64) string {
	t.Helper()
	var b strings.Builder
	for step := 0; step <= 100; step += 10 {
		fmt.Fprintf(&b, "{\"step\":%d,\"loss\":%g}\n", step, 3.0-float64(step)/50+delta)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// stepInputs are a pipeline step's inputs (the action's names), which
// the tests pass to the real command as its flags.
type stepInputs struct {
	Command, Spec, GitHubToken, BrokerToken, CosignKey, Runs, Tolerance, Tag, CommentBehavior, ReportDir, CodeQuality, DashboardURL, GitLabToken string
	FailOnDivergence                                                                                                                             bool
	Global                                                                                                                                       *GlobalOptions
	Getenv                                                                                                                                       func(string) string
	ErrOut                                                                                                                                       io.Writer
}

// TestRunCIStep runs each step as the GitHub Action and the GitLab
// components do: the real command with -o github or -o gitlab.
func TestRunCIStep(t *testing.T) {
	t.Parallel()
	starter, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "starter", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const secret = "tok-must-not-leak-9f3"
	tests := []struct {
		name     string
		kind     string // github | gitlab
		opts     stepInputs
		spec     string // gpupass.yaml content; "" = none
		wantCode int
		// wantFile: path (relative to the work dir) -> substrings.
		wantFile map[string][]string
		wantLog  []string
	}{
		{name: "validate on GitHub sets the fingerprint and summary", kind: "github", spec: string(starter),
			opts:     stepInputs{Command: "validate", GitHubToken: secret},
			wantFile: map[string][]string{"output": {"fingerprint<<", "sha256:"}, "summary": {"gpupass validate", "is valid", "sha256:"}},
			wantLog:  []string{"::group::gpupass validate", "::endgroup::"}},
		{name: "validate on GitLab writes dotenv and code quality", kind: "gitlab", spec: string(starter),
			opts:     stepInputs{Command: "validate"},
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_FINGERPRINT=sha256:"}, "gl-code-quality-report.json": {"[]"}},
			wantLog:  []string{"section_start:", "section_end:"}},
		{name: "invalid spec fails with findings and code quality", kind: "gitlab", spec: "version: 1\nruntime: 7\n",
			opts: stepInputs{Command: "validate"}, wantCode: ExitFindings,
			wantFile: map[string][]string{"gl-code-quality-report.json": {`"check_name"`, "gpupass.yaml"}}},
		{name: "missing spec is one usage error", kind: "github", opts: stepInputs{Command: "validate"}, wantCode: ExitUsage},
		{name: "train without its inputs", kind: "github", opts: stepInputs{Command: "train", BrokerToken: secret}, wantCode: ExitUsage},
		{name: "compare-report consistent", kind: "github",
			opts:     stepInputs{Command: "compare-report", Runs: "us=us.jsonl eu=eu.jsonl", Tolerance: "5%", FailOnDivergence: true, Tag: "compare", CommentBehavior: "update", ReportDir: "rep", GitHubToken: secret},
			wantFile: map[string][]string{"output": {"verdict<<", "consistent", "report-path<<", "rep/report.md"}, "summary": {"gpupass compare: consistent"}, "rep/junit.xml": {"<testsuite"}, "rep/chart.svg": {"<svg"}}},
		{name: "compare-report diverged fails and still hands off the verdict", kind: "gitlab",
			opts:     stepInputs{Command: "compare-report", Runs: "us=us.jsonl far=far.jsonl", Tolerance: "abs=0.01", FailOnDivergence: true, Tag: "compare", CommentBehavior: "update", ReportDir: "rep"},
			wantCode: ExitFindings,
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_VERDICT=diverged", "GPUPASS_REPORT_PATH=rep/report.md"},
				"rep/annotations.json": {`"label": "gpupass compare report: diverged"`, `"url": "https://gitlab.invalid/g/p/-/jobs/7/artifacts/file/`}}},
		{name: "compare-report reads text logs with the spec's metrics.pattern", kind: "github",
			spec:     string(starter) + "metrics:\n  pattern: 'it=(?P<step>\\d+) xent (?P<loss>\\S+)'\n",
			opts:     stepInputs{Command: "compare-report", Runs: "us=us.log eu=eu.log", Tolerance: "5%", FailOnDivergence: true, Tag: "compare", CommentBehavior: "update", ReportDir: "rep"},
			wantFile: map[string][]string{"rep/report.md": {"| 2.5 ", "1..3 (3 pts)", "step: the pattern's step group"}}},
		{name: "compare-report without runs", kind: "gitlab", opts: stepInputs{Command: "compare-report"}, wantCode: ExitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeMetrics(t, filepath.Join(dir, "us.jsonl"), 0)
			writeMetrics(t, filepath.Join(dir, "eu.jsonl"), 0.001)
			writeMetrics(t, filepath.Join(dir, "far.jsonl"), 0.5)
			for _, name := range []string{"us.log", "eu.log"} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("it=1 xent 2.9\nit=2 xent 2.7\nit=3 xent 2.5\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.spec != "" {
				if err := os.WriteFile(filepath.Join(dir, "gpupass.yaml"), []byte(tt.spec), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			env := map[string]string{}
			if tt.kind == "github" {
				env = map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": filepath.Join(dir, "output"), "GITHUB_STEP_SUMMARY": filepath.Join(dir, "summary")}
			} else {
				env = map[string]string{"GITLAB_CI": "true", "GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"), "CI_JOB_URL": "https://gitlab.invalid/g/p/-/jobs/7"}
			}
			o := tt.opts
			o.Getenv = func(k string) string { return env[k] }
			var out, log bytes.Buffer
			o.ErrOut = &log
			// compare-report posts in CI: with the forge clients linked
			// in, as cmd/gpupass runs it.
			o.Global = &GlobalOptions{Output: "text", Poster: forgepost.Poster{}}
			// Paths are relative to the job's directory, as in CI.
			o.Spec = filepath.Join(dir, "gpupass.yaml")
			o.Runs = prefixRuns(o.Runs, dir)
			if o.ReportDir != "" {
				o.ReportDir = filepath.Join(dir, o.ReportDir)
			}
			o.CodeQuality = filepath.Join(dir, "gl-code-quality-report.json")
			err := runStep(context.Background(), &o, ci.Kind(tt.kind), &out)
			if got := ExitCode(err); got != tt.wantCode {
				t.Fatalf("exit code %d (err %v), want %d\nstdout:\n%s\nlog:\n%s", got, err, tt.wantCode, out.String(), log.String())
			}
			for file, subs := range tt.wantFile {
				b, rerr := os.ReadFile(filepath.Join(dir, file))
				if rerr != nil {
					t.Errorf("%s: %v", file, rerr)
					continue
				}
				got := strings.ReplaceAll(string(b), dir+string(filepath.Separator), "")
				for _, s := range subs {
					if !strings.Contains(got, s) {
						t.Errorf("%s lacks %q:\n%s", file, s, got)
					}
				}
			}
			for _, s := range tt.wantLog {
				if !strings.Contains(log.String(), s) {
					t.Errorf("log lacks %q:\n%s", s, log.String())
				}
			}
			all := out.String() + log.String()
			if err != nil {
				all += err.Error()
			}
			if strings.Contains(all, secret) {
				t.Errorf("a secret reached the output:\n%s", all)
			}
		})
	}
}

// runStep runs the step o.Command names as the GitHub Action and the
// GitLab components run it: the real command with -o github or -o
// gitlab, o's inputs as its flags.
func runStep(ctx context.Context, o *stepInputs, kind ci.Kind, out io.Writer) error {
	g := *o.Global
	g.Output = output.Format(kind)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	switch o.Command {
	case "validate":
		dir := filepath.Dir(o.Spec)
		return RunValidate(ctx, &ValidateOptions{Global: &g, Spec: o.Spec, CodeQuality: o.CodeQuality, Dir: dir, Getenv: o.Getenv, ErrOut: o.ErrOut, Logger: quiet}, out)
	case "compare-report":
		return RunCompare(ctx, compareStep(o, kind), out)
	case "train":
		return RunTrain(ctx, &TrainOptions{Global: &g, Broker: BrokerFlags{Token: o.BrokerToken}, Follow: true, Options: apptrain.Options{Spec: o.Spec, Getenv: o.Getenv}}, out, o.ErrOut)
	}
	return fmt.Errorf("no step %s", o.Command)
}

// compareStep is `gpupass -o KIND compare` with o's inputs as its flags
// (and the action's default of --post).
func compareStep(o *stepInputs, kind ci.Kind) *CompareOptions {
	return &CompareOptions{Runs: o.Runs, Spec: o.Spec, Tolerance: o.Tolerance, FailOnDivergence: o.FailOnDivergence, Tag: o.Tag,
		CommentBehavior: o.CommentBehavior, Post: "auto", Poster: o.Global.Poster, ReportDir: o.ReportDir, DashboardURL: o.DashboardURL,
		GitHubToken: o.GitHubToken, GitLabToken: o.GitLabToken, Output: output.Format(kind), Getenv: o.Getenv, ErrOut: o.ErrOut,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func prefixRuns(runs, dir string) string {
	var out []string
	for _, w := range strings.Fields(runs) {
		name, ref, ok := strings.Cut(w, "=")
		if ok {
			out = append(out, name+"="+filepath.Join(dir, ref))
		} else {
			out = append(out, filepath.Join(dir, w))
		}
	}
	return strings.Join(out, " ")
}

func TestCompareInputs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in                  string
		wantLabels, wantIns []string
		wantErr             bool
	}{
		{in: `{"us":"alloc-1","eu":"alloc-2"}`, wantLabels: []string{"eu=alloc-2", "us=alloc-1"}},
		{in: `["alloc-1","alloc-2"]`, wantIns: []string{"alloc-1", "alloc-2"}},
		{in: "us=a.jsonl\n eu=b.csv c.jsonl", wantLabels: []string{"us=a.jsonl", "eu=b.csv"}, wantIns: []string{"c.jsonl"}},
		{in: `{"us":`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			l, i, err := compareInputs(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantLabels, l); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantIns, i); diff != "" {
				t.Errorf("inputs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBadToleranceNamesFlagOrInput: the report package says what is wrong
// with a tolerance; `gpupass compare` names the flag the user typed and,
// as a CI step (-o github), also the variable and the input that set it.
func TestBadToleranceNamesFlagOrInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us, eu := filepath.Join(dir, "us.jsonl"), filepath.Join(dir, "eu.jsonl")
	writeMetrics(t, us, 0)
	writeMetrics(t, eu, 0.001)
	const problem = `"abs=5%": abs takes a plain number, not a percentage`

	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"compare", us, eu, "--tolerance", "abs=5%"}, strings.NewReader(""), &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "--tolerance "+problem) {
		t.Errorf("gpupass compare --tolerance abs=5%%: exit %d, stderr %q; want %d naming --tolerance and %s", code, errb.String(), ExitUsage, problem)
	}

	o := &stepInputs{Command: "compare-report", Runs: us + " " + eu, Tolerance: "abs=5%", ReportDir: filepath.Join(dir, "rep"),
		Getenv: func(string) string { return "" }, Global: &GlobalOptions{}}
	err := RunCompare(context.Background(), compareStep(o, ci.GitHub), &bytes.Buffer{})
	if ExitCode(err) != ExitUsage || !strings.Contains(fmt.Sprint(err), "--tolerance (GPUPASS_TOLERANCE, the tolerance input) "+problem) {
		t.Errorf("gpupass -o github compare with GPUPASS_TOLERANCE=abs=5%%: %v (exit %d); want a usage error naming the flag, its variable and the input", err, ExitCode(err))
	}
}

// TestCIStepErrorsNameInputsNotFlags checks that a use case's error
// reaches the CLI user with the flag, and a pipeline step (the same
// command with -o github) with the flag, its variable and the input.
func TestCIStepErrorsNameInputsNotFlags(t *testing.T) {
	t.Parallel()
	// The bundle steps' case is bundlecmd's TestBundleStepErrorsNameInputs.
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent.yaml")
	tests := []struct {
		name     string
		ci       []string
		cli      []string
		wantCode int
		want     string // in the CI step's stderr
		wantCLI  string // in the CLI's stderr
	}{
		{"train, no spec", []string{"-o", "github", "train", "--broker-url", "http://127.0.0.1:1", "--broker-token", "gpp_x", "--region", "us-west-2", "--spec", missing, "--command", "true"},
			[]string{"train", "--broker-url", "http://127.0.0.1:1", "--broker-token", "gpp_x", "--region", "us-west-2", "--spec", missing, "--", "true"},
			ExitUsage, "--spec (GPUPASS_SPEC, the spec input)", "--spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, run := range []struct {
				args []string
				want string
			}{{tc.ci, tc.want}, {tc.cli, tc.wantCLI}} {
				var out, errb bytes.Buffer
				code := Main(context.Background(), run.args, strings.NewReader(""), &out, &errb)
				if code != tc.wantCode || !strings.Contains(errb.String(), run.want) {
					t.Errorf("gpupass %s: exit %d, stderr %q; want exit %d and %q", strings.Join(run.args, " "), code, errb.String(), tc.wantCode, run.want)
				}
			}
		})
	}
}
