//go:build e2e

package ci_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestGitLabComponents runs the component project's own pipeline
// (components/gitlab/.gitlab-ci.yml: validate and compare-report included
// with `include: component:` at $CI_COMMIT_SHA, then a job that reads
// their dotenv) through gitlab-ci-local on the shell executor.
func TestGitLabComponents(t *testing.T) {
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	path := toolsPath(t, bin)
	glci := lookPath(t, path, "gitlab-ci-local")
	lookPath(t, path, "rsync")

	const token = "glpat-e2e-secret-7c1d"
	srv := gitlabNotes(token)
	ts := httptest.NewServer(srv.handler())
	defer ts.Close()

	dir := gitRepo(t, "components/gitlab", "git@gitlab.invalid:gpupass/components.git")
	cmd := exec.Command(glci,
		"--shell-executor-no-image", "--force-shell-executor",
		// gitlab-ci-local marks its jobs GITLAB_CI=false; this pipeline
		// stands in for a real GitLab merge request pipeline.
		"--variable", "GITLAB_CI=true",
		"--variable", "CI_API_V4_URL="+ts.URL+"/api/v4",
		"--variable", "CI_MERGE_REQUEST_IID=3",
		"--variable", "CI_MERGE_REQUEST_PROJECT_ID=42",
		"--variable", "GPUPASS_GITLAB_TOKEN="+token,
	)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+path, "GITHUB_ACTIONS=", "CI=")
	out, err := cmd.CombinedOutput()
	log := string(out)
	if err != nil {
		t.Fatalf("gitlab-ci-local: %v\n%s", err, log)
	}
	for _, want := range []string{"PASS  gpupass-validate", "PASS  gpupass-compare-report", "PASS  check-handoff",
		// gitlab-ci-local turns section markers into timings.
		"gpupass_validate took", "gpupass_compare-report took"} {
		if !strings.Contains(log, want) {
			t.Errorf("pipeline log lacks %q", want)
		}
	}
	// The artifacts GitLab reads.
	for _, f := range []string{
		"gpupass-validate/.gitlab-ci-reports/dotenv/gpupass.env",
		"gpupass-validate/gl-code-quality-report.json",
		"gpupass-compare-report/.gitlab-ci-reports/dotenv/gpupass.env",
		"gpupass-compare-report/gpupass-report/junit.xml",
		"gpupass-compare-report/gpupass-report/report.md",
		"gpupass-compare-report/gpupass-report/annotations.json",
	} {
		if _, err := os.Stat(filepath.Join(dir, ".gitlab-ci-local", "artifacts", f)); err != nil {
			t.Errorf("artifact %s: %v", f, err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.bodies) != 1 || !strings.Contains(srv.bodies[0], "gpupass compare: consistent") {
		t.Errorf("MR notes posted = %q, want one compare report", srv.bodies)
	}
	if srv.denied != 0 {
		t.Errorf("%d requests without the project access token", srv.denied)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, ".gitlab-ci-local", "output", "*.log"))
	for _, l := range append(logs, "") {
		b := out
		if l != "" {
			b, _ = os.ReadFile(l)
		}
		if strings.Contains(string(b), token) {
			t.Errorf("the token reached the job log %s", l)
		}
	}
	if t.Failed() {
		t.Logf("pipeline log:\n%s", log)
	}
}

// TestGitLabComponentBadInput includes the validate component with a spec
// that does not exist: the job fails with one clear error naming the file,
// and the token given to the pipeline never reaches the log.
func TestGitLabComponentBadInput(t *testing.T) {
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	path := toolsPath(t, bin)
	glci := lookPath(t, path, "gitlab-ci-local")
	lookPath(t, path, "rsync")

	dir := gitRepo(t, "components/gitlab", "git@gitlab.invalid:gpupass/components.git")
	pipeline := `include:
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/validate@$CI_COMMIT_SHA
    inputs:
      spec: missing.yaml
`
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(pipeline), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.email=ci@gpupass.test", "-c", "user.name=gpupass test", "commit", "-q", "-m", "bad input"}} {
		c := exec.Command("git", args...)
		c.Dir = dir
		if b, err := c.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	const token = "glpat-e2e-secret-bad-input"
	cmd := exec.Command(glci, "--shell-executor-no-image", "--force-shell-executor",
		"--variable", "GITLAB_CI=true", "--variable", "GPUPASS_GITLAB_TOKEN="+token)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+path, "GITHUB_ACTIONS=", "CI=")
	out, err := cmd.CombinedOutput()
	log := string(out)
	if err == nil {
		t.Errorf("the pipeline passed with a missing spec")
	}
	for _, want := range []string{"FAIL  gpupass-validate", "reading spec missing.yaml: file does not exist"} {
		if !strings.Contains(log, want) {
			t.Errorf("pipeline log lacks %q", want)
		}
	}
	// The job's own log (the console repeats a failed job's tail).
	jobLog, _ := os.ReadFile(filepath.Join(dir, ".gitlab-ci-local", "output", "gpupass-validate.log"))
	if n := strings.Count(string(jobLog), "reading spec missing.yaml"); n != 1 {
		t.Errorf("the error appears %d times in the job log, want once:\n%s", n, jobLog)
	}
	if strings.Contains(log, token) || strings.Contains(log, "goroutine ") {
		t.Errorf("the log holds a secret or a stack trace")
	}
	if t.Failed() {
		t.Logf("pipeline log:\n%s", log)
	}
}
