//go:build e2e

package sigstoretest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
)

// TestStockCosignSignsAndVerifiesKeyless proves the stack is a real
// Sigstore: the stock cosign CLI signs a blob keyless through it (Fulcio
// certificate for a test issuer's token, Rekor v2 entry, signed
// timestamp) with nothing but the signing config and the token, and
// verifies it with nothing but the trusted root; a wrong identity, a wrong
// issuer and a changed byte are refused. For GitHub's and GitLab's claims.
func TestStockCosignSignsAndVerifiesKeyless(t *testing.T) {
	cosign := testutil.Tool(t, "cosign")
	t0 := time.Now()
	s := sigstoretest.Start(t)
	t.Logf("stack up in %v", time.Since(t0).Round(time.Millisecond))
	dir := t.TempDir()
	blob := filepath.Join(dir, "blob.txt")
	if err := os.WriteFile(blob, []byte("the proof\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(cosign, args...)
		// No TUF, no public-good instance: everything comes from the files.
		cmd.Env = append(os.Environ(), "HOME="+dir, "TUF_ROOT="+filepath.Join(dir, "tuf"), "SIGSTORE_NO_CACHE=true")
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	for _, c := range []sigstoretest.Claims{sigstoretest.GitHubClaims{}, sigstoretest.GitLabClaims{ProjectPath: "ml/train"}} {
		bundle := filepath.Join(dir, strings.ReplaceAll(c.Identity(), "/", "_")+".sigstore.json")
		// cosign takes only an RS256 token as the flag's value (GitLab's
		// ES256 one it reads as a file name): a file works for both.
		tokFile := filepath.Join(dir, "token")
		if err := os.WriteFile(tokFile, []byte(s.Token(t, c)), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := run("sign-blob", "--yes", "--bundle", bundle, "--signing-config", s.SigningConfig,
			"--trusted-root", s.TrustedRoot, "--identity-token", tokFile, blob)
		if err != nil {
			t.Fatalf("cosign sign-blob as %s: %v\n%s", c.Identity(), err, out)
		}
		b, err := os.ReadFile(bundle)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"rfc3161Timestamps"`, `"kindVersion"`, `"certificate"`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("the bundle lacks %s:\n%s", want, b)
			}
		}
		verify := func(identity, issuer, file string) (string, error) {
			return run("verify-blob", "--bundle", bundle, "--trusted-root", s.TrustedRoot, "--use-signed-timestamps",
				"--certificate-identity", identity, "--certificate-oidc-issuer", issuer, file)
		}
		if out, err := verify(c.Identity(), s.Issuer(c), blob); err != nil || !strings.Contains(out, "Verified OK") {
			t.Errorf("cosign verify-blob as %s: %v\n%s", c.Identity(), err, out)
		}
		tampered := filepath.Join(dir, "tampered.txt")
		if err := os.WriteFile(tampered, []byte("the proog\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, args := range map[string][3]string{
			"wrong identity": {c.Identity() + "x", s.Issuer(c), blob},
			"wrong issuer":   {c.Identity(), s.GitHubIssuer + "x", blob},
			"changed byte":   {c.Identity(), s.Issuer(c), tampered},
		} {
			if out, err := verify(args[0], args[1], args[2]); err == nil {
				t.Errorf("%s: cosign verify-blob accepted it:\n%s", name, out)
			}
		}
	}
}
