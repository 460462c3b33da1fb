//go:build e2e

package gpupass

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// TestOneBinary: gpupass alone (no other program beside it or on PATH)
// runs every command: the audit commands (sigstore), the bundle commands
// (the registry client) and a compare that posts (the forge clients).
// It was two programs: gpupass then failed with "install gpupass-audit".
func TestOneBinary(t *testing.T) {
	t.Parallel()
	lone := filepath.Join(t.TempDir(), "gpupass")
	b, err := os.ReadFile(testutil.BuildBinary(t, "./cmd/gpupass"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(lone, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=", "GITHUB_OUTPUT=")
		return testutil.Run(t, cmd)
	}
	out, errOut, code := run("-o", "json", "audit", "keygen", "--out-prefix", filepath.Join(dir, "k"))
	if code != 0 || !strings.Contains(out, `"public_key"`) {
		t.Fatalf("audit keygen: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = run("audit", "verify", "missing.zip", "--key", filepath.Join(dir, "k.pub"))
	if code != ExitUsage && code != ExitFindings || strings.Count(errOut, "missing.zip") != 1 {
		t.Errorf("audit verify of a missing zip: exit %d, stderr %q; want its error once", code, errOut)
	}
	if out, errOut, code := run("bundle", "verify", "--help"); code != 0 || !strings.Contains(out, "gpupass bundle verify") {
		t.Errorf("bundle verify --help: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run("validate", "--spec", filepath.Join(testutil.RepoRoot(t), "internal", "spec", "testdata", "specs", "design-example-fixed.yaml")); code != 0 {
		t.Errorf("validate: exit %d\n%s%s", code, out, errOut)
	}
}

// TestBundleAndPosting: `bundle`, a `compare` that posts and their CI
// steps work end to end from the one binary: a real registry on loopback,
// a GitHub API that records the comment.
func TestBundleAndPosting(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	dir := t.TempDir()
	house := filepath.Join(dir, "house")
	if err := os.Mkdir(house, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := wheeltest.Simple(house, "alpha", "1.0"); err != nil {
		t.Fatal(err)
	}
	us, eu, _ := writeRuns(t, dir)
	gh := &githubPR{}
	api := httptest.NewServer(gh)
	t.Cleanup(api.Close)
	event := filepath.Join(dir, "event.json")
	if err := os.WriteFile(event, []byte(`{"pull_request":{"number":7}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	noCI := []string{"GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=", "GITHUB_OUTPUT="}
	// A pull request's variables; the runner's own flag decides --post auto.
	prVars := []string{"GITLAB_CI=", "GITHUB_EVENT_PATH=" + event, "GITHUB_REPOSITORY=acme/train", "GITHUB_RUN_ID=77",
		"GITHUB_API_URL=" + api.URL, "GITHUB_TOKEN=ghs_x", "GITHUB_STEP_SUMMARY=" + filepath.Join(dir, "summary.md"), "GITHUB_OUTPUT=" + filepath.Join(dir, "output")}
	runner := append([]string{"GITHUB_ACTIONS=true"}, prVars...)
	tests := []struct {
		name  string
		env   []string
		args  []string
		want  string // in stdout
		posts int    // comments the GitHub API has had created by then
	}{
		{"bundle push", noCI, []string{"-o", "json", "bundle", "push", "--plain-http", "--no-cache", "-w", house, host + "/team/wheels:v1"}, `"digest": "sha256:`, 0},
		{"bundle inspect", noCI, []string{"bundle", "inspect", "--plain-http", host + "/team/wheels:v1"}, "alpha-1.0-py3-none-any.whl", 0},
		{"bundle-pull step", noCI, []string{"-o", "github", "bundle", "pull", "--plain-http", "--ref", host + "/team/wheels:v1", "--to", filepath.Join(dir, "pulled")}, "1 wheels in", 0},
		{"compare --post github", append([]string{"GITHUB_ACTIONS="}, prVars...), []string{"-o", "json", "compare", us, eu, "--post", "github"}, `"action": "created"`, 1},
		// The same pull request keeps one sticky report: the later
		// compares find it (the fake API lists and edits comments, as
		// GitHub does) and leave or edit it, never add a second.
		{"compare in a pull request", runner, []string{"compare", us, eu}, "gpupass compare: consistent", 1},
		{"compare-report step in a pull request", runner, []string{"-o", "github", "compare", "--runs", "us=" + us + " eu=" + eu, "--report-dir", filepath.Join(dir, "rep")}, "gpupass compare: consistent", 1},
	}
	for _, tc := range tests { // in order: pull reads what push wrote
		cmd := exec.Command(bin, tc.args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), tc.env...)
		out, errOut, code := testutil.Run(t, cmd)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Fatalf("%s: exit %d, stdout lacks %q:\n%s%s", tc.name, code, tc.want, out, errOut)
		}
		gh.mu.Lock()
		posts, stored := len(gh.posts), len(gh.comments)
		gh.mu.Unlock()
		if posts != tc.posts || stored != tc.posts {
			t.Errorf("%s: the GitHub API had %d comments created and holds %d, want %d", tc.name, posts, stored, tc.posts)
		}
	}
}
