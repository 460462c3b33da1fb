//go:build e2e

package ci_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// forgeServer records the pull request comments or merge request notes
// gpupass posts at base, as the forge's API does (list, create), and
// counts requests that lack the token.
type forgeServer struct {
	base   string
	authed func(*http.Request) bool
	refuse string // the forge's 401 body

	mu     sync.Mutex
	bodies []string
	denied int
}

// githubComments serves GitHub's issue comments API for acme/train#7.
func githubComments(token string) *forgeServer {
	return &forgeServer{base: "/api/v3/repos/acme/train/issues/7/comments", refuse: `{"message":"Bad credentials"}`,
		authed: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+token }}
}

// gitlabNotes serves GitLab's merge request notes API for project 42, MR 3.
func gitlabNotes(token string) *forgeServer {
	return &forgeServer{base: "/api/v4/projects/42/merge_requests/3/notes", refuse: `{"message":"401 Unauthorized"}`,
		authed: func(r *http.Request) bool { return r.Header.Get("PRIVATE-TOKEN") == token }}
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
	mux.HandleFunc("GET "+s.base, func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			w.Write([]byte("[]"))
		}
	})
	mux.HandleFunc("POST "+s.base, func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		var c struct {
			Body string `json:"body"`
		}
		json.NewDecoder(r.Body).Decode(&c)
		s.mu.Lock()
		s.bodies = append(s.bodies, c.Body)
		id := len(s.bodies)
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"id": id, "body": c.Body})
	})
	return mux
}
