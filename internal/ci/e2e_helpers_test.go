//go:build e2e

package ci_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// toolsPath returns PATH with the npm tools dir of scripts/setup.d/50-ci-runners.sh
// (Node 22 and gitlab-ci-local) and the gpupass binary's directory in front.
func toolsPath(t *testing.T, gpupass string) string {
	t.Helper()
	dir := testutil.ToolsDir()
	gobin, _ := exec.Command("go", "env", "GOPATH").Output()
	return strings.Join([]string{
		filepath.Dir(gpupass),
		filepath.Join(dir, "node_modules", ".bin"),
		filepath.Join(strings.TrimSpace(string(gobin)), "bin"),
		os.Getenv("PATH"),
	}, string(os.PathListSeparator))
}

// lookPath finds name on path or calls testutil.Missing.
func lookPath(t *testing.T, path, name string) string {
	t.Helper()
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	testutil.Missing(t, "%s not found (scripts/setup.d/50-ci-runners.sh installs it)", name)
	return ""
}

// gitRepo copies the tracked files under sub (of the repository root) into
// a fresh git repository with one commit and returns its directory. Both
// act and gitlab-ci-local need a repository; the worktree's own is not
// one they can read (a linked worktree), and must not be touched.
func gitRepo(t *testing.T, sub, remote string) string {
	t.Helper()
	root := testutil.RepoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--", sub).Output()
	if err != nil {
		testutil.Missing(t, "git ls-files in %s: %v", root, err)
	}
	dir := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue // deleted in the worktree but still in the index
		}
		rel := f
		if sub != "." {
			rel = strings.TrimPrefix(f, strings.TrimSuffix(sub, "/")+"/")
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(filepath.Join(root, f))
		if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A"},
		{"-c", "user.email=ci@gpupass.test", "-c", "user.name=gpupass test", "commit", "-q", "-m", "test"},
		{"remote", "add", "origin", remote},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	return dir
}

// forgeServer is the comments API of one pull request (GitHub) or the
// notes API of one merge request (GitLab) at base, as the forge serves it
// to a token gpupass posts with: list, create, and edit in place. It keeps
// every comment with its edit history (thread) and counts requests that
// lack the token.
type forgeServer struct {
	base   string // the list/create path
	edit   string // the path of one comment, with {id}
	authed func(*http.Request) bool
	refuse string // the forge's 401 body
	// item renders a stored comment as the forge lists it: authored by
	// the account the token posts as.
	item func(c forgeComment) map[string]any
	// self answers the forge's "who am I" call (nil: none).
	selfPath string
	self     func(w http.ResponseWriter)

	mu       sync.Mutex
	bodies   []string // the bodies created, in order
	comments []forgeComment
	denied   int
}

// forgeComment is one comment and the bodies it had before its edits.
type forgeComment struct {
	ID      int64
	Body    string
	History []string // earlier bodies, oldest first
}

// githubComments serves GitHub's issue comments API for acme/train#7.
// GITHUB_TOKEN posts as the Actions bot: GET /user refuses it, as GitHub
// does an installation token, and its comments are a Bot's.
func githubComments(token string) *forgeServer {
	return &forgeServer{base: "/api/v3/repos/acme/train/issues/7/comments", edit: "/api/v3/repos/acme/train/issues/comments/{id}",
		refuse: `{"message":"Bad credentials"}`,
		authed: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+token },
		item: func(c forgeComment) map[string]any {
			return map[string]any{"id": c.ID, "body": c.Body, "user": map[string]any{"login": "github-actions[bot]", "type": "Bot"}}
		},
		selfPath: "/api/v3/user",
		self: func(w http.ResponseWriter) {
			http.Error(w, `{"message":"Resource not accessible by integration"}`, http.StatusForbidden)
		}}
}

// gitlabNotes serves GitLab's merge request notes API for project 42, MR 3,
// to a project access token whose bot user is id 1.
func gitlabNotes(token string) *forgeServer {
	return &forgeServer{base: "/api/v4/projects/42/merge_requests/3/notes", edit: "/api/v4/projects/42/merge_requests/3/notes/{id}",
		refuse: `{"message":"401 Unauthorized"}`,
		authed: func(r *http.Request) bool { return r.Header.Get("PRIVATE-TOKEN") == token },
		item: func(c forgeComment) map[string]any {
			return map[string]any{"id": c.ID, "body": c.Body, "system": false, "author": map[string]any{"id": 1, "username": "project_42_bot"}}
		},
		selfPath: "/api/v4/user",
		self: func(w http.ResponseWriter) {
			json.NewEncoder(w).Encode(map[string]any{"id": 1, "username": "project_42_bot"})
		}}
}

// thread returns the comments as they are now, oldest first, each with
// its edit history: what a reader of the pull request sees, and how each
// comment came to be.
func (s *forgeServer) thread() []forgeComment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]forgeComment, len(s.comments))
	for i, c := range s.comments {
		c.History = append([]string(nil), c.History...)
		out[i] = c
	}
	return out
}

func (s *forgeServer) handler() http.Handler {
	mux := http.NewServeMux()
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if !s.authed(r) {
			s.mu.Lock()
			s.denied++
			s.mu.Unlock()
			http.Error(w, s.refuse, http.StatusUnauthorized)
			return false
		}
		return true
	}
	body := func(r *http.Request) string {
		var c struct {
			Body string `json:"body"`
		}
		json.NewDecoder(r.Body).Decode(&c)
		return c.Body
	}
	mux.HandleFunc("GET "+s.base, func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		list := []map[string]any{}
		for _, c := range s.thread() {
			list = append(list, s.item(c))
		}
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("POST "+s.base, func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		b := body(r)
		s.mu.Lock()
		s.bodies = append(s.bodies, b)
		c := forgeComment{ID: int64(len(s.comments) + 1), Body: b}
		s.comments = append(s.comments, c)
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(s.item(c))
	})
	update := func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		b := body(r)
		s.mu.Lock()
		defer s.mu.Unlock()
		for i := range s.comments {
			if c := &s.comments[i]; err == nil && c.ID == id {
				c.History = append(c.History, c.Body)
				c.Body = b
				json.NewEncoder(w).Encode(s.item(*c))
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	}
	mux.HandleFunc("PATCH "+s.edit, update) // GitHub
	mux.HandleFunc("PUT "+s.edit, update)   // GitLab
	if s.self != nil {
		mux.HandleFunc("GET "+s.selfPath, func(w http.ResponseWriter, r *http.Request) {
			if auth(w, r) {
				s.self(w)
			}
		})
	}
	return mux
}
