package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/forge"
)

// writeRuns writes two consistent runs (JSONL and CSVLogger) and one that
// diverges from step 60, into dir.
func writeRuns(t *testing.T, dir string) (us, eu, bad string) {
	t.Helper()
	var a, b, c strings.Builder
	b.WriteString("epoch,step,train_loss\n")
	for st := 0; st <= 100; st += 10 {
		v := 0.5 + 2*math.Exp(-float64(st)/40)
		fmt.Fprintf(&a, `{"step":%d,"loss":%g,"ts":"2026-03-01T10:%02d:00+02:00"}`+"\n", st, v, st/2)
		fmt.Fprintf(&b, "0,%d,%g\n", st, v*1.01)
		if st >= 60 {
			v += 0.5
		}
		fmt.Fprintf(&c, `{"step":%d,"loss":%g}`+"\n", st, v)
	}
	us, eu, bad = filepath.Join(dir, "us.jsonl"), filepath.Join(dir, "eu", "metrics.csv"), filepath.Join(dir, "ap.jsonl")
	os.MkdirAll(filepath.Dir(eu), 0o755)
	for p, s := range map[string]string{us: a.String(), eu: b.String(), bad: c.String() + "garbage\n"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return us, eu, bad
}

func runCLI(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	// With the forge clients linked in, as cmd/gpupass runs a compare
	// that posts.
	code := Main(context.Background(), append([]string{"compare"}, args...), strings.NewReader(""), &out, &errb, WithPoster(forgepost.Poster{}))
	return out.String(), errb.String(), code
}

// The CLI tests set environment variables, so they do not run in parallel.
func TestCompareText(t *testing.T) {
	dir := t.TempDir()
	us, eu, bad := writeRuns(t, dir)
	summary := filepath.Join(dir, "summary.md")
	svg, junit, js, md, png := filepath.Join(dir, "c.svg"), filepath.Join(dir, "c.xml"), filepath.Join(dir, "c.json"), filepath.Join(dir, "c.md"), filepath.Join(dir, "c.png")
	clean := map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": summary}
	out, stderr, code := runCLI(t, clean, us, eu, "--label", "ap="+bad, "--tolerance", "abs=0.1", "--svg", svg, "--junit", junit, "--json", js, "--markdown", md, "--png", png)
	if code != 0 {
		t.Fatalf("exit %d without --fail-on-divergence; stderr %s", code, stderr)
	}
	for _, want := range []string{"❌ gpupass compare: diverged", "| us vs eu ", "| us vs ap ", "step 60", "xychart-beta", "ap: skipped 1 malformed (line 12: not a JSON object)"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, "skipped malformed input") {
		t.Errorf("stderr lacks the malformed-input warning: %s", stderr)
	}
	for _, p := range []string{svg, junit, js, md, png, summary} {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", p, err, len(b))
		}
	}
	if b, _ := os.ReadFile(md); string(b) != out {
		t.Error("--markdown file differs from stdout")
	}

	_, stderr, code = runCLI(t, clean, us, eu, "--label", "ap="+bad, "--tolerance", "abs=0.1", "--fail-on-divergence")
	if code != ExitFindings || !strings.Contains(stderr, "runs diverged (tolerance |Δ| ≤ 0.1)") {
		t.Errorf("exit %d stderr %q, want 1 and the divergence", code, stderr)
	}
	_, _, code = runCLI(t, clean, us, eu, "--fail-on-divergence")
	if code != 0 {
		t.Errorf("consistent runs: exit %d", code)
	}
}

func TestCompareJSONOnly(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	out, _, code := runCLI(t, map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": ""}, "-o", "json", us, eu)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var got struct {
		Verdict string
		Runs    []struct{ Label string }
	}
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Error("more than one JSON value on stdout")
	}
	if got.Verdict != "consistent" || len(got.Runs) != 2 || got.Runs[1].Label != "eu" {
		t.Errorf("got %+v (eu's label comes from its directory)", got)
	}
}

func TestCompareBadInput(t *testing.T) {
	dir := t.TempDir()
	us, _, _ := writeRuns(t, dir)
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, []byte("x\n"), 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "nothing to compare"},
		{"duplicate labels", []string{us, "--label", "a=" + us, "--label", "a=" + empty}, `the name "a" is given twice`},
		{"one run under two labels", []string{"--label", "a=" + us, "--label", "b=" + us}, `--label "b=` + us + `": the names "a" and "b" are given to the same run ` + us},
		{"duplicate default labels", []string{us, filepath.Join(dir, "us.jsonl")}, ""},
		{"alloc without broker", []string{us, "alloc-7f3a"}, "alloc-7f3a: no such file, and allocation ids need the broker"},
		{"missing file", []string{us, filepath.Join(dir, "nope.csv")}, "nope.csv: no such file"},
		{"empty series", []string{us, empty}, "no loss values found; read 1 line(s) as a text log"},
		{"bad tolerance", []string{us, "--tolerance", "abc"}, "--tolerance"},
		{"bad behavior", []string{us, "--comment-behavior", "hide"}, "--comment-behavior"},
		{"bad price", []string{us, "--price", "zz=1"}, `no run named "zz"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// No `gpupass up` config and no broker in the environment.
			env := map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": "", "GPUPASS_STATE_DIR": dir, "GPUPASS_BROKER_URL": ""}
			_, stderr, code := runCLI(t, env, tc.args...)
			if tc.want == "" {
				// The same path twice is one run, not a duplicate label.
				if code != 0 {
					t.Errorf("exit %d: %s", code, stderr)
				}
				return
			}
			if code != ExitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stderr %q, want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

// githubPR is a minimal GitHub issue-comments endpoint for the CLI test,
// posting as GITHUB_TOKEN does (the Actions bot, refused by GET /user):
// it keeps the comments and takes edits, so a test can see a sticky
// comment replaced in place. internal/forge/github tests the API in depth.
type githubPR struct {
	mu       sync.Mutex
	posts    []string // bodies created, in order
	edits    int
	comments []githubComment
}

type githubComment struct {
	ID   int64  `json:"id"`
	Body string `json:"body"`
	URL  string `json:"html_url"`
	User struct {
		Login string `json:"login"`
		Type  string `json:"type"`
	} `json:"user"`
}

func (g *githubPR) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	const base = "/repos/acme/train/issues/"
	switch {
	case r.Method == "GET" && r.URL.Path == base+"7/comments":
		json.NewEncoder(w).Encode(append([]githubComment{}, g.comments...))
	case r.Method == "GET" && r.URL.Path == "/user":
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"message":"Resource not accessible by integration"}`)
	case r.Method == "POST" && r.URL.Path == base+"7/comments":
		var c githubComment
		json.NewDecoder(r.Body).Decode(&c)
		g.posts = append(g.posts, c.Body)
		c.ID = int64(len(g.posts))
		c.URL = fmt.Sprintf("http://127.0.0.1/pr/7#%d", c.ID)
		c.User.Login, c.User.Type = "github-actions[bot]", "Bot"
		g.comments = append(g.comments, c)
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(c)
	case r.Method == "PATCH" && strings.HasPrefix(r.URL.Path, base+"comments/"):
		var c githubComment
		json.NewDecoder(r.Body).Decode(&c)
		for i := range g.comments {
			if fmt.Sprint(g.comments[i].ID) == strings.TrimPrefix(r.URL.Path, base+"comments/") {
				g.comments[i].Body = c.Body
				g.edits++
				json.NewEncoder(w).Encode(g.comments[i])
				return
			}
		}
		http.NotFound(w, r)
	default:
		http.NotFound(w, r)
	}
}

// Bodies are the pull request's comments now, oldest first.
func (g *githubPR) Bodies() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, c := range g.comments {
		out = append(out, c.Body)
	}
	return out
}

// Edits counts the comments edited in place.
func (g *githubPR) Edits() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.edits
}

func TestComparePostsToGitHub(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	g := &githubPR{}
	srv := httptest.NewServer(g)
	defer srv.Close()
	event := filepath.Join(dir, "event.json")
	os.WriteFile(event, []byte(`{"pull_request":{"number":7}}`), 0o644)
	env := map[string]string{
		"GITHUB_ACTIONS": "true", "GITLAB_CI": "", "GITHUB_EVENT_PATH": event, "GITHUB_REPOSITORY": "acme/train",
		"GITHUB_RUN_ID": "77", "GITHUB_API_URL": srv.URL, "GITHUB_TOKEN": "ghs_x", "GITHUB_STEP_SUMMARY": filepath.Join(dir, "s.md"),
	}
	out, stderr, code := runCLI(t, env, us, eu, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if len(g.posts) != 1 || !strings.HasPrefix(g.posts[0], `<!-- gpupass:report tag="compare" run=77 `) {
		t.Fatalf("posts %q", g.posts)
	}
	var got struct{ Posted struct{ Action, URL string } }
	json.Unmarshal([]byte(out), &got)
	if d := cmp.Diff("created", got.Posted.Action); d != "" {
		t.Errorf("posted action (-want +got):\n%s", d)
	}
}

func TestCompareGitLabJobToken(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	env := map[string]string{
		"GITHUB_ACTIONS": "", "GITLAB_CI": "true", "CI_API_V4_URL": "http://127.0.0.1:1/api/v4", "CI_MERGE_REQUEST_PROJECT_ID": "4",
		"CI_MERGE_REQUEST_IID": "2", "CI_JOB_TOKEN": "job", "GITLAB_TOKEN": "", "GPUPASS_GITLAB_TOKEN": "", "GITHUB_STEP_SUMMARY": "",
	}
	_, stderr, code := runCLI(t, env, us, eu)
	if code != ExitUsage || !strings.Contains(stderr, "only CI_JOB_TOKEN is available: a CI job token cannot post merge request notes: create a project access token") {
		t.Errorf("exit %d stderr %q", code, stderr)
	}
}

// gitlabMR is a minimal GitLab MR-notes endpoint for the CLI test, its
// token's account user 9: it keeps the notes and takes edits, so a test
// can see a sticky note replaced in place. internal/forge/gitlab tests
// the API in depth.
type gitlabMR struct {
	mu     sync.Mutex
	notes  []string // bodies created, in order
	edits  int
	stored []gitlabNote
	token  string
}

type gitlabNote struct {
	ID     int64  `json:"id"`
	Body   string `json:"body"`
	Author struct {
		ID int64 `json:"id"`
	} `json:"author"`
}

func (g *gitlabMR) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.token = r.Header.Get("PRIVATE-TOKEN")
	const path = "/api/v4/projects/4/merge_requests/2/notes"
	switch {
	case r.Method == "GET" && r.URL.Path == path:
		json.NewEncoder(w).Encode(append([]gitlabNote{}, g.stored...))
	case r.Method == "GET" && r.URL.Path == "/api/v4/user":
		io.WriteString(w, `{"id":9,"username":"ci"}`)
	case r.Method == "POST" && r.URL.Path == path:
		var n gitlabNote
		json.NewDecoder(r.Body).Decode(&n)
		g.notes = append(g.notes, n.Body)
		n.ID = int64(len(g.notes)) + 4
		n.Author.ID = 9
		g.stored = append(g.stored, n)
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(n)
	case r.Method == "PUT" && strings.HasPrefix(r.URL.Path, path+"/"):
		var n gitlabNote
		json.NewDecoder(r.Body).Decode(&n)
		for i := range g.stored {
			if fmt.Sprint(g.stored[i].ID) == strings.TrimPrefix(r.URL.Path, path+"/") {
				g.stored[i].Body = n.Body
				g.edits++
				json.NewEncoder(w).Encode(g.stored[i])
				return
			}
		}
		http.NotFound(w, r)
	default:
		http.NotFound(w, r)
	}
}

// Bodies are the merge request's notes now, oldest first.
func (g *gitlabMR) Bodies() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, n := range g.stored {
		out = append(out, n.Body)
	}
	return out
}

// Edits counts the notes edited in place.
func (g *gitlabMR) Edits() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.edits
}

func TestComparePostsToGitLab(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	g := &gitlabMR{}
	srv := httptest.NewServer(g)
	defer srv.Close()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("glpat-secret\n"), 0o600)
	env := map[string]string{
		"GITHUB_ACTIONS": "", "GITLAB_CI": "true", "GITHUB_STEP_SUMMARY": "", "CI_API_V4_URL": srv.URL + "/api/v4",
		"CI_MERGE_REQUEST_PROJECT_ID": "4", "CI_MERGE_REQUEST_IID": "2", "CI_PIPELINE_ID": "31",
		"CI_COMMIT_TIMESTAMP": "2026-03-02T10:00:00+01:00", "CI_COMMIT_SHA": "c0ffee", "GITLAB_TOKEN": "",
		"GPUPASS_GITLAB_TOKEN_FILE": tokenFile,
	}
	_, stderr, code := runCLI(t, env, us, eu, "--tag", "nightly")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := `<!-- gpupass:report tag="nightly" run=31 commit_time=2026-03-02T09:00:00Z sha=c0ffee -->`
	if len(g.notes) != 1 || !strings.HasPrefix(g.notes[0], want+"\n### ✅ gpupass compare: consistent") {
		t.Errorf("notes %q, want one starting with %s", g.notes, want)
	}
	if g.token != "glpat-secret" {
		t.Errorf("token %q, want the one from GPUPASS_GITLAB_TOKEN_FILE", g.token)
	}
}

// TestCompareLogY: --log-y, or GPUPASS_LOG_Y as CI sets it, draws the
// chart files' loss axis on a log scale; without either the axis of
// these runs (one decade) stays linear and starts at 0.
func TestCompareLogY(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	clean := map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": "", "GPUPASS_LOG_Y": ""}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		log  bool
	}{
		{"default", nil, nil, false},
		{"flag", nil, []string{"--log-y"}, true},
		{"env", map[string]string{"GPUPASS_LOG_Y": "true"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range clean {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			svg, png := filepath.Join(dir, tc.name+".svg"), filepath.Join(dir, tc.name+".png")
			_, stderr, code := runCLI(t, env, append([]string{us, eu, "--svg", svg, "--png", png}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			b, err := os.ReadFile(svg)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(b), ">loss (log scale)</text>"); got != tc.log {
				t.Errorf("log scale %v, want %v:\n%s", got, tc.log, b)
			}
			if !tc.log && !strings.Contains(string(b), ">0</text>") {
				t.Errorf("linear loss axis does not start at 0:\n%s", b)
			}
			if fi, err := os.Stat(png); err != nil || fi.Size() == 0 {
				t.Errorf("png: %v", err)
			}
		})
	}
}

// TestCompareLinksBack: compare run by hand in a CI job links the report
// to the CI run and its artifacts, as the compare-report step does; a
// --dashboard-url that is no http(s) address is refused by its name.
func TestCompareLinksBack(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	env := map[string]string{"GITHUB_ACTIONS": "true", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": "", "GPUPASS_DASHBOARD_URL": "",
		"GITHUB_SERVER_URL": "https://github.example", "GITHUB_REPOSITORY": "team/model", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "2"}
	md := filepath.Join(dir, "compare.md")
	_, stderr, code := runCLI(t, env, us, eu, "--post", "none", "--markdown", md, "--dashboard-url", "https://gpupass.example")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"**Links:**", "https://github.example/team/model/actions/runs/42/attempts/2", "https://github.example/team/model/actions/runs/42#artifacts"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the report lacks %q:\n%s", want, b)
		}
	}
	env["GPUPASS_DASHBOARD_URL"] = "javascript:alert(1)"
	_, stderr, code = runCLI(t, env, us, eu, "--post", "none")
	if code == 0 || !strings.Contains(stderr, `--dashboard-url "javascript:alert(1)": not an http:// or https:// URL`) {
		t.Errorf("a javascript: dashboard URL: exit %d, %s", code, stderr)
	}
}

// Issue #35: a workflow the broker's webhook starts (repository_dispatch,
// a GitLab pipeline trigger) belongs to no pull request: compare-report
// comments on the one its pull-request / merge-request input names
// (GPUPASS_PULL_REQUEST, the event's ci.pull_request), in the CI's own
// repository. Told to post with none named, it says which input to set.
func TestComparePostsToNamedPullRequest(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	g := &githubPR{}
	ghSrv := httptest.NewServer(g)
	defer ghSrv.Close()
	gl := &gitlabMR{}
	glSrv := httptest.NewServer(gl)
	defer glSrv.Close()
	dispatch := filepath.Join(dir, "dispatch.json")
	os.WriteFile(dispatch, []byte(`{"action":"gpupass-group-ended","client_payload":{"group":"group-0123456789abcdef"}}`), 0o644)
	github := map[string]string{
		"GITHUB_ACTIONS": "true", "GITLAB_CI": "", "GITHUB_EVENT_PATH": dispatch, "GITHUB_EVENT_NAME": "repository_dispatch", "GITHUB_REF": "refs/heads/main",
		"GITHUB_REPOSITORY": "acme/train", "GITHUB_RUN_ID": "78", "GITHUB_API_URL": ghSrv.URL, "GITHUB_TOKEN": "ghs_x",
		"GITHUB_STEP_SUMMARY": filepath.Join(dir, "s.md"), "GITHUB_OUTPUT": filepath.Join(dir, "out"),
	}
	gitlab := map[string]string{
		"GITHUB_ACTIONS": "", "GITLAB_CI": "true", "GITHUB_STEP_SUMMARY": "", "CI_API_V4_URL": glSrv.URL + "/api/v4", "CI_PIPELINE_SOURCE": "trigger",
		"CI_PROJECT_ID": "4", "CI_MERGE_REQUEST_IID": "", "CI_MERGE_REQUEST_PROJECT_ID": "", "CI_PIPELINE_ID": "32", "GITLAB_TOKEN": "glpat-x",
		"GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"),
	}
	set := func(env map[string]string, kv ...string) map[string]string {
		c := map[string]string{}
		for k, v := range env {
			c[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			c[kv[i]] = kv[i+1]
		}
		return c
	}
	report := filepath.Join(dir, "report")
	for _, tc := range []struct {
		name      string
		env       map[string]string
		args      []string
		wantCode  int
		wantErr   string
		posts     func() int
		wantPosts int
	}{
		{"github: the input names the pull request", set(github, "GPUPASS_PULL_REQUEST", "7"), []string{"-o", "github", "compare", "--report-dir", report}, 0, "", func() int { return len(g.posts) }, 1},
		{"gitlab: the input names the merge request", set(gitlab, "GPUPASS_PULL_REQUEST", "2"), []string{"-o", "gitlab", "compare", "--report-dir", report}, 0, "", func() int { return len(gl.notes) }, 1},
		{"github: none named, auto posts nothing", github, []string{"compare"}, 0, "", func() int { return len(g.posts) }, 1},
		{"github: none named, told to post", set(github, "GPUPASS_POST", "github"), []string{"-o", "github", "compare", "--report-dir", report}, ExitUsage,
			"--pull-request (GPUPASS_PULL_REQUEST, the pull-request input) is required to post to github here", nil, 0},
		{"gitlab: none named, told to post", set(gitlab, "GPUPASS_POST", "gitlab"), []string{"-o", "gitlab", "compare", "--report-dir", report}, ExitUsage,
			"--pull-request (GPUPASS_PULL_REQUEST, the merge-request input) is required to post to gitlab here", nil, 0},
		{"a negative number", set(github, "GPUPASS_PULL_REQUEST", "-3"), []string{"compare"}, ExitUsage, "--pull-request \"-3\": must be a pull or merge request number", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := Main(context.Background(), append(tc.args, us, eu), strings.NewReader(""), &out, &errb, WithPoster(forgepost.Poster{}))
			if code != tc.wantCode || !strings.Contains(errb.String()+out.String(), tc.wantErr) {
				t.Errorf("exit %d, want %d and %q:\n%s\n%s", code, tc.wantCode, tc.wantErr, out.String(), errb.String())
			}
			if tc.posts != nil && tc.posts() != tc.wantPosts {
				t.Errorf("%d posted, want %d", tc.posts(), tc.wantPosts)
			}
		})
	}
	if len(g.posts) != 1 || !strings.Contains(g.posts[0], "gpupass compare: consistent") || len(gl.notes) != 1 {
		t.Errorf("PR 7 comments %q, MR 2 notes %q; want one report each", g.posts, gl.notes)
	}
}

// TestTriggeredVerdictReplacesTheMergeRequestsNote: the pipeline a
// webhook receiver triggers runs on the trigger's ref (main), whose
// commit is older than the merge request's head. Its verdict, for the
// merge request the compare-report step names, must still replace the
// in-progress note the merge request's pipeline posted: before, its
// main's CI_COMMIT_TIMESTAMP made it the older report and it was skipped
// ("a newer pipeline's report is posted"), so the loop ended on "in
// progress" forever.
func TestTriggeredVerdictReplacesTheMergeRequestsNote(t *testing.T) {
	dir := t.TempDir()
	us, eu, _ := writeRuns(t, dir)
	gl := &gitlabMR{}
	// The merge request pipeline's (id 30, on the head committed
	// 2026-12-01) in-progress note.
	progress := gitlabNote{ID: 5, Body: forge.Compose(forge.Meta{Tag: "compare", RunID: 30, SHA: "c0ffee",
		CommitTime: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}, "### ⏳ gpupass compare: in progress\n", forge.MaxChars, "")}
	progress.Author.ID = 9
	gl.stored = []gitlabNote{progress}
	glSrv := httptest.NewServer(gl)
	defer glSrv.Close()
	for k, v := range map[string]string{
		"GITHUB_ACTIONS": "", "GITLAB_CI": "true", "GITHUB_STEP_SUMMARY": "", "CI_API_V4_URL": glSrv.URL + "/api/v4", "CI_PIPELINE_SOURCE": "trigger",
		"CI_PROJECT_ID": "4", "CI_MERGE_REQUEST_IID": "", "CI_MERGE_REQUEST_PROJECT_ID": "", "GITLAB_TOKEN": "glpat-x",
		// The triggered pipeline: a later id, on main, committed earlier.
		"CI_PIPELINE_ID": "32", "CI_COMMIT_SHA": "0ld0a1n", "CI_COMMIT_TIMESTAMP": "2026-11-20T08:00:00Z",
		"GPUPASS_PULL_REQUEST": "2", "GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"),
	} {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"-o", "gitlab", "compare", "--report-dir", filepath.Join(dir, "report"), us, eu},
		strings.NewReader(""), &out, &errb, WithPoster(forgepost.Poster{}))
	bodies := gl.Bodies()
	if code != 0 || len(bodies) != 1 || gl.edits != 1 || !strings.Contains(bodies[0], "gpupass compare: consistent") {
		t.Errorf("exit %d, %d edits, notes %q; want the in-progress note edited into the verdict:\n%s%s", code, gl.edits, bodies, out.String(), errb.String())
	}
	if len(bodies) == 1 && strings.Contains(bodies[0], "0ld0a1n") {
		t.Errorf("the verdict's marker names main's commit, not the merge request's: %q", strings.SplitN(bodies[0], "\n", 2)[0])
	}
}
