//go:build e2e

package ci_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #35's "done when": training that outlives its CI job closes the
// loop through the broker's webhook. The train step ends while its runs
// go on; when they end, the broker's signed event reaches a receiver on
// loopback (as docs/webhooks.md writes one), which starts the forge's
// workflow or pipeline with the event; that posts the report on the pull
// or merge request the train step ran for, which only the event's ci
// context names.

// loopStepSleep: the runs sleep a second per step (EXAMPLE_STEP_SLEEP),
// so they outlive the detached train job by tens of seconds.
const loopStepSleep = "EXAMPLE_STEP_SLEEP=1"

// groupEvent is the part of the broker's group.ended event the receivers
// read (docs/webhooks.md).
type groupEvent struct {
	Event   string    `json:"event"`
	Group   string    `json:"group"`
	EndedAt time.Time `json:"ended_at"`
	Runs    []struct {
		Allocation string `json:"allocation"`
		Region     string `json:"region"`
		State      string `json:"state"`
	} `json:"runs"`
	CI *struct {
		Forge       string `json:"forge"`
		Repository  string `json:"repository"`
		PullRequest int64  `json:"pull_request"`
		ProjectID   string `json:"project_id"`
	} `json:"ci"`
}

// hookReceiver is the webhook receiver of docs/webhooks.md on loopback:
// it checks X-Gpupass-Signature-256 over the raw body with the webhook's
// secret (401 otherwise), answers at once, dedupes on X-Gpupass-Delivery
// and hands each verified event on, to be turned into a workflow run.
type hookReceiver struct {
	*httptest.Server
	secret []byte
	events chan hookDelivery

	mu     sync.Mutex
	seen   map[string]bool
	forged int
}

type hookDelivery struct {
	body []byte
	ev   groupEvent
	at   time.Time
}

func newHookReceiver(t *testing.T, secret []byte) *hookReceiver {
	t.Helper()
	h := &hookReceiver{secret: secret, events: make(chan hookDelivery, 8), seen: map[string]bool{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		mac := hmac.New(sha256.New, h.secret)
		mac.Write(body)
		want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
		if err != nil || !hmac.Equal([]byte(want), []byte(r.Header.Get("X-Gpupass-Signature-256"))) {
			h.mu.Lock()
			h.forged++
			h.mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev groupEvent
		if err := json.Unmarshal(body, &ev); err != nil || r.Header.Get("X-Gpupass-Event") != "group.ended" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		dup := h.seen[r.Header.Get("X-Gpupass-Delivery")]
		h.seen[r.Header.Get("X-Gpupass-Delivery")] = true
		h.mu.Unlock()
		if !dup {
			h.events <- hookDelivery{body: body, ev: ev, at: time.Now()}
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(h.Close)
	return h
}

// next waits for the next verified event.
func (h *hookReceiver) next(t *testing.T, within time.Duration) hookDelivery {
	t.Helper()
	select {
	case d := <-h.events:
		return d
	case <-time.After(within):
		t.Fatalf("no webhook event within %s", within)
	}
	return hookDelivery{}
}

// loopSecret is the webhook's secret, shared by the broker and the
// receiver.
var loopSecret = []byte("e2e-webhook-secret-5b0d2c71a9e84f36b1c0")

// addWebhook configures the stack's broker to call url with secret, as
// an operator does (gpupass-broker webhook add with a secret file, which
// ends in a newline as openssl writes it).
func (p *pipeline) addWebhook(t *testing.T, url string, secret []byte) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "webhook.secret")
	if err := os.WriteFile(f, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(p.broker(), "--db", p.db(), "webhook", "add", "--url", url, "--secret-file", f).CombinedOutput(); err != nil {
		t.Fatalf("webhook add: %v\n%s", err, b)
	}
}

// example reads a file of examples/ci, which the docs include.
func example(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{testutil.RepoRoot(t), "examples", "ci"}, parts...)...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkGroupEvent checks the event of the train step's group: both
// runs succeeded, they ended after the train step had (it detached), and
// the ci context names the pull or merge request it ran for.
func checkGroupEvent(t *testing.T, d hookDelivery, group, forge string, pr int64, trainEnded time.Time) {
	t.Helper()
	ev := d.ev
	if ev.Group != group || len(ev.Runs) != 2 {
		t.Fatalf("webhook event %s; want group %s and its 2 runs", d.body, group)
	}
	for _, r := range ev.Runs {
		if r.State != "succeeded" {
			t.Errorf("run %s (%s) %s; want succeeded", r.Allocation, r.Region, r.State)
		}
	}
	if !ev.EndedAt.After(trainEnded) {
		t.Errorf("the group ended at %s, before the train job did (%s): the train step did not detach", ev.EndedAt, trainEnded)
	}
	if ev.CI == nil || ev.CI.Forge != forge || ev.CI.Repository != "acme/train" || ev.CI.PullRequest != pr {
		t.Errorf("webhook event %s; want ci of %s acme/train, pull request %d", d.body, forge, pr)
	}
	t.Logf("group %s ended %s after the train job; its event reached the receiver %s later: %s",
		ev.Group, ev.EndedAt.Sub(trainEnded).Round(time.Millisecond), d.at.Sub(ev.EndedAt).Round(time.Millisecond), d.body)
}

// checkReport checks the forge's thread: one report comment, carrying
// the verdict and both runs of the group, and it returns it.
func checkReport(t *testing.T, s *forgeServer, ev groupEvent) forgeComment {
	t.Helper()
	thread := s.thread()
	if len(thread) != 1 {
		t.Fatalf("comments on the pull request: %+v; want one report", thread)
	}
	c := thread[0]
	if !strings.Contains(c.Body, "gpupass compare: consistent") {
		t.Errorf("report %q lacks the verdict", c.Body)
	}
	for _, r := range ev.Runs {
		if !strings.Contains(c.Body, r.Allocation) {
			t.Errorf("report lacks run %s (%s):\n%s", r.Allocation, r.Region, c.Body)
		}
	}
	t.Logf("the report, as the pull request shows it (%d edits before):\n%s", len(c.History), c.Body)
	s.mu.Lock()
	denied := s.denied
	s.mu.Unlock()
	if denied != 0 {
		t.Errorf("%d forge requests without the token", denied)
	}
	return c
}

// noSecrets fails when one of secrets is in log.
func noSecrets(t *testing.T, what, log string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(log, s) {
			t.Errorf("a secret reached the %s", what)
		}
	}
	if strings.Contains(log, "goroutine ") {
		t.Errorf("a stack trace reached the %s", what)
	}
}

// TestWebhookLoopThroughAct: examples/ci/github/gpupass-detached.yml on a
// pull request (#7) through act trains both regions as one group with
// wait "false", posts an "in progress" report on the pull request (partial
// "true") and ends while the runs go on; the broker's webhook reaches
// the receiver, which runs `act repository_dispatch` with the event as
// client_payload, starting examples/ci/github/gpupass-group-ended.yml;
// its compare-report step takes the group and the pull request from the
// payload and edits the in-progress comment on #7 of the fake GitHub into
// the verdict.
func TestWebhookLoopThroughAct(t *testing.T) {
	p := startPipeline(t, "https://github.com/acme/train.git", loopStepSleep)
	train := p.token(t, "submit", "us-west-2,eu-central-1")
	rec := newHookReceiver(t, loopSecret)
	p.addWebhook(t, rec.URL+"/gpupass", loopSecret)
	p.commit(t, map[string]string{
		".github/workflows/gpupass-detached.yml":    example(t, "github", "gpupass-detached.yml"),
		".github/workflows/gpupass-group-ended.yml": example(t, "github", "gpupass-group-ended.yml"),
	})
	comments := githubComments(ghToken)
	ghAPI := httptest.NewServer(comments.handler())
	defer ghAPI.Close()
	out := t.TempDir()
	secrets := []string{ghToken, p.us, p.eu, p.read, train, string(loopSecret)}

	log, runErr := p.act(t, p.head(t), ghAPI.URL, out, "BROKER_TOKEN_TRAIN="+train)
	trainEnded := time.Now()
	defer func() {
		if t.Failed() {
			t.Logf("act pull_request log:\n%s", upstack.Tail(log, 12000))
		}
	}()
	if runErr != nil || !regexp.MustCompile(`\[gpupass-train/train *\] \x{1F3C1}  Job succeeded`).MatchString(log) {
		t.Fatalf("the train job did not succeed: %v", runErr)
	}
	m := regexp.MustCompile(`::set-output:: group=(group-[0-9a-f]{16})`).FindStringSubmatch(log)
	if m == nil {
		t.Fatal("the train step output no group")
	}
	noSecrets(t, "act log", log, secrets...)
	// The pull request's workflow posted the in-progress report, and
	// only that: no verdict while the runs run.
	progress := comments.thread()
	if len(progress) != 1 || !strings.Contains(progress[0].Body, "gpupass compare: in progress") ||
		!strings.Contains(log, "::set-output:: verdict=in progress") {
		t.Errorf("the pull request's workflow left %+v; want one in-progress report", progress)
	}

	// The receiver, as docs/webhooks.md's (TestDocsReceiversMatch): the
	// verified event is the client_payload.
	d := rec.next(t, 5*time.Minute)
	checkGroupEvent(t, d, m[1], "github", 7, trainEnded)
	payload, err := dispatchPayload(d.body, "acme/train")
	if err != nil {
		t.Fatal(err)
	}
	dispatch, err := json.Marshal(map[string]any{"action": "gpupass-group-ended", "client_payload": payload,
		"repository": map[string]any{"full_name": "acme/train", "name": "train", "owner": map[string]any{"login": "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	dlog, runErr := p.actEvent(t, "repository_dispatch", string(dispatch), ghAPI.URL, out)
	defer func() {
		if t.Failed() {
			t.Logf("act repository_dispatch log:\n%s", upstack.Tail(dlog, 12000))
		}
	}()
	if runErr != nil || !regexp.MustCompile(`\[gpupass-group-ended/compare *\] \x{1F3C1}  Job succeeded`).MatchString(dlog) {
		t.Errorf("the compare job did not succeed: %v", runErr)
	}
	if !strings.Contains(dlog, "::set-output:: verdict=consistent") {
		t.Errorf("act log lacks the verdict output")
	}
	// The verdict edited the in-progress comment in place: one comment,
	// which read "in progress" before.
	if c := checkReport(t, comments, d.ev); len(progress) == 1 &&
		(c.ID != progress[0].ID || len(c.History) != 1 || !strings.Contains(c.History[0], "gpupass compare: in progress")) {
		t.Errorf("the verdict is comment %d after %d edits (%q); want comment %d, the in-progress report edited once",
			c.ID, len(c.History), c.History, progress[0].ID)
	}
	noSecrets(t, "act log", dlog, secrets...)
	rec.mu.Lock()
	forged := rec.forged
	rec.mu.Unlock()
	if forged != 0 {
		t.Errorf("%d webhook requests did not verify", forged)
	}
}

// TestWebhookLoopThroughGitLabCILocal: examples/ci/gitlab/webhook.gitlab-ci.yml
// in a merge request pipeline (!3 of project 42) through gitlab-ci-local
// runs its detached train job, which ends while the runs go on, and its
// progress job, which posts the "in progress" note; the
// broker's webhook reaches the receiver, which starts the pipeline as a
// pipeline trigger does (CI_PIPELINE_SOURCE=trigger, the group and the
// merge request as variables); its compare-report job, the component at
// 1.0.0 of the catalog, edits that note on !3 of the fake GitLab into the
// verdict.
func TestWebhookLoopThroughGitLabCILocal(t *testing.T) {
	remote := catalogRemote(t, "1.0.0", testImage)
	p := startPipeline(t, remote+"/acme/train.git", loopStepSleep)
	glci := lookPath(t, p.toolPath, "gitlab-ci-local")
	lookPath(t, p.toolPath, "rsync")
	train := p.token(t, "submit", "us-west-2,eu-central-1")
	rec := newHookReceiver(t, loopSecret)
	p.addWebhook(t, rec.URL+"/gpupass", loopSecret)
	p.commit(t, map[string]string{".gitlab-ci.yml": example(t, "gitlab", "webhook.gitlab-ci.yml")})

	const glToken = "glpat-e2e-loop-secret-7c21"
	notes := gitlabNotes(glToken)
	glAPI := httptest.NewServer(notes.handler())
	defer glAPI.Close()
	secrets := []string{glToken, p.read, train, string(loopSecret)}
	// pipeline runs gitlab-ci-local on the shell executor with the
	// project's CI/CD variables and vars, as GitLab starts a pipeline.
	pipeline := func(vars ...string) (string, error) {
		args := []string{"--shell-executor-no-image", "--force-shell-executor",
			// gitlab-ci-local marks its jobs GITLAB_CI=false; these
			// pipelines stand in for GitLab's.
			"--variable", "GITLAB_CI=true",
			"--variable", "CI_API_V4_URL=" + glAPI.URL + "/api/v4",
			// The project's id, as GitLab sets it in every pipeline.
			"--variable", "CI_PROJECT_ID=42",
			"--variable", "GPUPASS_BROKER_URL=" + p.url,
			"--variable", "BROKER_TOKEN_TRAIN=" + train,
			"--variable", "BROKER_TOKEN_READ=" + p.read,
			"--variable", "GPUPASS_GITLAB_TOKEN=" + glToken,
		}
		for _, v := range vars {
			args = append(args, "--variable", v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		for attempt := 1; ; attempt++ {
			cmd := exec.CommandContext(ctx, glci, args...)
			cmd.Dir = p.user
			cmd.Env = append(os.Environ(), "PATH="+p.toolPath, "GITHUB_ACTIONS=", "CI=")
			b, err := cmd.CombinedOutput()
			if err != nil && attempt == 1 && fetchRace(string(b)) {
				continue // gitlab-ci-local's own race fetching components
			}
			return string(b), err
		}
	}

	log, runErr := pipeline("CI_PIPELINE_SOURCE=merge_request_event", "CI_MERGE_REQUEST_IID=3", "CI_MERGE_REQUEST_PROJECT_ID=42")
	trainEnded := time.Now()
	defer func() {
		if t.Failed() {
			t.Logf("merge request pipeline log:\n%s", upstack.Tail(log, 12000))
		}
	}()
	if runErr != nil || !strings.Contains(log, "PASS  gpupass-train") || !strings.Contains(log, "PASS  gpupass-progress") {
		t.Fatalf("the train and progress jobs did not pass: %v", runErr)
	}
	// The merge request pipeline posted the in-progress note, and only
	// that.
	progress := notes.thread()
	if len(progress) != 1 || !strings.Contains(progress[0].Body, "gpupass compare: in progress") {
		t.Errorf("the merge request pipeline left %+v; want one in-progress note", progress)
	}
	if strings.Contains(log, "gpupass-compare-report") {
		t.Errorf("the merge request pipeline ran the compare job, which is the triggered pipeline's")
	}
	env, err := os.ReadFile(filepath.Join(p.user, ".gitlab-ci-local", "artifacts", "gpupass-train", ".gitlab-ci-reports", "dotenv", "gpupass.env"))
	m := regexp.MustCompile(`(?m)^GPUPASS_GROUP=(group-[0-9a-f]{16})$`).FindSubmatch(env)
	if err != nil || m == nil {
		t.Fatalf("the train job's dotenv holds no group: %v\n%s", err, env)
	}
	noSecrets(t, "pipeline log", log, secrets...)

	// The receiver, as docs/webhooks.md's (TestDocsReceiversMatch): a
	// trigger of this project with the group and, when the event's ci is
	// this project's, its merge request.
	d := rec.next(t, 5*time.Minute)
	checkGroupEvent(t, d, string(m[1]), "gitlab", 3, trainEnded)
	tv, err := triggerVariables(d.body, 42)
	if err != nil {
		t.Fatal(err)
	}
	if tv["GPUPASS_MERGE_REQUEST"] != "3" {
		t.Errorf("the trigger's variables %v name no merge request 3 of project 42", tv)
	}
	vars := []string{"CI_PIPELINE_SOURCE=trigger"}
	for k, v := range tv {
		vars = append(vars, k+"="+v)
	}
	tlog, runErr := pipeline(vars...)
	defer func() {
		if t.Failed() {
			t.Logf("triggered pipeline log:\n%s", upstack.Tail(tlog, 12000))
		}
	}()
	if runErr != nil || !strings.Contains(tlog, "PASS  gpupass-compare-report") {
		t.Errorf("the compare job did not pass: %v", runErr)
	}
	if strings.Contains(tlog, "gpupass-train ") {
		t.Errorf("the triggered pipeline ran the train job again")
	}
	if c := checkReport(t, notes, d.ev); len(progress) == 1 &&
		(c.ID != progress[0].ID || len(c.History) != 1 || !strings.Contains(c.History[0], "gpupass compare: in progress")) {
		t.Errorf("the verdict is note %d after %d edits (%q); want note %d, the in-progress note edited once",
			c.ID, len(c.History), c.History, progress[0].ID)
	}
	noSecrets(t, "pipeline log", tlog, secrets...)
	logs, _ := filepath.Glob(filepath.Join(p.user, ".gitlab-ci-local", "output", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		noSecrets(t, fmt.Sprintf("job log %s", l), string(b), secrets...)
	}
}
