package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestReleaseTags runs scripts/release/stamp.sh and major-tag.sh in a
// scratch repository as a release manager and the release workflow do:
// the release commit carries its version for the Action and leaves the
// branch at "dev"; the major tag moves to a release, never to a
// pre-release; a tag whose version file disagrees is refused before
// anything is published.
func TestReleaseTags(t *testing.T) {
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "git")
	root := testutil.RepoRoot(t)
	repo := t.TempDir()
	env := append(os.Environ(), "GIT_AUTHOR_NAME=r", "GIT_AUTHOR_EMAIL=r@gpupass.test", "GIT_COMMITTER_NAME=r", "GIT_COMMITTER_EMAIL=r@gpupass.test")
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = repo, env
		b, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	must := func(name string, args ...string) string {
		t.Helper()
		out, err := run(name, args...)
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return out
	}
	for _, f := range []string{"scripts/release/stamp.sh", "scripts/release/major-tag.sh", "scripts/action/version"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(repo, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(repo, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must("git", "init", "-q", "-b", "main")
	must("git", "add", "-A")
	must("git", "commit", "-q", "-m", "init")
	if v := must("git", "show", "main:scripts/action/version"); v != "dev" {
		t.Fatalf("scripts/action/version on main = %q, want dev", v)
	}
	tagged := func(ref string) string { return must("git", "rev-parse", ref+"^{commit}") }

	must(bash, "scripts/release/stamp.sh", "v1.2.0")
	must(bash, "scripts/release/major-tag.sh", "check", "v1.2.0")
	must(bash, "scripts/release/major-tag.sh", "move", "v1.2.0")
	if tagged("v1") != tagged("v1.2.0") {
		t.Errorf("v1 is not at the v1.2.0 release commit")
	}
	if v := must("git", "show", "v1:scripts/action/version"); v != "v1.2.0" {
		t.Errorf("the Action at v1 installs %q, want v1.2.0", v)
	}
	if v := must("git", "show", "main:scripts/action/version"); v != "dev" {
		t.Errorf("stamp.sh changed main: scripts/action/version = %q", v)
	}

	// A pre-release is published but does not move v1.
	must("git", "checkout", "-q", "main")
	must(bash, "scripts/release/stamp.sh", "v1.3.0-rc.1")
	if out := must(bash, "scripts/release/major-tag.sh", "move", "v1.3.0-rc.1"); !strings.Contains(out, "pre-release; v1 stays") {
		t.Errorf("pre-release: %s", out)
	}
	if tagged("v1") != tagged("v1.2.0") {
		t.Errorf("a pre-release moved v1")
	}

	// A tag pushed without stamp.sh, and tags that are no versions.
	must("git", "checkout", "-q", "main")
	must("git", "tag", "v1.4.0")
	for _, tc := range []struct{ mode, tag, want string }{
		{"check", "v1.4.0", `scripts/action/version at v1.4.0 says "dev", not v1.4.0`},
		{"move", "v1.4.0", "Tag with scripts/release/stamp.sh v1.4.0"},
		{"check", "1.4.0", "is not vMAJOR.MINOR.PATCH"},
		{"move", "release-2", "is not vMAJOR.MINOR.PATCH"},
	} {
		out, err := run(bash, "scripts/release/major-tag.sh", tc.mode, tc.tag)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("major-tag.sh %s %s: %v, %q; want failure naming %q", tc.mode, tc.tag, err, out, tc.want)
		}
	}
	if tagged("v1") != tagged("v1.2.0") {
		t.Errorf("a refused tag moved v1")
	}
	if out, err := run(bash, "scripts/release/stamp.sh", "1.5"); err == nil || !strings.Contains(out, "is not vMAJOR.MINOR.PATCH") {
		t.Errorf("stamp.sh 1.5: %v, %q", err, out)
	}
}
