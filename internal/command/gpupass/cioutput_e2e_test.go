//go:build e2e

package gpupass_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestCIOutputFormats runs the real commands as the GitHub Action and the
// GitLab components do: `gpupass -o github|gitlab COMMAND`, configured by
// GPUPASS_<FLAG> variables, in a runner's environment. Each must do what
// its pipeline step needs (outputs, dotenv, summary, reports, log group);
// a command without CI output refuses the format, naming those that have
// it.
func TestCIOutputFormats(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	starter, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "examples", "starter", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	testdata := filepath.Join(testutil.RepoRoot(t), "internal", "audit", "testdata")
	key, err := os.ReadFile(filepath.Join(testdata, "cosign.key"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		env      []string // besides the runner's own
		kind     string   // github | gitlab
		noSpec   bool     // no gpupass.yaml in the work dir
		wantCode int
		wantLog  []string            // in stdout + stderr
		wantFile map[string][]string // file in the work dir -> substrings
	}{
		{name: "validate on GitHub", kind: "github", args: []string{"-o", "github", "validate"}, env: []string{"GPUPASS_SPEC=gpupass.yaml"},
			wantLog:  []string{"::group::gpupass validate", "::endgroup::", "gpupass.yaml: valid"},
			wantFile: map[string][]string{"output": {"fingerprint<<", "sha256:"}, "summary": {"### ✅ gpupass validate", "is valid"}}},
		{name: "validate on GitLab", kind: "gitlab", args: []string{"--output=gitlab", "validate"},
			wantLog:  []string{"section_start:", "section_end:"},
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_FINGERPRINT=sha256:"}, "gl-code-quality-report.json": {"[]"}}},
		{name: "validate names the input of a missing spec", kind: "github", args: []string{"-o", "github", "validate"}, env: []string{"GPUPASS_SPEC=missing.yaml"},
			wantCode: 2, wantLog: []string{"::error title=gpupass validate::", "missing.yaml"}},
		{name: "validate without a spec names the flag and the input", kind: "gitlab", args: []string{"-o", "gitlab", "validate"}, noSpec: true,
			wantCode: 2, wantLog: []string{"or pass --spec (GPUPASS_SPEC, the spec input)"}},
		{name: "compare on GitHub", kind: "github", args: []string{"-o", "github", "compare"},
			env:      []string{"GPUPASS_RUNS=us=us.jsonl eu=eu.jsonl", "GPUPASS_REPORT_DIR=rep", "GPUPASS_FAIL_ON_DIVERGENCE=true"},
			wantLog:  []string{"::group::gpupass compare-report", "gpupass compare: consistent"},
			wantFile: map[string][]string{"output": {"verdict<<", "consistent", "report-path<<", "rep/report.md"}, "summary": {"gpupass compare: consistent"}, "rep/junit.xml": {"<testsuite"}, "rep/chart.svg": {"<svg"}}},
		{name: "compare on GitLab takes train's allocation-ids JSON and fails on divergence", kind: "gitlab", args: []string{"-o", "gitlab", "compare", "--tolerance", "abs=0.01"},
			env:      []string{`GPUPASS_RUNS={"us":"us.jsonl","far":"far.jsonl"}`, "GPUPASS_FAIL_ON_DIVERGENCE=true"},
			wantCode: 1, wantLog: []string{"section_start:", "gpupass_compare-report"},
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_VERDICT=diverged", "GPUPASS_REPORT_PATH=gpupass-report/report.md"},
				"gpupass-report/annotations.json": {`"label": "gpupass compare report: diverged"`, `"url": "https://gitlab.invalid/g/p/-/jobs/7/artifacts/file/gpupass-report/report.md"`}}},
		{name: "compare without runs names the input", kind: "gitlab", args: []string{"-o", "gitlab", "compare"},
			wantCode: 2, wantLog: []string{"nothing to compare: set --runs (GPUPASS_RUNS, the runs input)"}},
		{name: "train names every missing input at once", kind: "github", args: []string{"-o", "github", "train", "--follow"}, env: []string{"GPUPASS_BROKER_TOKEN=gpp_secret"},
			wantCode: 2, wantLog: []string{"::group::gpupass train", "train: missing --broker-url (GPUPASS_BROKER_URL, the broker-url input), --region (GPUPASS_REGION, the regions input), --command (GPUPASS_COMMAND, the train-command input)"}},
		{name: "audit on GitLab signs with the key itself and hands on the zip", kind: "gitlab", args: []string{"-o", "gitlab", "audit"},
			env:      []string{"GPUPASS_RUN_FILE=" + filepath.Join(testdata, "run.json"), "GPUPASS_KEY=" + string(key), "GPUPASS_KEY_PASSWORD=gpupass-test", "GPUPASS_OUT=a.zip"},
			wantLog:  []string{"section_start:", "gpupass_audit", "wrote a.zip"},
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_AUDIT_PATH=a.zip"}}},
		{name: "audit without a key or an identity names the input and the permission", kind: "github", args: []string{"-o", "github", "audit", "--run-file", filepath.Join(testdata, "run.json")},
			wantCode: 2, wantLog: []string{"audit: missing --key (GPUPASS_KEY, the cosign-key input), or an OIDC identity to sign keyless: this GitHub Actions job has none (ACTIONS_ID_TOKEN_REQUEST_URL is unset): grant the job `permissions: id-token: write`"}},
		{name: "a command without CI output refuses it", kind: "github", args: []string{"-o", "github", "version"},
			wantCode: 2, wantLog: []string{"--output github: gpupass version prints text or json"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if !tc.noSpec {
				if err := os.WriteFile(filepath.Join(dir, "gpupass.yaml"), starter, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for name, delta := range map[string]float64{"us.jsonl": 0, "eu.jsonl": 0.001, "far.jsonl": 0.5} {
				var b strings.Builder
				for step := 0; step <= 100; step += 10 {
					fmt.Fprintf(&b, "{\"step\":%d,\"loss\":%g}\n", step, 3.0-float64(step)/50+delta)
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			env := []string{"GITHUB_ACTIONS=true", "GITHUB_OUTPUT=" + filepath.Join(dir, "output"), "GITHUB_STEP_SUMMARY=" + filepath.Join(dir, "summary")}
			if tc.kind == "gitlab" {
				env = []string{"GITLAB_CI=true", "CI_JOB_URL=https://gitlab.invalid/g/p/-/jobs/7", "GPUPASS_DOTENV=" + filepath.Join(dir, "gpupass.env")}
			}
			out, errOut, code := run(t, bin, dir, append(env, tc.env...), tc.args...)
			log := out + errOut
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.wantCode, log)
			}
			testutil.WantAll(t, "log", log, tc.wantLog)
			testutil.WantFiles(t, dir, tc.wantFile)
		})
	}
}
