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

// TestAuditRunsGpupassAudit: gpupass does not link the audit commands
// (sigstore); it runs gpupass-audit for them with the same arguments,
// streams and exit code, finds it beside itself, on PATH or in
// $GPUPASS_AUDIT_BIN, and says how to get it when it is missing.
func TestAuditRunsGpupassAudit(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass") // gpupass-audit beside it
	run := func(env []string, args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), env...)
		return testutil.Run(t, cmd)
	}
	t.Run("beside", func(t *testing.T) {
		dir := t.TempDir()
		// -o json before the command reaches gpupass-audit too.
		out, errOut, code := run(nil, "-o", "json", "audit", "keygen", "--out-prefix", filepath.Join(dir, "k"))
		if code != 0 || !strings.Contains(out, `"public_key"`) {
			t.Fatalf("audit keygen through gpupass: exit %d\n%s%s", code, out, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, "k.key")); err != nil {
			t.Fatal(err)
		}
		// Its exit code and its own error pass through unchanged.
		_, errOut, code = run(nil, "audit", "verify", "missing.zip", "--key", filepath.Join(dir, "k.pub"))
		if code != ExitUsage && code != ExitFindings || strings.Count(errOut, "missing.zip") != 1 {
			t.Errorf("audit verify of a missing zip: exit %d, stderr %q; want its error once", code, errOut)
		}
		out, _, code = run(nil, "audit", "verify", "--help")
		if code != 0 || !strings.Contains(out, "--agent-key") {
			t.Errorf("audit verify --help: exit %d\n%s", code, out)
		}
	})
	t.Run("missing", func(t *testing.T) {
		lone := filepath.Join(t.TempDir(), "gpupass")
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(lone, b, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(lone, "audit", "keygen")
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", AuditBinaryEnv+"=")
		_, errOut, code := testutil.Run(t, cmd)
		if code != ExitUsage || !strings.Contains(errOut, "gpupass-audit") || !strings.Contains(errOut, "go install github.com/gpupass/gpupass/cmd/gpupass-audit") {
			t.Errorf("without gpupass-audit: exit %d, stderr %q; want exit 2 saying where to get it", code, errOut)
		}
		// Every forwarded command set names the program and how to get it.
		dir := t.TempDir()
		us, eu, _ := writeRuns(t, dir)
		for _, args := range [][]string{
			{"bundle", "verify", dir},
			{"compare", us, eu, "--post", "github"},
			{"ci", "step", "--command", "bundle-pull", "--registry-ref", "127.0.0.1:1/x:1", "--wheelhouse", dir},
		} {
			cmd := exec.Command(lone, args...)
			cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", AuditBinaryEnv+"=")
			_, errOut, code := testutil.Run(t, cmd)
			if code != ExitUsage || !strings.Contains(errOut, "in gpupass-audit: it is not beside this program") || !strings.Contains(errOut, "go install github.com/gpupass/gpupass/cmd/gpupass-audit") {
				t.Errorf("%v without gpupass-audit: exit %d, stderr %q; want exit 2 saying where to get it", args, code, errOut)
			}
		}
		// A compare that posts nowhere (outside CI, --post auto) is
		// gpupass's own, as is validate.
		cmd = exec.Command(lone, "compare", us, eu)
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=")
		if out, errOut, code := testutil.Run(t, cmd); code != 0 || !strings.Contains(out, "gpupass compare: consistent") {
			t.Errorf("compare without posting, without gpupass-audit: exit %d\n%s%s", code, out, errOut)
		}
		// validate needs nothing more.
		cmd = exec.Command(lone, "validate", "--spec", filepath.Join(testutil.RepoRoot(t), "internal", "spec", "testdata", "specs", "design-example-fixed.yaml"))
		cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin")
		if out, errOut, code := testutil.Run(t, cmd); code != 0 {
			t.Errorf("validate without gpupass-audit: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("not the audit build", func(t *testing.T) {
		// $GPUPASS_AUDIT_BIN naming gpupass itself must not loop.
		_, errOut, code := run([]string{AuditBinaryEnv + "=" + bin}, "audit", "keygen")
		if code != ExitUsage || !strings.Contains(errOut, "is gpupass without the audit, bundle and forge commands") {
			t.Errorf("GPUPASS_AUDIT_BIN=gpupass: exit %d, stderr %q", code, errOut)
		}
	})
}

// TestBundleAndPostingRunGpupassAudit: gpupass does not link the OCI
// registry client or the forge clients either; `bundle`, a `compare`
// that posts and their CI steps run gpupass-audit and work end to end
// through it: a real registry on loopback, a GitHub API that records
// the comment.
func TestBundleAndPostingRunGpupassAudit(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass") // gpupass-audit beside it
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
		posts int    // comments the GitHub API has received by then
	}{
		{"bundle push", noCI, []string{"-o", "json", "bundle", "push", "--plain-http", "--no-cache", "-w", house, host + "/team/wheels:v1"}, `"digest": "sha256:`, 0},
		{"bundle inspect", noCI, []string{"bundle", "inspect", "--plain-http", host + "/team/wheels:v1"}, "alpha-1.0-py3-none-any.whl", 0},
		{"bundle-pull step", noCI, []string{"ci", "step", "--command", "bundle-pull", "--plain-http", "--registry-ref", host + "/team/wheels:v1", "--wheelhouse", filepath.Join(dir, "pulled")}, "1 wheels in", 0},
		{"compare --post github", append([]string{"GITHUB_ACTIONS="}, prVars...), []string{"-o", "json", "compare", us, eu, "--post", "github"}, `"action": "created"`, 1},
		{"compare in a pull request", runner, []string{"compare", us, eu}, "gpupass compare: consistent", 2},
		{"compare-report step in a pull request", runner, []string{"ci", "step", "--command", "compare-report", "--runs", "us=" + us + " eu=" + eu, "--report-dir", filepath.Join(dir, "rep")}, "gpupass compare: consistent", 3},
	}
	for _, tc := range tests { // in order: pull reads what push wrote
		cmd := exec.Command(bin, tc.args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append(tc.env, AuditBinaryEnv+"=")...)
		out, errOut, code := testutil.Run(t, cmd)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Fatalf("%s: exit %d, stdout lacks %q:\n%s%s", tc.name, code, tc.want, out, errOut)
		}
		gh.mu.Lock()
		posts := len(gh.posts)
		gh.mu.Unlock()
		if posts != tc.posts {
			t.Errorf("%s: the GitHub API holds %d comments, want %d", tc.name, posts, tc.posts)
		}
	}
}
