//go:build e2e

package ci_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// ghToken is the GITHUB_TOKEN secret of the act pipelines.
const ghToken = "ghs-e2e-pipeline-secret-0d4c"

// exampleSteps keeps the real PyTorch example short in the pipelines.
const exampleSteps = "30"

// exampleRegions are the regions the examples/ci pipelines train in:
// those of a stack started as `gpupass up` (TestCIExamplesUseUpRegions).
var exampleRegions = []string{"us-west-2", "eu-central-1"}

// pipeline is what the examples/ci pipelines need: a `gpupass up` stack
// with its default agents (us-west-2 and eu-central-1), region-scoped submit tokens and a read token
// made with `gpupass-broker token create` against the stack's database, a
// cosign key pair, and a user repository holding the example training job
// (examples/train) at its root, as the example pipelines expect.
type pipeline struct {
	stack             *upstack.Stack
	url               string
	us, eu, read      string // broker tokens: submit us-west-2, submit eu-central-1, read both
	cosignKey         string // PEM of the private key
	cosignPub         string // path of the public key
	cosignPassword    string
	user              string // the user's repository (a git work tree)
	gpupass, toolPath string
	// release is the action as its dry-run release installs it, made
	// once per pipeline (see actRelease).
	release *actRelease
}

// startPipeline starts the stack; env goes to its agents, and so to the
// example's train.py (EXAMPLE_STEP_SLEEP=1 makes its runs outlive a job).
func startPipeline(t *testing.T, remote string, env ...string) *pipeline {
	t.Helper()
	upstack.RequireTorch(t)
	// The example runs `python3 train.py`: the agents' PATH finds the
	// Python that has torch first (scripts/setup.d/10-python.sh).
	// No --region: the examples must run against up's own regions.
	stack := upstack.Start(t, upstack.Options{
		Env: append([]string{"PATH=" + filepath.Dir(upstack.Python) + string(os.PathListSeparator) + os.Getenv("PATH"), "EXAMPLE_STEPS=" + exampleSteps}, env...)})
	p := &pipeline{stack: stack, url: stack.Config(t).BrokerURL, gpupass: filepath.Join(stack.Bin, "gpupass")}
	p.toolPath = toolsPath(t, p.gpupass)
	p.us, p.eu, p.read = p.token(t, "submit", "us-west-2"), p.token(t, "submit", "eu-central-1"), p.token(t, "read", "us-west-2,eu-central-1")

	keys := t.TempDir()
	p.cosignPassword = "e2e-cosign-password-3f1a"
	kg := exec.Command(p.gpupass, "audit", "keygen", "--out-prefix", filepath.Join(keys, "cosign"))
	kg.Env = append(os.Environ(), "COSIGN_PASSWORD="+p.cosignPassword)
	if b, err := kg.CombinedOutput(); err != nil {
		t.Fatalf("audit keygen: %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(keys, "cosign.key"))
	if err != nil {
		t.Fatal(err)
	}
	p.cosignKey, p.cosignPub = string(b), filepath.Join(keys, "cosign.pub")

	p.user = gitRepo(t, "examples/train", remote)
	return p
}

// token makes a broker token with `gpupass-broker token create` against
// the stack's database.
func (p *pipeline) token(t *testing.T, role, regions string) string {
	t.Helper()
	cmd := exec.Command(p.broker(), "--db", p.db(), "--output", "json", "token", "create", "--role", role, "--regions", regions, "--note", "ci e2e")
	out, err := cmd.Output()
	var v struct {
		Token string `json:"token"`
	}
	if err != nil || json.Unmarshal(out, &v) != nil || v.Token == "" {
		t.Fatalf("token create --role %s --regions %s: %v\n%s", role, regions, err, out)
	}
	return v.Token
}

// broker is the stack's gpupass-broker binary; db its store, as --db.
func (p *pipeline) broker() string { return filepath.Join(p.stack.Bin, "gpupass-broker") }
func (p *pipeline) db() string     { return "sqlite://" + filepath.Join(p.stack.State, "broker.db") }

// commit adds files (path → content) to the user repository.
func (p *pipeline) commit(t *testing.T, files map[string]string) {
	t.Helper()
	for name, body := range files {
		f := filepath.Join(p.user, name)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.email=ci@gpupass.test", "-c", "user.name=gpupass test", "commit", "-q", "-m", "pipeline"}} {
		c := exec.Command("git", args...)
		c.Dir = p.user
		if b, err := c.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
}

func (p *pipeline) head(t *testing.T) string {
	t.Helper()
	c := exec.Command("git", "rev-parse", "HEAD")
	c.Dir = p.user
	b, err := c.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// checkRuns checks, through the broker, the runs the pipeline's train
// jobs handed on: one per region, succeeded, named with the region and
// the short commit.
func (p *pipeline) checkRuns(t *testing.T, ids map[string]string, sha string) {
	t.Helper()
	rc, err := client.DialRuns(p.url, client.Options{Token: p.read})
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range exampleRegions {
		id := ids[region]
		if id == "" {
			t.Errorf("no allocation id handed on for %s (got %v)", region, ids)
			continue
		}
		resp, err := rc.Run.GetRun(context.Background(), connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Errorf("run %s: %v", id, err)
			continue
		}
		r := resp.Msg.Run
		if r.Region != region || r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Errorf("run %s: region %s state %s (%s), want %s succeeded", id, r.Region, r.State, r.Reason, region)
		}
		if !strings.Contains(r.Name, sha[:7]) || !strings.Contains(r.Name, region) {
			t.Errorf("run %s is named %q: want the region and the short commit %s", id, r.Name, sha[:7])
		}
	}
}

// verifyAudit runs `gpupass audit verify` on an audit zip the pipeline made.
func (p *pipeline) verifyAudit(t *testing.T, zip string) {
	t.Helper()
	if b, err := exec.Command(p.gpupass, "audit", "verify", zip, "--key", p.cosignPub).CombinedOutput(); err != nil {
		t.Errorf("audit verify %s: %v\n%s", zip, err, b)
	}
}

// releaseVersion is the version the dry run of the release stamps.
const releaseVersion = "v1.4.2"

// dryRunRelease runs scripts/release/dry-run.sh in a fresh repository of
// this checkout, as a release manager would before pushing the tag: the
// release commit and tag, the host's archives, checksums.txt signed with a
// key pair made by the real cosign (keyless needs the workflow's OIDC
// token), and the major tag moved. It returns the action as it is at v1
// (git archive of the tag), the release assets and the public key.
func dryRunRelease(t *testing.T) (action, dist, pub string) {
	t.Helper()
	cosign := testutil.Tool(t, "cosign")
	repo := gitRepo(t, ".", "https://github.com/gpupass/gpupass.git")
	keys, dist := t.TempDir(), t.TempDir()
	env := append(os.Environ(), "COSIGN_PASSWORD=release-dry-run", "COSIGN="+cosign,
		"GIT_AUTHOR_NAME=gpupass release", "GIT_AUTHOR_EMAIL=release@gpupass.test",
		"GIT_COMMITTER_NAME=gpupass release", "GIT_COMMITTER_EMAIL=release@gpupass.test")
	kg := exec.Command(cosign, "generate-key-pair", "--output-key-prefix", "release")
	kg.Dir, kg.Env = keys, env
	if b, err := kg.CombinedOutput(); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, b)
	}
	cmd := exec.Command("bash", "scripts/release/dry-run.sh", releaseVersion)
	cmd.Dir = repo
	cmd.Env = append(env, "COSIGN_KEY="+filepath.Join(keys, "release.key"), "DIST="+dist)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dry-run.sh %s: %v\n%s", releaseVersion, err, b)
	}
	git := func(args ...string) string {
		c := exec.Command("git", args...)
		c.Dir = repo
		b, err := c.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(b))
	}
	if v1, rel := git("rev-parse", "v1^{commit}"), git("rev-parse", releaseVersion+"^{commit}"); v1 != rel {
		t.Fatalf("v1 is at %s, want the release commit %s", v1, rel)
	}
	action = t.TempDir()
	arch := exec.Command("sh", "-c", `git archive v1 | tar -x -C "$1"`, "sh", action)
	arch.Dir = repo
	if b, err := arch.CombinedOutput(); err != nil {
		t.Fatalf("git archive v1: %v\n%s", err, b)
	}
	if b, _ := os.ReadFile(filepath.Join(action, "scripts", "action", "version")); strings.TrimSpace(string(b)) != releaseVersion {
		t.Fatalf("scripts/action/version at v1 = %q, want %s", b, releaseVersion)
	}
	return action, dist, filepath.Join(keys, "release.pub")
}

// releaseServer serves the release assets in dist as GitHub serves a
// release of repo: RELEASES/download/VERSION/NAME.
func releaseServer(t *testing.T, dist, repo string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /"+repo+"/releases/download/"+releaseVersion+"/", http.StripPrefix("/"+repo+"/releases/download/"+releaseVersion, http.FileServer(http.Dir(dist))))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

// TestExamplePipelineThroughAct runs examples/ci/github/gpupass.yml, as a
// user copies it, through act on the host against a `gpupass up` stack:
// validate → train us-west-2 + eu-central-1 (the real PyTorch example) →
// compare-report → audit. `gpupass/gpupass@v1` is the v1 tag a dry run of the release
// steps (scripts/release/dry-run.sh) left in a copy of this checkout (act
// --local-repository); it installs its own release, from a loopback release
// server (GITHUB_SERVER_URL) serving the dry run's assets, after checking
// the signature of checksums.txt (the dry run's public key stands in for
// the keyless identity) and the archive's sha256; GITHUB_API_URL points to a loopback
// server that records the PR comment. actions/upload-artifact, which act
// cannot fetch here, is a stand-in that copies the files for the test.
func TestExamplePipelineThroughAct(t *testing.T) {
	p := startPipeline(t, "https://github.com/acme/train.git")
	wf, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "examples", "ci", "github", "gpupass.yml"))
	if err != nil {
		t.Fatal(err)
	}
	p.commit(t, map[string]string{".github/workflows/gpupass.yml": string(wf)})
	sha := p.head(t)

	comments := githubComments(ghToken)
	ghAPI := httptest.NewServer(comments.handler())
	defer ghAPI.Close()
	out := t.TempDir()
	log, runErr := p.act(t, sha, ghAPI.URL, out)
	defer func() {
		if t.Failed() {
			t.Logf("act log:\n%s", upstack.Tail(log, 20000))
		}
	}()

	jobs := []string{"validate", "train-us-west-2", "train-eu-central-1", "compare", "audit"}
	if runErr != nil {
		t.Errorf("act: %v", runErr)
	}
	for _, job := range jobs {
		// act pads job names: "[gpupass/compare ] 🏁  Job succeeded".
		if !regexp.MustCompile(`\[gpupass/` + job + ` *\] \x{1F3C1}  Job succeeded`).MatchString(log) {
			t.Errorf("job %s did not succeed", job)
		}
	}
	// The action's own release was installed (signature and checksum
	// checked), not built: five jobs, five installs.
	if strings.Contains(log, "building gpupass from") || strings.Count(log, "Verified OK") < len(jobs) ||
		strings.Count(log, "gpupass_linux_amd64.tar.gz: OK") < len(jobs) || strings.Count(log, "gpupass "+releaseVersion) < len(jobs) {
		t.Errorf("the action did not install its own release %s, signature- and checksum-verified", releaseVersion)
	}

	// Outputs: the fingerprint, and the allocation ids per region.
	if !regexp.MustCompile(`::set-output:: fingerprint=sha256:[0-9a-f]{64}`).MatchString(log) {
		t.Errorf("no fingerprint output")
	}
	ids := map[string]string{}
	for _, m := range regexp.MustCompile(`::set-output:: allocation-ids=(\{[^}]*\})`).FindAllStringSubmatch(log, -1) {
		if err := json.Unmarshal([]byte(m[1]), &ids); err != nil {
			t.Errorf("allocation-ids %s: %v", m[1], err)
		}
	}
	p.checkRuns(t, ids, sha)
	for _, want := range []string{"::set-output:: verdict=consistent", "::set-output:: report-path=gpupass-report/report.md"} {
		if !strings.Contains(log, want) {
			t.Errorf("act log lacks the output %q", want)
		}
	}
	// Step summaries (act echoes each as it reads it).
	for _, want := range []string{"Summary - ### ✅ gpupass validate", "Summary - ### gpupass train", "Summary - ### ✅ gpupass compare: consistent"} {
		if !strings.Contains(log, want) {
			t.Errorf("act log lacks the step summary %q", want)
		}
	}
	// The sticky comment names both runs.
	comments.mu.Lock()
	bodies, denied := comments.bodies, comments.denied
	comments.mu.Unlock()
	if len(bodies) != 1 || !strings.Contains(bodies[0], "gpupass compare: consistent") || !strings.Contains(bodies[0], ids["us-west-2"]) || !strings.Contains(bodies[0], ids["eu-central-1"]) {
		t.Errorf("PR comments posted = %q, want one compare report of %v", bodies, ids)
	}
	// The audit job, after compare, added who signed (the key) to it.
	if th := comments.thread(); len(th) != 1 || !strings.Contains(th[0].Body, "gpupass compare: consistent") || !strings.Contains(th[0].Body, "Signed with the pipeline's cosign key") || !strings.Contains(th[0].Body, "gpupass audit verify audit-report.zip --key cosign.pub") {
		t.Errorf("the PR's report comment lacks the audit's signed-by section: %+v", th)
	}
	if denied != 0 {
		t.Errorf("%d comment requests without the token", denied)
	}
	if _, err := os.Stat(filepath.Join(out, "artifacts", "gpupass-report", "gpupass-report", "junit.xml")); err != nil {
		t.Errorf("report artifact: %v", err)
	}
	p.verifyAudit(t, filepath.Join(out, "artifacts", "audit-report", "audit-report.zip"))
	for _, s := range []string{ghToken, p.us, p.eu, p.read, p.cosignPassword, strings.Split(strings.TrimSpace(p.cosignKey), "\n")[1]} {
		if strings.Contains(log, s) {
			t.Errorf("a secret reached the act log")
		}
	}
	if strings.Contains(log, "goroutine ") {
		t.Errorf("a stack trace reached the act log")
	}
}

// act runs the workflows committed in the user repository through act on a
// pull_request event for sha, on the host, with the action as its release
// installs it (a dry-run release served on loopback), the stack's broker
// as the GPUPASS_BROKER_URL variable, its tokens and the cosign key as
// secrets, and ghAPI as the GitHub API. E2E_OUT is out.
func (p *pipeline) act(t *testing.T, sha, ghAPI, out string, secrets ...string) (string, error) {
	t.Helper()
	return p.actEvent(t, "pull_request", `{"pull_request":{"number":7,"head":{"sha":"`+sha+`"}},"repository":{"full_name":"acme/train","name":"train","owner":{"login":"acme"}}}`,
		ghAPI, out, secrets...)
}

// actRelease is the action at v1 as a dry run of the release leaves it
// (dryRunRelease) and the loopback server of its assets.
type actRelease struct {
	action, pub string
	server      *httptest.Server
}

// actEvent runs the workflows of the user repository that event (its
// name and JSON payload) starts through act, as act does; secrets are
// NAME=VALUE secrets besides the pipeline's own.
func (p *pipeline) actEvent(t *testing.T, name, payload, ghAPI, out string, secrets ...string) (string, error) {
	t.Helper()
	act := lookPath(t, p.toolPath, "act")
	if p.release == nil {
		action, dist, pub := dryRunRelease(t)
		p.release = &actRelease{action: action, pub: pub, server: releaseServer(t, dist, "gpupass/gpupass")}
	}
	uploadStandIn := filepath.Join(testutil.RepoRoot(t), "internal", "ci", "testdata", "upload-artifact")

	event := filepath.Join(t.TempDir(), "event.json")
	os.WriteFile(event, []byte(payload), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{name,
		"-P", "ubuntu-latest=-self-hosted",
		"-e", event,
		"--local-repository", "gpupass/gpupass@v1=" + p.release.action,
		"--local-repository", "actions/upload-artifact@v4=" + uploadStandIn,
		"--env", "E2E_OUT=" + out,
		"--env", "GITHUB_API_URL=" + ghAPI + "/api/v3",
		"--env", "GITHUB_SERVER_URL=" + p.release.server.URL,
		"--env", "GITHUB_REPOSITORY=acme/train",
		"--env", "GPUPASS_INSTALL_COSIGN=" + lookPath(t, p.toolPath, "cosign"),
		"--env", "GPUPASS_INSTALL_COSIGN_PUBLIC_KEY=" + p.release.pub,
		"--var", "GPUPASS_BROKER_URL=" + p.url,
		"-s", "GITHUB_TOKEN=" + ghToken,
		"-s", "BROKER_TOKEN_US=" + p.us,
		"-s", "BROKER_TOKEN_EU=" + p.eu,
		"-s", "BROKER_TOKEN_READ=" + p.read,
		"-s", "COSIGN_KEY=" + p.cosignKey,
		"-s", "COSIGN_PASSWORD=" + p.cosignPassword,
	}
	for _, s := range secrets {
		args = append(args, "-s", s)
	}
	cmd := exec.CommandContext(ctx, act, args...)
	cmd.Dir = p.user
	cmd.Env = append(os.Environ(), "PATH="+p.toolPath)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// TestExamplePipelineThroughGitLabCILocal runs examples/ci/gitlab/.gitlab-ci.yml,
// as a user commits it, through gitlab-ci-local on the shell executor
// against a `gpupass up` stack: validate → train us-west-2 + eu-central-1
// (the real PyTorch example) → compare-report + audit, with no stages list and no needs, so
// the report and the audit wait for the train jobs by default and read
// their allocation ids from dotenv. Every component is included at the
// semantic-version tag 1.0.0 of the catalog project the release script
// assembles, fetched by gitlab-ci-local over git's HTTP protocol from a
// loopback remote (the user repository's origin host, as on GitLab);
// CI_API_V4_URL points to a loopback server that records the MR note.
func TestExamplePipelineThroughGitLabCILocal(t *testing.T) {
	remote := catalogRemote(t, "1.0.0", testImage)
	p := startPipeline(t, remote+"/acme/train.git")
	glci := lookPath(t, p.toolPath, "gitlab-ci-local")
	lookPath(t, p.toolPath, "rsync")
	root := testutil.RepoRoot(t)
	ci, err := os.ReadFile(filepath.Join(root, "examples", "ci", "gitlab", ".gitlab-ci.yml"))
	if err != nil {
		t.Fatal(err)
	}
	p.commit(t, map[string]string{".gitlab-ci.yml": string(ci)})
	sha := p.head(t)
	checkExamplePlan(t, glci, p)

	const glToken = "glpat-e2e-pipeline-secret-61aa"
	notes := gitlabNotes(glToken)
	glAPI := httptest.NewServer(notes.handler())
	defer glAPI.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, glci, "--shell-executor-no-image", "--force-shell-executor",
		// gitlab-ci-local marks its jobs GITLAB_CI=false; this pipeline
		// stands in for a real GitLab merge request pipeline.
		"--variable", "GITLAB_CI=true",
		"--variable", "CI_API_V4_URL="+glAPI.URL+"/api/v4",
		"--variable", "CI_MERGE_REQUEST_IID=3",
		"--variable", "CI_MERGE_REQUEST_PROJECT_ID=42",
		"--variable", "GPUPASS_BROKER_URL="+p.url,
		"--variable", "BROKER_TOKEN_US="+p.us,
		"--variable", "BROKER_TOKEN_EU="+p.eu,
		"--variable", "BROKER_TOKEN_READ="+p.read,
		"--variable", "GPUPASS_GITLAB_TOKEN="+glToken,
		"--variable", "COSIGN_KEY="+p.cosignKey,
		"--variable", "COSIGN_PASSWORD="+p.cosignPassword,
	)
	cmd.Dir = p.user
	cmd.Env = append(os.Environ(), "PATH="+p.toolPath, "GITHUB_ACTIONS=", "CI=")
	b, runErr := cmd.CombinedOutput()
	log := string(b)
	defer func() {
		if t.Failed() {
			t.Logf("pipeline log:\n%s", upstack.Tail(log, 20000))
		}
	}()
	jobs := []string{"gpupass-validate", "gpupass-train-us-west-2", "gpupass-train-eu-central-1", "gpupass-compare-report", "gpupass-audit"}
	if runErr != nil {
		t.Errorf("gitlab-ci-local: %v", runErr)
	}
	for _, job := range jobs {
		if !strings.Contains(log, "PASS  "+job) {
			t.Errorf("job %s did not pass", job)
		}
	}
	// The report and the audit started after both train jobs finished.
	for _, later := range []string{"gpupass-compare-report", "gpupass-audit"} {
		start := regexp.MustCompile(`(?m)^\s*` + later + `\s+starting`).FindStringIndex(log)
		for _, train := range []string{"gpupass-train-us-west-2", "gpupass-train-eu-central-1"} {
			done := regexp.MustCompile(`(?m)^\s*` + train + `\s+finished in`).FindStringIndex(log)
			if start == nil || done == nil || start[0] < done[0] {
				t.Errorf("%s did not wait for %s", later, train)
			}
		}
	}
	// The dotenv hand-off: each train job's allocation id by region.
	ids := trainIDs(t, p.user)
	p.checkRuns(t, ids, sha)
	// The compare job read both ids from the dotenv: the note names them.
	notes.mu.Lock()
	bodies, denied := notes.bodies, notes.denied
	notes.mu.Unlock()
	if len(bodies) != 1 || !strings.Contains(bodies[0], "gpupass compare: consistent") || !strings.Contains(bodies[0], ids["us-west-2"]) || !strings.Contains(bodies[0], ids["eu-central-1"]) {
		t.Errorf("MR notes posted = %q, want one compare report of %v", bodies, ids)
	}
	// The audit job, in .post, added who signed (the key) to it.
	if th := notes.thread(); len(th) != 1 || !strings.Contains(th[0].Body, "gpupass compare: consistent") || !strings.Contains(th[0].Body, "Signed with the pipeline's cosign key") || !strings.Contains(th[0].Body, "gpupass audit verify audit-report.zip --key cosign.pub") {
		t.Errorf("the MR's report note lacks the audit's signed-by section: %+v", th)
	}
	if denied != 0 {
		t.Errorf("%d note requests without the project access token", denied)
	}
	for _, f := range []string{
		"gpupass-validate/gl-code-quality-report.json",
		"gpupass-compare-report/gpupass-report/junit.xml",
		"gpupass-compare-report/.gitlab-ci-reports/dotenv/gpupass.env",
	} {
		if _, err := os.Stat(filepath.Join(p.user, ".gitlab-ci-local", "artifacts", f)); err != nil {
			t.Errorf("artifact %s: %v", f, err)
		}
	}
	for _, want := range []string{"gpupass_train took", "gpupass_compare-report took"} {
		if !strings.Contains(log, want) {
			t.Errorf("pipeline log lacks the section %q", want)
		}
	}
	p.verifyAudit(t, filepath.Join(p.user, ".gitlab-ci-local", "artifacts", "gpupass-audit", "audit-report.zip"))
	logs, _ := filepath.Glob(filepath.Join(p.user, ".gitlab-ci-local", "output", "*.log"))
	for _, l := range append(logs, "") {
		text := log
		if l != "" {
			b, _ := os.ReadFile(l)
			text = string(b)
		}
		for _, s := range []string{glToken, p.us, p.eu, p.read, p.cosignPassword, strings.Split(strings.TrimSpace(p.cosignKey), "\n")[1]} {
			if strings.Contains(text, s) {
				t.Errorf("a secret reached the job log %s", l)
			}
		}
		if strings.Contains(text, "goroutine ") {
			t.Errorf("a stack trace reached the job log %s", l)
		}
	}
}

// TestDetachedTrainThroughAct (#35): through act, the action's train step
// with wait "false" succeeds while its run has not ended, outputs the
// run group, and a later job's `gpupass -o github wait -- "$GROUP"` step
// follows the run to the end and succeeds with it; the audit step given
// the group writes one zip per run into a directory, its audit-path
// output, which the audit-verify step verifies.
func TestDetachedTrainThroughAct(t *testing.T) {
	p := startPipeline(t, "https://github.com/acme/train.git")
	wf, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "internal", "ci", "testdata", "act-detached", "gpupass.yml"))
	if err != nil {
		t.Fatal(err)
	}
	p.commit(t, map[string]string{".github/workflows/gpupass.yml": string(wf)})
	ghAPI := httptest.NewServer(githubComments(ghToken).handler())
	defer ghAPI.Close()
	out := t.TempDir()
	pub, err := os.ReadFile(p.cosignPub)
	if err != nil {
		t.Fatal(err)
	}
	log, runErr := p.act(t, p.head(t), ghAPI.URL, out, "COSIGN_PUB="+string(pub))
	defer func() {
		if t.Failed() {
			t.Logf("act log:\n%s", upstack.Tail(log, 20000))
		}
	}()
	if runErr != nil {
		t.Errorf("act: %v", runErr)
	}
	for _, job := range []string{"train", "wait"} {
		if !regexp.MustCompile(`\[gpupass-detached/` + job + ` *\] \x{1F3C1}  Job succeeded`).MatchString(log) {
			t.Errorf("job %s did not succeed", job)
		}
	}
	m := regexp.MustCompile(`::set-output:: group=(group-[0-9a-f]{16})`).FindStringSubmatch(log)
	if m == nil {
		t.Fatal("the train step output no group")
	}
	// When the train step had ended, its run had not.
	b, err := os.ReadFile(filepath.Join(out, "after-train.json"))
	var after struct {
		Runs []struct{ ID, Region, State, Group string }
	}
	if err != nil || json.Unmarshal(b, &after) != nil || len(after.Runs) != 1 || after.Runs[0].Group != m[1] {
		t.Fatalf("runs --group after the train step: %v\n%s", err, b)
	}
	if st := after.Runs[0].State; st == "succeeded" || st == "failed" || st == "cancelled" {
		t.Errorf("the run had ended (%s) when the train step did: wait false did not detach", st)
	}
	// The wait step followed it to the end: its log, its table, success.
	// The group's audit: a directory named by the group, handed on as
	// audit-path, verified whole by the audit-verify step.
	if !strings.Contains(log, "::set-output:: audit-path=audit-"+m[1]) {
		t.Errorf("the audit step of group %s did not output its directory as audit-path", m[1])
	}
	p.verifyAudit(t, filepath.Join(out, "audit", "audit-us-west-2.zip"))
	for _, want := range []string{"run group " + m[1], "us-west-2 | ", "succeeded", "Success - Main Wait for the runs", "verified all 1 audit reports"} {
		if !strings.Contains(log, want) {
			t.Errorf("act log lacks %q", want)
		}
	}
	for _, s := range []string{ghToken, p.us, p.eu, p.read} {
		if strings.Contains(log, s) {
			t.Errorf("a secret reached the act log")
		}
	}
}
