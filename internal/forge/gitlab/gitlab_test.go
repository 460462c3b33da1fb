package gitlab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/forge"
)

// fakeGitLab implements the merge request note endpoints gpupass uses,
// with X-Next-Page pagination. A job token is refused like GitLab does.
type fakeGitLab struct {
	mu     sync.Mutex
	next   int
	notes  []note
	faults []int
	// lost are statuses to answer, in order, after carrying a request
	// out: the write happened, the answer says it failed.
	lost []int
	// faultMethod limits faults and lost to requests of this method
	// ("" = any).
	faultMethod string
	requests    []string
}

type note struct {
	ID     int    `json:"id"`
	Body   string `json:"body"`
	System bool   `json:"system"`
	Author author `json:"author"`
}

type author struct {
	ID       int    `json:"id"`
	Username string `json:"username"`
}

// tokenBot is the user a project access token posts as; alice is a
// person on the merge request.
var (
	tokenBot = author{77, "project_42_bot_1"}
	alice    = author{5, "alice"}
)

func (f *fakeGitLab) handler() http.Handler {
	mux := http.NewServeMux()
	const base = "/api/v4/projects/42/merge_requests/3/notes"
	mux.HandleFunc("GET "+base, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("sort") != "asc" {
			http.Error(w, `{"message":"test expects sort=asc"}`, 400)
			return
		}
		per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		if per == 0 || per > 20 {
			per = 20
		}
		page = max(page, 1)
		lo := min((page-1)*per, len(f.notes))
		hi := min(lo+per, len(f.notes))
		if hi < len(f.notes) {
			w.Header().Set("X-Next-Page", strconv.Itoa(page+1))
		}
		w.Header().Set("X-Page", strconv.Itoa(page))
		json.NewEncoder(w).Encode(f.notes[lo:hi])
	})
	mux.HandleFunc("GET /api/v4/user", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(tokenBot)
	})
	mux.HandleFunc("POST "+base, func(w http.ResponseWriter, r *http.Request) {
		var n note
		json.NewDecoder(r.Body).Decode(&n)
		f.next++
		n.ID = f.next
		n.Author = tokenBot
		f.notes = append(f.notes, n)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(n)
	})
	mux.HandleFunc("PUT "+base+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.PathValue("id"))
		var n note
		json.NewDecoder(r.Body).Decode(&n)
		for i := range f.notes {
			if f.notes[i].ID == id {
				f.notes[i].Body = n.Body
				json.NewEncoder(w).Encode(f.notes[i])
				return
			}
		}
		http.Error(w, `{"message":"404 Not found"}`, http.StatusNotFound)
	})
	mux.HandleFunc("DELETE "+base+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.PathValue("id"))
		for i := range f.notes {
			if f.notes[i].ID == id {
				f.notes = append(f.notes[:i], f.notes[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		http.Error(w, `{"message":"404 Not found"}`, http.StatusNotFound)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		switch r.Header.Get("PRIVATE-TOKEN") {
		case "glpat-project":
		case "job-token":
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"message":"403 Forbidden"}`)
			return
		default:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"message":"401 Unauthorized"}`)
			return
		}
		if len(f.lost) > 0 && (f.faultMethod == "" || f.faultMethod == r.Method) {
			code := f.lost[0]
			f.lost = f.lost[1:]
			mux.ServeHTTP(httptest.NewRecorder(), r)
			w.WriteHeader(code)
			fmt.Fprint(w, `{"message":"502 Bad Gateway"}`)
			return
		}
		if len(f.faults) > 0 && (f.faultMethod == "" || f.faultMethod == r.Method) {
			code := f.faults[0]
			f.faults = f.faults[1:]
			w.WriteHeader(code)
			fmt.Fprint(w, `{"message":"boom"}`)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func setup(t *testing.T, token string, pre ...string) (*fakeGitLab, *Client) {
	t.Helper()
	f := &fakeGitLab{}
	for _, b := range pre {
		f.next++
		f.notes = append(f.notes, note{ID: f.next, Body: b, System: strings.HasPrefix(b, "system:"), Author: tokenBot})
	}
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: &forge.Retry{Base: srv.Client().Transport, Sleep: func(context.Context, time.Duration) error { return nil }}}
	c, err := New(Target{APIURL: srv.URL + "/api/v4", Project: "42", IID: 3}, token, hc)
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func (f *fakeGitLab) bodies() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range f.notes {
		out = append(out, n.Body)
	}
	return out
}

func TestPostBehaviours(t *testing.T) {
	t.Parallel()
	mon := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	old := forge.Meta{Tag: "compare", RunID: 100, CommitTime: mon}
	cur := forge.Meta{Tag: "compare", RunID: 101, CommitTime: mon.Add(time.Hour)}
	oldBody, newBody := old.Marker()+"\nold", cur.Marker()+"\nnew"
	var pre []string
	for i := range 25 {
		pre = append(pre, fmt.Sprintf("system: note %d", i))
	}
	withOld := append(append([]string{}, pre...), oldBody)
	tests := []struct {
		name       string
		pre        []string
		meta       forge.Meta
		body       string
		behavior   forge.Behavior
		wantAction string
		wantLast   []string
		wantCount  int
	}{
		{"create", pre, cur, newBody, forge.Update, "created", []string{newBody}, 26},
		{"update on page two", withOld, cur, newBody, forge.Update, "updated", []string{newBody}, 26},
		{"new", withOld, cur, newBody, forge.New, "created", []string{oldBody, newBody}, 27},
		{"delete-and-new deletes", withOld, cur, newBody, forge.DeleteAndNew, "created", []string{"system: note 24", newBody}, 26},
		{"older pipeline", withOld, forge.Meta{Tag: "compare", RunID: 99, CommitTime: mon}, "x", forge.Update, "skipped", []string{oldBody}, 26},
		{"unchanged", withOld, cur, cur.Marker() + "\nold", forge.DeleteAndNew, "skipped", []string{oldBody}, 26},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := setup(t, "glpat-project", tc.pre...)
			res, err := forge.Post(context.Background(), c, tc.meta, tc.body, tc.behavior)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != tc.wantAction {
				t.Errorf("action %s (%s), want %s", res.Action, res.Reason, tc.wantAction)
			}
			got := f.bodies()
			if len(got) != tc.wantCount {
				t.Errorf("%d notes, want %d", len(got), tc.wantCount)
			}
			if d := cmp.Diff(tc.wantLast, got[len(got)-len(tc.wantLast):]); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestOthersMarkersIgnored: notes by other accounts that carry a gpupass
// marker (forged with a far newer run, or a pasted report) neither stop
// the report nor get edited or deleted.
func TestOthersMarkersIgnored(t *testing.T) {
	t.Parallel()
	mon := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	old := forge.Meta{Tag: "compare", RunID: 100, CommitTime: mon}
	cur := forge.Meta{Tag: "compare", RunID: 101, CommitTime: mon.Add(time.Hour)}
	forged := forge.Meta{Tag: "compare", RunID: 1 << 40, CommitTime: mon.Add(48 * time.Hour)}
	oldBody, newBody := old.Marker()+"\nold", cur.Marker()+"\nnew"
	f, c := setup(t, "glpat-project", oldBody)
	f.notes = append(f.notes,
		note{ID: 50, Body: forged.Marker() + "\n✅ consistent", Author: alice},
		note{ID: 51, Body: oldBody + "\n(pasted)", Author: alice})
	res, err := forge.Post(context.Background(), c, cur, newBody, forge.DeleteAndNew)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != "created" || res.Deleted != 1 {
		t.Errorf("result %+v, want a new note and only the old report deleted", res)
	}
	want := []string{forged.Marker() + "\n✅ consistent", oldBody + "\n(pasted)", newBody}
	if d := cmp.Diff(want, f.bodies()); d != "" {
		t.Errorf("notes (-want +got):\n%s", d)
	}
}

func TestRetriesAndErrors(t *testing.T) {
	t.Parallel()
	f, c := setup(t, "glpat-project")
	f.faults = []int{500}
	if _, err := forge.Post(context.Background(), c, forge.Meta{Tag: "t", RunID: 1}, "body", forge.Update); err != nil {
		t.Fatalf("a 500 should be retried: %v", err)
	}
	if len(f.requests) != 3 || len(f.bodies()) != 1 {
		t.Errorf("requests %v", f.requests)
	}

	_, job := setup(t, "job-token")
	_, err := forge.Post(context.Background(), job, forge.Meta{Tag: "t"}, "body", forge.Update)
	for _, want := range []string{"403 Forbidden", "GET /api/v4/projects/42/merge_requests/3/notes", "a CI job token cannot post merge request notes", "project access token"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if strings.Contains(fmt.Sprint(err), "job-token") {
		t.Error("token leaked into the error")
	}
	if _, err := New(Target{APIURL: "http://127.0.0.1/api/v4"}, "", http.DefaultClient); err == nil || !strings.Contains(err.Error(), "project access token") {
		t.Errorf("missing token: %v", err)
	}
}

// TestCreateOnce: a note GitLab created but answered with a 5xx is taken
// as the report instead of being posted again, and a note it did not
// create is posted again; either way one note is left.
func TestCreateOnce(t *testing.T) {
	t.Parallel()
	old := forge.Meta{Tag: "compare", RunID: 7}
	cur := forge.Meta{Tag: "compare", RunID: 8}
	oldBody, newBody := old.Marker()+"\nold", cur.Marker()+"\nnew"
	const (
		notes  = "/api/v4/projects/42/merge_requests/3/notes"
		list   = "GET " + notes
		post   = "POST " + notes
		whoami = "GET /api/v4/user"
	)
	tests := []struct {
		name         string
		pre          []string
		behavior     forge.Behavior
		faults, lost []int
		wantID       int64
		wantDeleted  int
		wantRequests []string
	}{
		{"created but answered 502", nil, forge.Update, nil, []int{502}, 1, 0, []string{list, post, list, whoami}},
		{"created but answered 500, old note deleted", []string{"system: approved", oldBody}, forge.DeleteAndNew, nil, []int{500}, 3, 1,
			[]string{list, whoami, post, list, "DELETE " + notes + "/2"}},
		{"not created and answered 502: posted again", nil, forge.Update, []int{502}, nil, 1, 0, []string{list, post, list, post}},
		{"429 to the POST: posted again", nil, forge.Update, []int{429}, nil, 1, 0, []string{list, post, post}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := setup(t, "glpat-project", tc.pre...)
			f.faults, f.lost, f.faultMethod = tc.faults, tc.lost, "POST"
			res, err := forge.Post(context.Background(), c, cur, newBody, tc.behavior)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != "created" || res.ID != tc.wantID || res.Deleted != tc.wantDeleted {
				t.Errorf("result %+v, want note %d created, %d deleted", res, tc.wantID, tc.wantDeleted)
			}
			want := []string{newBody}
			if len(tc.pre) > 0 {
				want = []string{"system: approved", newBody}
			}
			if d := cmp.Diff(want, f.bodies()); d != "" {
				t.Errorf("notes (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantRequests, f.requests); d != "" {
				t.Errorf("requests (-want +got):\n%s", d)
			}
		})
	}
}

// TestCreateGivesUp: the error names the forge, the merge request, the
// step and what GitLab answered.
func TestCreateGivesUp(t *testing.T) {
	t.Parallel()
	f, c := setup(t, "glpat-project")
	f.faults, f.faultMethod = []int{503, 503, 503}, "POST"
	_, err := forge.Post(context.Background(), c, forge.Meta{Tag: "compare", RunID: 1}, "report", forge.Update)
	for _, want := range []string{"giving up after 3 posts", "creating the report note on GitLab merge request !3 of project 42", "503 Service Unavailable", "boom"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if got := f.bodies(); len(got) != 0 {
		t.Errorf("notes %q, want none", got)
	}
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"CI_API_V4_URL": "https://gitlab.internal/api/v4", "CI_MERGE_REQUEST_PROJECT_ID": "42", "CI_MERGE_REQUEST_IID": "3",
		"CI_PIPELINE_ID": "9001", "CI_COMMIT_SHA": "abc", "CI_COMMIT_TIMESTAMP": "2026-03-02T11:00:00+02:00",
	}
	tgt, run, ok, err := FromEnv(func(k string) string { return env[k] })
	if err != nil || !ok {
		t.Fatalf("ok %v err %v", ok, err)
	}
	if d := cmp.Diff(Target{APIURL: "https://gitlab.internal/api/v4", Project: "42", IID: 3}, tgt); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if run.PipelineID != 9001 || !run.CommitTime.Equal(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("run %+v", run)
	}
	delete(env, "CI_MERGE_REQUEST_IID")
	if _, _, ok, err := FromEnv(func(k string) string { return env[k] }); ok || err != nil {
		t.Errorf("branch pipeline: ok %v err %v", ok, err)
	}
	env["CI_MERGE_REQUEST_IID"] = "x"
	if _, _, _, err := FromEnv(func(k string) string { return env[k] }); err == nil {
		t.Error("bad IID accepted")
	}
}

// TestPostTruncatesAndRetries updates a sticky note with a report too long
// for one comment while GitLab answers the update with 502 and 429 first:
// the retried PUT carries the whole (cut) body, below 65,536 characters,
// with the note pointing at the full report.
func TestPostTruncatesAndRetries(t *testing.T) {
	t.Parallel()
	old := forge.Meta{Tag: "compare", RunID: 7}
	f, c := setup(t, "glpat-project", "system: approved", old.Marker()+"\nold")
	f.faults, f.faultMethod = []int{502, 429}, "PUT"
	meta := forge.Meta{Tag: "compare", RunID: 8}
	body := forge.Compose(meta, strings.Repeat("| a | b |\n", 10000), forge.MaxChars-1, "artifact gpupass-compare")
	res, err := forge.Post(context.Background(), c, meta, body, forge.Update)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != "updated" || res.ID != 2 {
		t.Errorf("result %+v, want note 2 updated", res)
	}
	got := f.bodies()
	if len(got) != 2 || got[1] != body || utf8.RuneCountInString(body) >= forge.MaxChars || !strings.Contains(body, "full report is in artifact gpupass-compare") {
		t.Errorf("notes: %d, second is the composed body: %v (%d chars)", len(got), got[1] == body, utf8.RuneCountInString(got[1]))
	}
	const notes = "/api/v4/projects/42/merge_requests/3/notes"
	want := []string{"GET " + notes, "GET /api/v4/user", "PUT " + notes + "/2", "PUT " + notes + "/2", "PUT " + notes + "/2"}
	if d := cmp.Diff(want, f.requests); d != "" {
		t.Errorf("requests (-want +got):\n%s", d)
	}
}
