package gpupass

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/report"
)

func TestCILinks(t *testing.T) {
	t.Parallel()
	github := map[string]string{"GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42"}
	tests := []struct {
		name      string
		kind      ci.Kind
		env       map[string]string
		reportDir string
		want      []report.Link
	}{
		{"github", ci.GitHub, github, "gpupass-report", []report.Link{
			{Label: "CI run", URL: "https://github.example.com/o/r/actions/runs/42"},
			{Label: "artifacts", URL: "https://github.example.com/o/r/actions/runs/42#artifacts"},
		}},
		{"github rerun links its attempt", ci.GitHub, map[string]string{"GITHUB_SERVER_URL": "https://github.example.com/", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "3"}, "", []report.Link{
			{Label: "CI run", URL: "https://github.example.com/o/r/actions/runs/42/attempts/3"},
			{Label: "artifacts", URL: "https://github.example.com/o/r/actions/runs/42#artifacts"},
		}},
		{"github without a run id", ci.GitHub, map[string]string{"GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "o/r"}, "", nil},
		{"gitlab", ci.GitLab, map[string]string{"CI_PIPELINE_URL": "https://gitlab.example.com/g/p/-/pipelines/9", "CI_JOB_URL": "https://gitlab.example.com/g/p/-/jobs/7"}, "gpupass-report", []report.Link{
			{Label: "CI pipeline", URL: "https://gitlab.example.com/g/p/-/pipelines/9"},
			{Label: "report artifacts", URL: "https://gitlab.example.com/g/p/-/jobs/7/artifacts/browse/gpupass-report"},
		}},
		{"gitlab report dir outside the job's directory", ci.GitLab, map[string]string{"CI_JOB_URL": "https://gitlab.example.com/g/p/-/jobs/7"}, "/tmp/rep", []report.Link{
			{Label: "report artifacts", URL: "https://gitlab.example.com/g/p/-/jobs/7/artifacts/browse"},
		}},
		{"outside CI", ci.None, github, "gpupass-report", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := ciLinks(tc.kind, func(k string) string { return tc.env[k] }, tc.reportDir)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ciLinks (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCIStepReportLinks runs compare as the action does (-o github, or
// -o gitlab as the component does; plain text outside CI) and reads
// the links line of the report it writes (the comment's text): the CI
// variables become links, and a hostile one cannot break out of its link.
func TestCIStepReportLinks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		env      map[string]string
		dash     string
		want     string // the links line
		wantCode int
	}{
		{name: "github", env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "1"},
			want: "**Links:** [CI run](https://github.example.com/o/r/actions/runs/42/attempts/1) · [artifacts](https://github.example.com/o/r/actions/runs/42#artifacts)"},
		{name: "gitlab", env: map[string]string{"GITLAB_CI": "true", "CI_PIPELINE_URL": "https://gitlab.example.com/g/p/-/pipelines/9", "CI_JOB_URL": "https://gitlab.example.com/g/p/-/jobs/7"},
			want: "**Links:** [CI pipeline](https://gitlab.example.com/g/p/-/pipelines/9) · [report artifacts](https://gitlab.example.com/g/p/-/jobs/7/artifacts/browse)"},
		{name: "hostile variable", env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "o/r) [pwned](https://evil.example", "GITHUB_RUN_ID": "42"},
			want: "**Links:** [CI run](https://github.example.com/o/r%29%20%5Bpwned%5D%28https://evil.example/actions/runs/42) · [artifacts](https://github.example.com/o/r%29%20%5Bpwned%5D%28https://evil.example/actions/runs/42#artifacts)"},
		{name: "hostile variable with a line break", env: map[string]string{"GITLAB_CI": "true", "CI_PIPELINE_URL": "https://gitlab.example.com/p\n# @team [x](https://evil.example)"},
			want: ""},
		{name: "outside CI", env: map[string]string{"GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42"}, want: ""},
		{name: "dashboard url not http", env: map[string]string{}, dash: "javascript:alert(1)", wantCode: ExitUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			us, eu := writeMetrics(t, filepath.Join(dir, "us.jsonl"), 0), writeMetrics(t, filepath.Join(dir, "eu.jsonl"), 0.001)
			env := map[string]string{"GITHUB_OUTPUT": filepath.Join(dir, "output"), "GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env")}
			for k, v := range tc.env {
				env[k] = v
			}
			o := &stepInputs{Command: "compare-report", Runs: "us=" + us + " eu=" + eu, Tolerance: "5%", Tag: "compare", CommentBehavior: "update",
				DashboardURL: tc.dash, Getenv: func(k string) string { return env[k] }, ErrOut: &bytes.Buffer{},
				// Posting is skipped without a token, as forgepost does in CI.
				Global: &GlobalOptions{Output: "text", Poster: forgepost.Poster{}}}
			// An absolute report directory (the test cannot change its
			// working directory in parallel) links the job's artifacts
			// rather than the directory among them (TestCILinks).
			o.ReportDir = filepath.Join(dir, "rep")
			kind := ci.Detect(o.Getenv, nil).Kind()
			c := compareStep(o, kind)
			if kind == ci.None {
				c.Output = "text"
			}
			err := RunCompare(context.Background(), c, &bytes.Buffer{})
			if got := ExitCode(err); got != tc.wantCode {
				t.Fatalf("exit code %d (%v), want %d", got, err, tc.wantCode)
			}
			if tc.wantCode != 0 {
				return
			}
			md, err := os.ReadFile(filepath.Join(dir, "rep", "report.md"))
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, l := range strings.Split(string(md), "\n") {
				if strings.HasPrefix(l, "**Links") || strings.Contains(l, "evil") || strings.Contains(l, "@team") {
					if got != "" {
						t.Errorf("a second links line: %s", l)
					}
					got = l
				}
			}
			if got != tc.want {
				t.Errorf("links line\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
