//go:build e2e

package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
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
