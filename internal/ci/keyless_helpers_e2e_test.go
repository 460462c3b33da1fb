//go:build e2e

package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
)

// keylessCI is what the keyless tests of the Action (act) and the GitLab
// components (gitlab-ci-local) share: the gpupass binary, a PATH with
// the CI runner tools and it in front, the runner, stock cosign and the
// private Sigstore the job signs on.
type keylessCI struct {
	bin, path, runner, cosign string
	sig                       *sigstoretest.Stack
}

// startKeylessCI builds gpupass, finds runner (act or gitlab-ci-local)
// and cosign, and starts the private Sigstore.
func startKeylessCI(t *testing.T, runner string) keylessCI {
	t.Helper()
	k := keylessCI{bin: testutil.BuildBinary(t, "./cmd/gpupass")}
	k.path = toolsPath(t, k.bin)
	k.runner = lookPath(t, k.path, runner)
	k.cosign = lookPath(t, k.path, "cosign")
	k.sig = sigstoretest.Start(t)
	return k
}

// cosignVerifyBlob runs stock `cosign verify-blob` on the manifest of a
// report extracted into dir, against the private Sigstore's trusted root
// and the identity and issuer given, with a HOME of its own (no cached
// public-good TUF root).
func (k keylessCI) cosignVerifyBlob(t *testing.T, dir, id, iss string) (string, error) {
	t.Helper()
	c := exec.Command(k.cosign, "verify-blob", "--bundle", audit.FileManifestBundle, "--trusted-root", k.sig.TrustedRoot, "--use-signed-timestamps",
		"--certificate-identity", id, "--certificate-oidc-issuer", iss, audit.FileManifest)
	home := t.TempDir()
	c.Dir, c.Env = dir, append(os.Environ(), "HOME="+home, "TUF_ROOT="+filepath.Join(home, "tuf"), "SIGSTORE_NO_CACHE=true")
	b, err := c.CombinedOutput()
	return string(b), err
}

// paste runs line as a user pasting it into a shell in dir would, with
// gpupass and the CI tools on PATH, and returns its output.
func (k keylessCI) paste(line, dir string) (string, error) {
	sh := exec.Command("sh", "-c", line)
	sh.Dir, sh.Env = dir, append(os.Environ(), "PATH="+k.path)
	b, err := sh.CombinedOutput()
	return string(b), err
}

// actRepo is a checkout of this repository (the root action, as act
// runs it) whose one workflow is internal/ci/testdata/<workflow>.
func actRepo(t *testing.T, workflow string) string {
	t.Helper()
	wf, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "internal", "ci", "testdata", workflow))
	if err != nil {
		t.Fatal(err)
	}
	dir := gitRepo(t, ".", "https://github.com/acme/train.git")
	wfDir := filepath.Join(dir, ".github", "workflows")
	os.RemoveAll(wfDir)
	if err := os.MkdirAll(wfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wfDir, filepath.Base(workflow)), wf, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runAct runs `act event` in dir on the host, as a GitHub job of
// acme/train granted `id-token: write` (reqURL and reqToken from
// sig.GitHubActions), with this machine's Go caches (the action builds
// gpupass from source), E2E_OUT=out, the private Sigstore as the
// SIGSTORE_SIGNING_CONFIG and SIGSTORE_TRUSTED_ROOT variables, and args;
// it returns act's output.
func (k keylessCI) runAct(t *testing.T, dir, event, out, reqURL, reqToken string, args ...string) (string, error) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "go on PATH (the action builds gpupass from source)")
	}
	goenv := func(k string) string {
		b, _ := exec.Command(gobin, "env", k).Output()
		return strings.TrimSpace(string(b))
	}
	cmd := exec.Command(k.runner, append([]string{event,
		"-P", "ubuntu-latest=-self-hosted",
		"--env", "E2E_OUT=" + out,
		"--env", "GITHUB_REPOSITORY=acme/train",
		"--env", "GOCACHE=" + goenv("GOCACHE"),
		"--env", "GOMODCACHE=" + goenv("GOMODCACHE"),
		// What a job granted id-token: write has.
		"--env", "ACTIONS_ID_TOKEN_REQUEST_URL=" + reqURL,
		"--env", "ACTIONS_ID_TOKEN_REQUEST_TOKEN=" + reqToken,
		"--var", "SIGSTORE_SIGNING_CONFIG=" + k.sig.SigningConfig,
		"--var", "SIGSTORE_TRUSTED_ROOT=" + k.sig.TrustedRoot,
	}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+k.path)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// commitFiles writes files (by path under dir) into the git checkout dir
// and commits them with message msg.
func commitFiles(t *testing.T, dir, msg string, files map[string][]byte) {
	t.Helper()
	for name, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.email=ci@gpupass.test", "-c", "user.name=gpupass test", "commit", "-q", "-m", msg}} {
		c := exec.Command("git", args...)
		c.Dir = dir
		if b, err := c.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
}

// runGitLabCI runs the pipeline committed in dir through gitlab-ci-local
// with the shell executor, as a GitLab job whose id_tokens give it token
// as SIGSTORE_ID_TOKEN, with the private Sigstore as the
// SIGSTORE_SIGNING_CONFIG and SIGSTORE_TRUSTED_ROOT variables and vars
// (NAME=value each); it returns gitlab-ci-local's output.
func (k keylessCI) runGitLabCI(dir, token string, vars ...string) (string, error) {
	args := []string{"--shell-executor-no-image", "--force-shell-executor",
		"--variable", "GITLAB_CI=true",
		"--variable", "SIGSTORE_ID_TOKEN=" + token}
	for _, v := range vars {
		args = append(args, "--variable", v)
	}
	args = append(args,
		"--variable", "SIGSTORE_SIGNING_CONFIG="+k.sig.SigningConfig,
		"--variable", "SIGSTORE_TRUSTED_ROOT="+k.sig.TrustedRoot)
	cmd := exec.Command(k.runner, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+k.path, "GITHUB_ACTIONS=", "CI=")
	b, err := cmd.CombinedOutput()
	return string(b), err
}
