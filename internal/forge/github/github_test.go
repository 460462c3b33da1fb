package github

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/testutil"
)

// fakeGitHub implements the issue-comment endpoints gpupass uses, with
// Link-header pagination, on a loopback server.
type fakeGitHub struct {
	mu       sync.Mutex
	next     int64
	comments []comment // creation order
	faults   []int     // statuses to answer next, in order
	// lost are statuses to answer, in order, after carrying a request
	// out: the write happened, the answer says it failed.
	lost []int
	// faultMethod limits faults and lost to requests of this method
	// ("" = any).
	faultMethod string
	requests    []string
	token       string
}

type comment struct {
	ID   int64  `json:"id"`
	Body string `json:"body"`
	URL  string `json:"html_url"`
	User user   `json:"user"`
}

type user struct {
	Login string `json:"login"`
	Type  string `json:"type"`
}

// The accounts tokens post as: GITHUB_TOKEN (an app installation token,
// refused by GET /user) as the Actions bot, a personal token as a user.
var (
	actionsBot = user{"github-actions[bot]", "Bot"}
	ciUser     = user{"ci-user", "User"}
	alice      = user{"alice", "User"}
)

func (f *fakeGitHub) poster() user {
	if strings.HasPrefix(f.token, "ghp_") {
		return ciUser
	}
	return actionsBot
}

func (f *fakeGitHub) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	const base = "/api/v3/repos/acme/train/issues"
	mux.HandleFunc("GET "+base+"/7/comments", func(w http.ResponseWriter, r *http.Request) {
		per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		if per == 0 || per > 30 {
			per = 30 // the fake pages small so pagination is exercised
		}
		if page == 0 {
			page = 1
		}
		lo := min((page-1)*per, len(f.comments))
		hi := min(lo+per, len(f.comments))
		if hi < len(f.comments) {
			u := *r.URL
			q := u.Query()
			q.Set("page", strconv.Itoa(page+1))
			u.RawQuery = q.Encode()
			w.Header().Set("Link", fmt.Sprintf(`<http://%s%s>; rel="next"`, r.Host, u.String()))
		}
		json.NewEncoder(w).Encode(f.comments[lo:hi])
	})
	mux.HandleFunc("GET /api/v3/user", func(w http.ResponseWriter, r *http.Request) {
		if f.poster() == actionsBot {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"message":"Resource not accessible by integration"}`)
			return
		}
		json.NewEncoder(w).Encode(f.poster())
	})
	mux.HandleFunc("POST "+base+"/7/comments", func(w http.ResponseWriter, r *http.Request) {
		var c comment
		json.NewDecoder(r.Body).Decode(&c)
		f.next++
		c.ID = f.next
		c.User = f.poster()
		c.URL = fmt.Sprintf("http://%s/acme/train/pull/7#issuecomment-%d", r.Host, c.ID)
		f.comments = append(f.comments, c)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(c)
	})
	mux.HandleFunc("PATCH "+base+"/comments/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		var c comment
		json.NewDecoder(r.Body).Decode(&c)
		for i := range f.comments {
			if f.comments[i].ID == id {
				f.comments[i].Body = c.Body
				json.NewEncoder(w).Encode(f.comments[i])
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	})
	mux.HandleFunc("DELETE "+base+"/comments/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		for i := range f.comments {
			if f.comments[i].ID == id {
				f.comments = append(f.comments[:i], f.comments[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.requests = append(f.requests, r.Method+" "+strings.TrimPrefix(r.URL.Path, "/api/v3"))
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"message":"Bad credentials"}`)
			return
		}
		if len(f.lost) > 0 && (f.faultMethod == "" || f.faultMethod == r.Method) {
			code := f.lost[0]
			f.lost = f.lost[1:]
			mux.ServeHTTP(httptest.NewRecorder(), r)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprint(w, `{"message":"Server Error"}`)
			return
		}
		if len(f.faults) > 0 && (f.faultMethod == "" || f.faultMethod == r.Method) {
			code := f.faults[0]
			f.faults = f.faults[1:]
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			msg := "Server Error"
			if code == http.StatusForbidden {
				msg = "Resource not accessible by integration"
			}
			fmt.Fprintf(w, `{"message":%q}`, msg)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (f *fakeGitHub) bodies() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.comments {
		out = append(out, c.Body)
	}
	return out
}

// setup starts a fake with the preexisting comments, all written by
// the account the token posts as.
func setup(t *testing.T, preexisting ...string) (*fakeGitHub, *Client) {
	t.Helper()
	return setupAs(t, "ghs_test", preexisting...)
}

func setupAs(t *testing.T, token string, preexisting ...string) (*fakeGitHub, *Client) {
	t.Helper()
	return setupVia(t, token, nil, preexisting...)
}

// setupVia is setupAs whose requests go through transport(server), when
// transport is not nil.
func setupVia(t *testing.T, token string, transport func(*httptest.Server) http.RoundTripper, preexisting ...string) (*fakeGitHub, *Client) {
	t.Helper()
	f := &fakeGitHub{token: token}
	for _, b := range preexisting {
		f.next++
		f.comments = append(f.comments, comment{ID: f.next, Body: b, User: f.poster(), URL: fmt.Sprintf("http://github.test/acme/train/pull/7#issuecomment-%d", f.next)})
	}
	srv := httptest.NewServer(f.handler(t))
	t.Cleanup(srv.Close)
	base := srv.Client().Transport
	if transport != nil {
		base = transport(srv)
	}
	hc := &http.Client{Transport: &forge.Retry{Base: base, Sleep: func(context.Context, time.Duration) error { return nil }}}
	c, err := New(Target{APIURL: srv.URL + "/api/v3", Owner: "acme", Repo: "train", Number: 7}, token, hc)
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

var (
	mon = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	tue = mon.Add(24 * time.Hour)
)

func TestPostBehaviours(t *testing.T) {
	t.Parallel()
	old := forge.Meta{Tag: "compare", RunID: 100, CommitTime: mon}
	cur := forge.Meta{Tag: "compare", RunID: 101, CommitTime: tue}
	oldBody := old.Marker() + "\nold report"
	newBody := cur.Marker() + "\nnew report"
	// 40 unrelated comments push the sticky one to the second page.
	var chatter []string
	for i := range 40 {
		chatter = append(chatter, fmt.Sprintf("comment %d", i))
	}
	withOld := append(append([]string{}, chatter...), oldBody)
	tests := []struct {
		name       string
		pre        []string
		meta       forge.Meta
		body       string
		behavior   forge.Behavior
		wantAction string
		wantLast   []string // the last comments after posting
		wantCount  int
	}{
		{"create when absent", chatter, cur, newBody, forge.Update, "created", []string{newBody}, 41},
		{"update in place past page one", withOld, cur, newBody, forge.Update, "updated", []string{newBody}, 41},
		{"new keeps the old one", withOld, cur, newBody, forge.New, "created", []string{oldBody, newBody}, 42},
		{"delete-and-new", withOld, cur, newBody, forge.DeleteAndNew, "created", []string{"comment 39", newBody}, 41},
		{"older pipeline skipped", withOld, forge.Meta{Tag: "compare", RunID: 102, CommitTime: mon.Add(-time.Hour)}, "stale", forge.Update, "skipped", []string{oldBody}, 41},
		{"unchanged skipped", withOld, cur, cur.Marker() + "\nold report", forge.Update, "skipped", []string{oldBody}, 41},
		{"other tag untouched", withOld, forge.Meta{Tag: "audit", RunID: 101}, "<!-- x -->", forge.Update, "created", []string{oldBody, "<!-- x -->"}, 42},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := setup(t, tc.pre...)
			res, err := forge.Post(context.Background(), c, tc.meta, tc.body, tc.behavior)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != tc.wantAction {
				t.Errorf("action %s (%s), want %s", res.Action, res.Reason, tc.wantAction)
			}
			got := f.bodies()
			if len(got) != tc.wantCount {
				t.Errorf("%d comments, want %d", len(got), tc.wantCount)
			}
			if d := cmp.Diff(tc.wantLast, got[len(got)-len(tc.wantLast):]); d != "" {
				t.Errorf("last comments (-want +got):\n%s", d)
			}
		})
	}
}

// TestOthersMarkersIgnored: comments by other accounts that carry a
// gpupass marker (forged with a far newer run, or a report pasted by a
// person) neither stop the report nor get edited or deleted, for
// GITHUB_TOKEN (known by being a bot) and a personal token (known by
// GET /user).
func TestOthersMarkersIgnored(t *testing.T) {
	t.Parallel()
	old := forge.Meta{Tag: "compare", RunID: 100, CommitTime: mon}
	cur := forge.Meta{Tag: "compare", RunID: 101, CommitTime: tue}
	forged := forge.Meta{Tag: "compare", RunID: 1 << 40, CommitTime: tue.Add(time.Hour)}
	oldBody, newBody := old.Marker()+"\nold report", cur.Marker()+"\nnew report"
	for _, tc := range []struct {
		token   string
		other   user // an account whose markers must be ignored
		lookups int  // GET /user calls
	}{
		{"ghs_test", alice, 1},
		{"ghp_test", actionsBot, 1},
	} {
		t.Run(tc.token, func(t *testing.T) {
			t.Parallel()
			f, c := setupAs(t, tc.token, oldBody)
			f.comments = append(f.comments,
				comment{ID: 50, Body: forged.Marker() + "\n✅ consistent", User: tc.other},
				comment{ID: 51, Body: oldBody + "\n(pasted)", User: tc.other})
			res, err := forge.Post(context.Background(), c, cur, newBody, forge.Update)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != "updated" || res.ID != 1 || res.Deleted != 0 {
				t.Errorf("result %+v, want comment 1 updated and nothing deleted", res)
			}
			want := []string{newBody, forged.Marker() + "\n✅ consistent", oldBody + "\n(pasted)"}
			if d := cmp.Diff(want, f.bodies()); d != "" {
				t.Errorf("comments (-want +got):\n%s", d)
			}
			n := 0
			for _, r := range f.requests {
				if r == "GET /user" {
					n++
				}
			}
			if n != tc.lookups {
				t.Errorf("%d GET /user, want %d", n, tc.lookups)
			}
		})
	}
}

func TestPostTruncatesAndRetries(t *testing.T) {
	t.Parallel()
	f, c := setup(t)
	f.faults = []int{502, 503}
	meta := forge.Meta{Tag: "compare", RunID: 1}
	body := forge.Compose(meta, strings.Repeat("| a | b |\n", 10000), forge.MaxChars-1, "artifact gpupass-compare")
	res, err := forge.Post(context.Background(), c, meta, body, forge.Update)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != "created" || !strings.Contains(res.URL, "#issuecomment-1") {
		t.Errorf("result %+v", res)
	}
	got := f.bodies()
	if len(got) != 1 || utf8.RuneCountInString(got[0]) >= forge.MaxChars || !strings.Contains(got[0], "Report truncated") {
		t.Errorf("posted %d comments, first %d chars", len(got), utf8.RuneCountInString(got[0]))
	}
	if d := cmp.Diff([]string{"GET /repos/acme/train/issues/7/comments", "GET /repos/acme/train/issues/7/comments", "GET /repos/acme/train/issues/7/comments", "POST /repos/acme/train/issues/7/comments"}, f.requests); d != "" {
		t.Errorf("requests (-want +got):\n%s", d)
	}
}

// refuseDial returns a transport for srv whose n-th connection the
// kernel refuses, so that request never leaves.
func refuseDial(t *testing.T, n int32) func(*httptest.Server) http.RoundTripper {
	return func(srv *httptest.Server) http.RoundTripper {
		return testutil.RefuseDials(t, srv, func(k int32) bool { return k == n })
	}
}

// TestCreateOnce: a report comment is created once, whatever happens to
// the POST on its way; idempotent requests are still retried.
func TestCreateOnce(t *testing.T) {
	t.Parallel()
	old := forge.Meta{Tag: "compare", RunID: 100, CommitTime: mon}
	cur := forge.Meta{Tag: "compare", RunID: 101, CommitTime: tue}
	oldBody, newBody := old.Marker()+"\nold report", cur.Marker()+"\nnew report"
	const (
		list   = "GET /repos/acme/train/issues/7/comments"
		post   = "POST /repos/acme/train/issues/7/comments"
		whoami = "GET /user"
		patch  = "PATCH /repos/acme/train/issues/comments/1"
	)
	tests := []struct {
		name         string
		pre          []string
		behavior     forge.Behavior
		method       string
		faults, lost []int
		transport    func(*httptest.Server) http.RoundTripper
		wantAction   string
		wantID       int64
		wantDeleted  int
		wantRequests []string
	}{
		{name: "created but answered 502", behavior: forge.Update, method: "POST", lost: []int{502},
			wantAction: "created", wantID: 1, wantRequests: []string{list, post, list, whoami}},
		{name: "created but answered 504, old report deleted", pre: []string{oldBody}, behavior: forge.DeleteAndNew, method: "POST", lost: []int{504},
			wantAction: "created", wantID: 2, wantDeleted: 1, wantRequests: []string{list, whoami, post, list, "DELETE /repos/acme/train/issues/comments/1"}},
		{name: "not created and answered 502: posted again", behavior: forge.Update, method: "POST", faults: []int{502},
			wantAction: "created", wantID: 1, wantRequests: []string{list, post, list, post}},
		{name: "connection refused: posted again", behavior: forge.Update, transport: refuseDial(t, 2),
			wantAction: "created", wantID: 1, wantRequests: []string{list, post}},
		{name: "429 to the POST: posted again", behavior: forge.Update, method: "POST", faults: []int{429},
			wantAction: "created", wantID: 1, wantRequests: []string{list, post, post}},
		{name: "502 to the PATCH: retried", pre: []string{oldBody}, behavior: forge.Update, method: "PATCH", faults: []int{502},
			wantAction: "updated", wantID: 1, wantRequests: []string{list, whoami, patch, patch}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := setupVia(t, "ghs_test", tc.transport, tc.pre...)
			f.faults, f.lost, f.faultMethod = tc.faults, tc.lost, tc.method
			res, err := forge.Post(context.Background(), c, cur, newBody, tc.behavior)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != tc.wantAction || res.ID != tc.wantID || res.Deleted != tc.wantDeleted || !strings.HasSuffix(res.URL, fmt.Sprintf("#issuecomment-%d", tc.wantID)) {
				t.Errorf("result %+v, want %s comment %d with its URL, %d deleted", res, tc.wantAction, tc.wantID, tc.wantDeleted)
			}
			if d := cmp.Diff([]string{newBody}, f.bodies()); d != "" {
				t.Errorf("comments (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantRequests, f.requests); d != "" {
				t.Errorf("requests (-want +got):\n%s", d)
			}
		})
	}
}

// TestCreateGivesUp: when every POST fails in a way that leaves open
// whether it was applied and none was, the error names the forge, the
// pull request, the step and what GitHub answered.
func TestCreateGivesUp(t *testing.T) {
	t.Parallel()
	f, c := setup(t)
	f.faults, f.faultMethod = []int{502, 502, 502}, "POST"
	_, err := forge.Post(context.Background(), c, forge.Meta{Tag: "compare", RunID: 1}, "report", forge.Update)
	for _, want := range []string{"giving up after 3 posts", "then rerun the job", "creating the report comment on GitHub pull request acme/train#7", "502 Bad Gateway", "Server Error", "may have applied it"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if got := f.bodies(); len(got) != 0 {
		t.Errorf("comments %q, want none", got)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	f, c := setup(t)
	f.faults = []int{403}
	_, err := forge.Post(context.Background(), c, forge.Meta{Tag: "x"}, "b", forge.Update)
	for _, want := range []string{"listing comments", "403 Forbidden", "GET /api/v3/repos/acme/train/issues/7/comments", "Resource not accessible by integration", "pull-requests: write"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	f.token = "other"
	_, err = forge.Post(context.Background(), c, forge.Meta{Tag: "x"}, "b", forge.Update)
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), "check GITHUB_TOKEN") {
		t.Errorf("error %v, want 401 with a token hint", err)
	}
	if strings.Contains(fmt.Sprint(err), "ghs_test") {
		t.Error("token leaked into the error")
	}
	if _, err := New(Target{}, "", http.DefaultClient); err == nil || !strings.Contains(err.Error(), "pull-requests: write") {
		t.Errorf("missing token: %v", err)
	}
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	pr := write("pr.json", `{"pull_request":{"number":7,"head":{"sha":"feedface"}},"repository":{"name":"train"}}`)
	push := write("push.json", `{"ref":"refs/heads/main"}`)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tgt, run, ok, err := FromEnv(env(map[string]string{"GITHUB_EVENT_PATH": pr, "GITHUB_REPOSITORY": "acme/train", "GITHUB_RUN_ID": "555", "GITHUB_SHA": "merge", "GITHUB_API_URL": "https://ghe.internal/api/v3"}))
	if err != nil || !ok {
		t.Fatalf("ok %v err %v", ok, err)
	}
	if d := cmp.Diff(Target{APIURL: "https://ghe.internal/api/v3", Owner: "acme", Repo: "train", Number: 7}, tgt); d != "" {
		t.Errorf("target (-want +got):\n%s", d)
	}
	if run.RunID != 555 || run.SHA != "feedface" {
		t.Errorf("run %+v", run)
	}
	_, _, ok, err = FromEnv(env(map[string]string{"GITHUB_EVENT_PATH": push, "GITHUB_REPOSITORY": "acme/train"}))
	if ok || err != nil {
		t.Errorf("push event: ok %v err %v, want not a PR", ok, err)
	}
	// An event without the number, on a pull request's merge ref.
	tgt, _, ok, err = FromEnv(env(map[string]string{"GITHUB_EVENT_PATH": push, "GITHUB_REPOSITORY": "acme/train", "GITHUB_REF": "refs/pull/12/merge", "GITHUB_API_URL": "https://api.github.com"}))
	if !ok || err != nil || tgt.Number != 12 {
		t.Errorf("GITHUB_REF refs/pull/12/merge: %+v ok %v err %v, want PR 12", tgt, ok, err)
	}
	for _, ref := range []string{"refs/heads/pull/12/merge", "refs/pull/x/merge", "refs/pull/0/merge"} {
		if _, _, ok, _ := FromEnv(env(map[string]string{"GITHUB_EVENT_PATH": push, "GITHUB_REPOSITORY": "acme/train", "GITHUB_REF": ref})); ok {
			t.Errorf("GITHUB_REF %s read as a pull request", ref)
		}
	}
}
