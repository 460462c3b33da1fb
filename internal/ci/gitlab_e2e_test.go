//go:build e2e

package ci_test

import (
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// TestGitLabComponents runs the component project's own pipeline
// (components/gitlab/.gitlab-ci.yml: every component included with
// `include: component:` at $CI_COMMIT_SHA, in GitLab's default stages, then
// a job that reads their dotenv) through gitlab-ci-local on the shell
// executor, with a real registry for bundle-push and a `gpupass up` stack
// for train (us-west-2 and eu-central-1, testdata/train), compare-runs (the train jobs'
// allocation ids through dotenv) and audit, of a run and of a run group
// (GPUPASS_GROUP: its directory of zips kept as the job's artifact).
func TestGitLabComponents(t *testing.T) {
	p := startPipeline(t, "git@gitlab.invalid:acme/train.git")
	path := p.toolPath
	glci := lookPath(t, path, "gitlab-ci-local")
	lookPath(t, path, "rsync")
	registry := regtest.StartRegistry(t)

	const token = "glpat-e2e-secret-7c1d"
	srv := gitlabNotes(token)
	ts := httptest.NewServer(srv.handler())
	defer ts.Close()

	dir := gitRepo(t, "components/gitlab", "git@gitlab.invalid:gpupass/components.git")
	// The plan, rendered by gitlab-ci-local: every component is a job of
	// its own, the two compare-report includes included, in the default
	// stages (the broker jobs are planned; their rules keep them out of a
	// run without a broker).
	preview := exec.Command(glci, "--preview")
	preview.Dir = dir
	preview.Env = append(os.Environ(), "PATH="+path, "GITHUB_ACTIONS=", "CI=")
	pb, err := preview.Output()
	var plan map[string]any
	if err == nil {
		err = yaml.Unmarshal(pb, &plan)
	}
	if err != nil {
		t.Fatalf("gitlab-ci-local --preview: %v\n%s", err, pb)
	}
	for job, stage := range map[string]string{"gpupass-validate": "build", "gpupass-bundle-push": "build",
		"gpupass-train-us-west-2": "test", "gpupass-train-eu-central-1": "test", "compare-files": "deploy", "compare-runs": "deploy", "gpupass-audit": ".post"} {
		if j, _ := plan[job].(map[string]any); j["stage"] != stage {
			t.Errorf("the component pipeline plans %s in stage %v, want %s", job, j["stage"], stage)
		}
	}
	cmd := exec.Command(glci,
		"--shell-executor-no-image", "--force-shell-executor",
		// gitlab-ci-local marks its jobs GITLAB_CI=false; this pipeline
		// stands in for a real GitLab merge request pipeline.
		"--variable", "GITLAB_CI=true",
		"--variable", "CI_API_V4_URL="+ts.URL+"/api/v4",
		"--variable", "CI_MERGE_REQUEST_IID=3",
		"--variable", "CI_MERGE_REQUEST_PROJECT_ID=42",
		"--variable", "GPUPASS_GITLAB_TOKEN="+token,
		"--variable", "GPUPASS_BUNDLE_REPOSITORY="+registry+"/components/wheels",
		"--variable", "GPUPASS_PLAIN_HTTP=true",
		"--variable", "GPUPASS_BROKER_URL="+p.url,
		"--variable", "BROKER_TOKEN_US="+p.us,
		"--variable", "BROKER_TOKEN_EU="+p.eu,
		"--variable", "BROKER_TOKEN_READ="+p.read,
		"--variable", "COSIGN_KEY="+p.cosignKey,
		"--variable", "COSIGN_PASSWORD="+p.cosignPassword,
	)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+path, "GITHUB_ACTIONS=", "CI=")
	out, err := cmd.CombinedOutput()
	log := string(out)
	if err != nil {
		t.Fatalf("gitlab-ci-local: %v\n%s", err, log)
	}
	for _, want := range []string{"PASS  gpupass-validate", "PASS  gpupass-bundle-push", "PASS  gpupass-train-us-west-2", "PASS  gpupass-train-eu-central-1",
		"PASS  compare-files", "PASS  compare-runs", "PASS  gpupass-audit", "PASS  gpupass-audit-group", "PASS  check-handoff",
		// gitlab-ci-local turns section markers into timings.
		"gpupass_validate took", "gpupass_compare-report took", "gpupass_bundle-push took", "gpupass_train took", "gpupass_audit took"} {
		if !strings.Contains(log, want) {
			t.Errorf("pipeline log lacks %q", want)
		}
	}
	// The artifacts GitLab reads.
	for _, f := range []string{
		"gpupass-validate/.gitlab-ci-reports/dotenv/gpupass.env",
		"gpupass-validate/gl-code-quality-report.json",
		"gpupass-bundle-push/.gitlab-ci-reports/dotenv/gpupass.env",
		"compare-files/.gitlab-ci-reports/dotenv/gpupass.env",
		"compare-files/report-files/junit.xml",
		"compare-files/report-files/report.md",
		"compare-files/report-files/annotations.json",
		"compare-runs/report-runs/report.md",
		"gpupass-audit/audit-report.zip",
	} {
		if _, err := os.Stat(filepath.Join(dir, ".gitlab-ci-local", "artifacts", f)); err != nil {
			t.Errorf("artifact %s: %v", f, err)
		}
	}
	ids := trainIDs(t, dir)
	p.checkRuns(t, ids, strings.TrimSpace(gitOut(t, dir, "rev-parse", "HEAD")))
	p.verifyAudit(t, filepath.Join(dir, ".gitlab-ci-local", "artifacts", "gpupass-audit", "audit-report.zip"))
	groupZips, _ := filepath.Glob(filepath.Join(dir, ".gitlab-ci-local", "artifacts", "gpupass-audit-group", "audit-group-*", "audit-*.zip"))
	if len(groupZips) != 1 {
		t.Errorf("the group audit job's artifacts hold %v, want the zip of its group's one run", groupZips)
	}
	for _, z := range groupZips {
		p.verifyAudit(t, z)
	}
	// Two compare-report includes, two notes (one per tag); the one over
	// the runs names the allocation ids the train jobs handed on.
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.bodies) != 2 || !strings.Contains(strings.Join(srv.bodies, "\n"), ids["us-west-2"]) || !strings.Contains(strings.Join(srv.bodies, "\n"), ids["eu-central-1"]) {
		t.Errorf("MR notes posted = %q, want the files' and the runs' compare reports, the latter naming %v", srv.bodies, ids)
	}
	for _, b := range srv.bodies {
		if !strings.Contains(b, "gpupass compare: consistent") {
			t.Errorf("MR note %q is not a consistent compare report", b)
		}
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
		for _, s := range []string{token, p.us, p.eu, p.read, p.cosignPassword} {
			if strings.Contains(string(b), s) {
				t.Errorf("a secret reached the job log %s", l)
			}
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

// catalogRemote serves git over HTTP (git http-backend, the smart
// protocol GitLab speaks) on loopback with one project,
// gpupass/gpupass-components, assembled from this checkout by
// scripts/release/gitlab-catalog.sh and tagged version, as the release
// publishes it. It returns the server's URL; gitlab-ci-local fetches a
// component at a tag from the host of the including project's remote, so
// a user repository whose origin is URL/acme/train.git includes the
// catalog from here.
func catalogRemote(t *testing.T, version, image string) string {
	t.Helper()
	backend := filepath.Join(strings.TrimSpace(gitOut(t, ".", "--exec-path")), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		testutil.Missing(t, "git-http-backend: %v", err)
	}
	work := filepath.Join(t.TempDir(), "gpupass-components")
	if log, err := catalog(t, work, version, image); err != nil {
		t.Fatalf("gitlab-catalog.sh: %v\n%s", err, log)
	}
	root := t.TempDir()
	bare := filepath.Join(root, "gpupass", "gpupass-components.git")
	for _, args := range [][]string{
		{"clone", "-q", "--bare", work, bare},
		// gitlab-ci-local clones with --filter=tree:0 and a sparse checkout.
		{"-C", bare, "config", "uploadpack.allowFilter", "true"},
		{"-C", bare, "config", "uploadpack.allowAnySHA1InWant", "true"},
	} {
		if b, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	srv := httptest.NewServer(&cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}})
	t.Cleanup(srv.Close)
	return srv.URL
}

// checkExamplePlan lints the example pipeline with gitlab-ci-local
// (--preview renders it with the components expanded, --list plans it),
// which fetches the components at 1.0.0 from the catalog remote, and
// checks the plan: the released templates (with the stamped image), the
// default stages, and no needs on the report and the audit.
func checkExamplePlan(t *testing.T, glci string, p *pipeline) {
	t.Helper()
	run := func(args ...string) string {
		for attempt := 1; ; attempt++ {
			cmd := exec.Command(glci, args...)
			cmd.Dir = p.user
			cmd.Env = append(os.Environ(), "PATH="+p.toolPath, "GITHUB_ACTIONS=", "CI=")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			b, err := cmd.Output()
			if err != nil && attempt == 1 && fetchRace(stderr.String()) {
				t.Logf("gitlab-ci-local %v: its parallel fetches raced (%v); once more, which fetches what is still missing", args, err)
				continue
			}
			if err != nil {
				t.Fatalf("gitlab-ci-local %v: %v\n%s%s", args, err, b, stderr.String())
			}
			return string(b)
		}
	}
	cache := filepath.Join(p.user, ".gitlab-ci-local", "includes", "127.0.0.1", "gpupass", "gpupass-components", "1.0.0")
	components := []string{"validate", "train", "compare-report", "audit"}
	preview := run("--preview")
	var rendered map[string]any
	if err := yaml.Unmarshal([]byte(preview), &rendered); err != nil {
		t.Fatalf("--preview is not YAML: %v\n%s", err, preview)
	}
	stages := map[string]string{"gpupass-validate": "build", "gpupass-train-us-west-2": "test", "gpupass-train-eu-central-1": "test",
		"gpupass-compare-report": "deploy", "gpupass-audit": ".post"}
	for job, stage := range stages {
		j, _ := rendered[job].(map[string]any)
		if j == nil {
			t.Errorf("--preview has no job %s", job)
			continue
		}
		if j["stage"] != stage {
			t.Errorf("%s in stage %v, want %s", job, j["stage"], stage)
		}
		if _, ok := j["needs"]; ok {
			t.Errorf("%s sets needs %v: it would not wait for the earlier stages", job, j["needs"])
		}
		img, _ := j["image"].(map[string]any)
		if img["name"] != testImage {
			t.Errorf("%s image %v, want the release's CLI image %s", job, j["image"], testImage)
		}
	}
	list := run("--list")
	for job := range stages {
		if !strings.Contains(list, job) {
			t.Errorf("--list lacks %s:\n%s", job, list)
		}
	}
	for _, c := range components {
		f := filepath.Join(cache, "templates", c, "template.yml")
		if b, err := os.ReadFile(f); err != nil || !strings.Contains(string(b), testImage) {
			t.Errorf("component %s at 1.0.0 was not fetched from the catalog remote: %v", c, err)
		}
	}
}

// fetchRace tells gitlab-ci-local's (4.75.1) own race, seen in CI, from
// any other failure: it fetches every include of one project and ref at
// once, train twice (us-west-2 and eu-central-1), each fetch ending in `cp -r
// <clone>/templates <cache dir>`, and two copies that both find a
// directory or file missing both create it, one failing with "File
// exists". Every template is read only after all fetches end, so nothing
// half-written is read; a second run fetches what the failed copy left
// missing.
func fetchRace(stderr string) bool {
	return strings.Contains(stderr, "Component include could not be fetched") &&
		regexp.MustCompile(`cp: cannot create (directory|regular file) '[^']*': File exists`).MatchString(stderr)
}

// trainIDs reads the allocation id each train job handed on through its
// dotenv report (gitlab-ci-local's artifacts under dir), by region: the
// variable the examples read, spelled out.
func trainIDs(t *testing.T, dir string) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for region, key := range map[string]string{"us-west-2": "GPUPASS_ALLOCATION_US_WEST_2=", "eu-central-1": "GPUPASS_ALLOCATION_EU_CENTRAL_1="} {
		f := filepath.Join(dir, ".gitlab-ci-local", "artifacts", "gpupass-train-"+region, ".gitlab-ci-reports", "dotenv", "gpupass-train-"+region+".env")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("dotenv of train %s: %v", region, err)
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, key); ok {
				ids[region] = v
			}
		}
	}
	return ids
}

// TestFetchRace: the retry is only for gitlab-ci-local's own race, as CI
// printed it, never for a component that cannot be fetched.
func TestFetchRace(t *testing.T) {
	ciLog := `Component include could not be fetched { project: gpupass/gpupass-components, ref: 1.0.0, file: templates/validate.yml,templates/validate/template.yml }
rp: Command failed with exit code 1: 'cd /tmp/x/.gitlab-ci-local && \git clone --branch 1.0.0 -n --depth=1 --filter=tree:0 http://127.0.0.1:42389/gpupass/gpupass-components.git /tmp/x/1.0.0.tmp-0.86'
Cloning into '/tmp/x/1.0.0.tmp-0.86'...
cp: cannot create directory '/tmp/x/.gitlab-ci-local/includes/127.0.0.1/gpupass/gpupass-components/1.0.0/templates': File exists`
	for _, c := range []struct {
		stderr string
		want   bool
	}{
		{ciLog, true},
		{strings.Replace(ciLog, "create directory", "create regular file", 1), true},
		{strings.Replace(ciLog, "File exists", "Permission denied", 1), false},
		{"Component include could not be fetched { project: gpupass/gpupass-components, ref: 9.9.9 }\nfatal: Remote branch 9.9.9 not found in upstream origin", false},
		{"cp: cannot create directory 'x': File exists", false},
	} {
		if got := fetchRace(c.stderr); got != c.want {
			t.Errorf("fetchRace(%q) = %v, want %v", c.stderr, got, c.want)
		}
	}
}
