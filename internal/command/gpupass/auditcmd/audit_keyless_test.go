package auditcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// noTSA is a signing config as `cosign signing-config create` writes it,
// naming a Fulcio and a Rekor but no timestamp authority.
const noTSA = `{"mediaType":"application/vnd.dev.sigstore.signingconfig.v0.2+json",
"caUrls":[{"url":"http://127.0.0.1:9","majorApiVersion":1,"validFor":{"start":"2020-01-01T00:00:00Z"},"operator":"t"}],
"rekorTlogUrls":[{"url":"http://127.0.0.1:9","majorApiVersion":2,"validFor":{"start":"2020-01-01T00:00:00Z"},"operator":"t"}],
"rekorTlogConfig":{"selector":"ANY"},"tsaConfig":{"selector":"ANY"}}`

// TestAuditKeylessRefusals: each way to get the keyless flags wrong is
// refused before anything is signed or verified, naming the flag and the
// fix, and an identity token is never echoed.
func TestAuditKeylessRefusals(t *testing.T) {
	t.Parallel()
	dir, getenv := auditFixture(t)
	zipPath := filepath.Join(dir, "audit-report.zip")
	if err := RunAudit(context.Background(), AuditOptions{AllocationID: "alloc-7f3a", Out: zipPath, RunFile: filepath.Join(dir, "run.json"),
		Key: filepath.Join(dir, "cosign.key"), Output: "json", Getenv: getenv}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	minimal := filepath.Join(dir, "trusted_root.json")
	noTSAPath := filepath.Join(dir, "no-tsa.json")
	for p, b := range map[string]string{minimal: audit.MinimalTrustedRoot, noTSAPath: noTSA} {
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const id, iss = "https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main", "https://token.actions.githubusercontent.com"
	verifyTests := []struct {
		name     string
		o        AuditVerifyOptions
		wantCode int
		want     string
	}{
		{"neither a key nor an identity", AuditVerifyOptions{}, gpupass.ExitUsage,
			"--key is required: the cosign public key (cosign.pub) the report must be signed with; for a report signed keyless, --certificate-identity (or --certificate-identity-regexp) and --certificate-oidc-issuer instead"},
		{"an identity without its issuer", AuditVerifyOptions{CertIdentity: id}, gpupass.ExitUsage, "--certificate-oidc-issuer is required with --certificate-identity"},
		{"an issuer without an identity", AuditVerifyOptions{CertIssuer: iss}, gpupass.ExitUsage, "--certificate-identity is required with --certificate-oidc-issuer"},
		{"identity and its regexp", AuditVerifyOptions{CertIdentity: id, CertIdentityRegexp: "^x", CertIssuer: iss}, gpupass.ExitUsage, "--certificate-identity and --certificate-identity-regexp exclude each other"},
		{"a bad regexp", AuditVerifyOptions{CertIdentityRegexp: "(", CertIssuer: iss}, gpupass.ExitUsage, "--certificate-identity-regexp: not a Go regular expression"},
		{"a trusted root and a key only", AuditVerifyOptions{Key: filepath.Join(dir, "cosign.pub"), TrustedRoot: minimal}, gpupass.ExitUsage, "--trusted-root checks keyless signatures"},
		{"a missing trusted root", AuditVerifyOptions{CertIdentity: id, CertIssuer: iss, TrustedRoot: filepath.Join(dir, "nope.json")}, gpupass.ExitUsage,
			"does not exist: write it with `cosign trusted-root create`"},
		{"an identity for a report signed with a key", AuditVerifyOptions{CertIdentity: id, CertIssuer: iss, TrustedRoot: minimal}, gpupass.ExitFindings,
			"the bundle was signed with a key (it carries no certificate)"},
	}
	for _, tc := range verifyTests {
		t.Run("verify/"+tc.name, func(t *testing.T) {
			t.Parallel()
			o := tc.o
			o.Path, o.Output, o.Getenv = zipPath, "text", getenv
			var out bytes.Buffer
			err := RunAuditVerify(context.Background(), o, &out)
			var ee *gpupass.ExitError
			if !errors.As(err, &ee) || ee.Code != tc.wantCode || !strings.Contains(err.Error()+out.String(), tc.want) {
				t.Errorf("err %v (%T), want exit %d saying %q\n%s", err, err, tc.wantCode, tc.want, out.String())
			}
		})
	}

	const secret = "not-a-token-but-secret"
	auditTests := []struct {
		name string
		o    AuditOptions
		want string
	}{
		{"--fulcio-url", AuditOptions{FulcioURL: "https://fulcio.example", IdentityToken: "h.p.s"}, "--fulcio-url is replaced by --signing-config FILE"},
		{"an identity token that is neither a JWT nor a file", AuditOptions{IdentityToken: secret}, "--identity-token is neither a JWT"},
		{"a missing signing config", AuditOptions{IdentityToken: "h.p.s", SigningConfig: filepath.Join(dir, "nope.json")}, "does not exist: write it with `cosign signing-config create`"},
		{"a signing config with no timestamp authority", AuditOptions{IdentityToken: "h.p.s", SigningConfig: noTSAPath}, "names no timestamp authority"},
	}
	for _, tc := range auditTests {
		t.Run("audit/"+tc.name, func(t *testing.T) {
			t.Parallel()
			o := tc.o
			o.AllocationID, o.RunFile, o.Out, o.Getenv = "alloc-7f3a", filepath.Join(dir, "run.json"), filepath.Join(t.TempDir(), "a.zip"), getenv
			err := RunAudit(context.Background(), o, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), secret) {
				t.Errorf("err %v, want one saying %q and not the token", err, tc.want)
			}
			if _, serr := os.Stat(o.Out); serr == nil {
				t.Error("a zip was written")
			}
		})
	}
}

// TestKeylessVerifyCommandPrinted: a keyless audit (one run, or a group)
// prints who signed and the verify command for that identity, quoted to
// work pasted; a group's JSON stays the list of its zips.
func TestKeylessVerifyCommandPrinted(t *testing.T) {
	t.Parallel()
	res := &AuditResult{Path: "my reports/a.zip", Signing: audit.ModeKeyless, Match: true,
		SignerIdentity: "https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main", SignerIssuer: "https://token.actions.githubusercontent.com"}
	const want = "signed keyless as https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main (OIDC issuer https://token.actions.githubusercontent.com); verify with:\n" +
		"  gpupass audit verify %s --certificate-identity https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main --certificate-oidc-issuer https://token.actions.githubusercontent.com%s\n"
	var one bytes.Buffer
	if err := (auditWritten{res, "/etc/sigstore/trusted root.json"}).WriteText(&one); err != nil {
		t.Fatal(err)
	}
	if w := fmt.Sprintf(want, "'my reports/a.zip'", " --trusted-root '/etc/sigstore/trusted root.json'"); !strings.HasSuffix(one.String(), w) {
		t.Errorf("audit prints:\n%s\nwant it to end with:\n%s", one.String(), w)
	}
	g := groupPrinted{zips: groupWritten{{Region: "us-west-2", AuditResult: res}}, dir: "audit-group-1"}
	var text, js bytes.Buffer
	if err := g.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if w := fmt.Sprintf(want, "audit-group-1", ""); !strings.HasSuffix(text.String(), w) {
		t.Errorf("audit GROUP prints:\n%s\nwant it to end with:\n%s", text.String(), w)
	}
	if err := g.WriteJSON(&js); err != nil || !strings.HasPrefix(js.String(), "[") || !strings.Contains(js.String(), `"signer_identity": "https://github.com/o/r/`) {
		t.Errorf("audit GROUP -o json: %v\n%s", err, js.String())
	}
}
