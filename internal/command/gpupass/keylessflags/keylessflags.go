// Package keylessflags holds the flags every gpupass command that signs
// or verifies keyless shares, with cosign's names (--signing-config,
// --trusted-root, --identity-token, --certificate-identity[-regexp],
// --certificate-oidc-issuer[-regexp]), so that `gpupass audit` and
// `gpupass model` take the same flags and check them the same way.
package keylessflags

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// Sign are the keyless signing flags.
type Sign struct {
	Keyless       bool
	IdentityToken string
	SigningConfig string
	TrustedRoot   string
}

// AddFlags registers the keyless signing flags; what names what is
// signed ("each keyless bundle", "the attestation").
func (s *Sign) AddFlags(f *pflag.FlagSet, what string) {
	f.BoolVar(&s.Keyless, "keyless", false, "sign keyless, and fail unless the job has an OIDC identity (without --key that is the default whenever it has one)")
	f.StringVar(&s.IdentityToken, "identity-token", "", "OIDC token to sign keyless with, or a file holding it (default: SIGSTORE_ID_TOKEN, or GitHub Actions' id-token endpoint)")
	gpupass.MarkSecret("identity-token")
	f.StringVar(&s.SigningConfig, "signing-config", "", "signing config (cosign signing-config create) naming the Fulcio, Rekor and timestamp authority to sign keyless with (default: the public-good Sigstore instance's, from its TUF repository)")
	f.StringVar(&s.TrustedRoot, "trusted-root", "", "trusted root (cosign trusted-root create) to check "+what+" against once signed")
}

// Password is the --key-password flag of every command that signs with
// a key: the password kept as bytes in *p, never printed (help and
// errors show *** when it is set).
func Password(p *[]byte) pflag.Value { return passwordValue{p} }

type passwordValue struct{ p *[]byte }

func (v passwordValue) String() string {
	if v.p == nil || len(*v.p) == 0 {
		return ""
	}
	return "***"
}
func (v passwordValue) Set(s string) error { *v.p = []byte(s); return nil }
func (passwordValue) Type() string         { return "string" }

// Config is the audit.SignConfig of a key reference and these flags,
// --identity-token read as cosign reads it (the token, or a file).
func (s Sign) Config(key string, tlogUpload bool) (audit.SignConfig, error) {
	tok := s.IdentityToken
	if tok != "" {
		var err error
		if tok, err = IdentityToken(tok); err != nil {
			return audit.SignConfig{}, err
		}
	}
	return audit.SignConfig{KeyRef: audit.KeyRef(key), Keyless: s.Keyless, IDToken: tok, TlogUpload: tlogUpload}, nil
}

// IdentityToken reads --identity-token as cosign does: the token, or a
// file holding it.
func IdentityToken(v string) (string, error) {
	if strings.Count(v, ".") == 2 && !strings.ContainsAny(v, "/ ") {
		return v, nil
	}
	b, err := os.ReadFile(v)
	if err != nil {
		// The value may be a mangled token: never echo it.
		return "", &gpupass.ExitError{Code: gpupass.ExitUsage, Err: errors.New("--identity-token is neither a JWT (header.payload.signature) nor a readable file holding one")}
	}
	return strings.TrimSpace(string(b)), nil
}

// Verify are the flags naming the keyless signer something must have:
// cosign verify-blob's flags of the same names.
type Verify struct {
	CertIdentity, CertIdentityRegexp string
	CertIssuer, CertIssuerRegexp     string
	// TrustedRoot empty: the public-good instance's.
	TrustedRoot string
}

// AddFlags registers the keyless verification flags; what names what is
// verified ("report", "attestation").
func (v *Verify) AddFlags(f *pflag.FlagSet, what string) {
	f.StringVar(&v.CertIdentity, "certificate-identity", "", "for a keyless "+what+": the identity that must have signed it (GitHub: https://github.com/OWNER/REPO/.github/workflows/FILE@REF; GitLab: https://gitlab.com/GROUP/PROJECT//.gitlab-ci.yml@REF)")
	f.StringVar(&v.CertIdentityRegexp, "certificate-identity-regexp", "", "for a keyless "+what+": a Go regular expression the signing identity must match, instead of --certificate-identity")
	f.StringVar(&v.CertIssuer, "certificate-oidc-issuer", "", "for a keyless "+what+": the OIDC issuer of the signing identity (GitHub: https://token.actions.githubusercontent.com; GitLab: https://gitlab.com)")
	f.StringVar(&v.CertIssuerRegexp, "certificate-oidc-issuer-regexp", "", "for a keyless "+what+": a Go regular expression the OIDC issuer must match, instead of --certificate-oidc-issuer")
	f.StringVar(&v.TrustedRoot, "trusted-root", "", "trusted root (cosign trusted-root create) for a keyless "+what+" (default: the public-good Sigstore instance's, from its TUF repository)")
}

// Identity is the keyless signer the flags name (nil: none), with its
// trusted root loaded. flag names a flag as the user typed it (a CI
// step's input too).
func (v Verify) Identity(flag func(string) string) (*audit.Identity, error) {
	hasID := v.CertIdentity != "" || v.CertIdentityRegexp != ""
	hasIssuer := v.CertIssuer != "" || v.CertIssuerRegexp != ""
	usage := func(format string, args ...any) error {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case !hasID && !hasIssuer:
		if v.TrustedRoot != "" {
			return nil, usage("%s checks keyless signatures (reports, attestations): name the identity that must have signed with %s (or %s) and %s", flag("trusted-root"), flag("certificate-identity"), flag("certificate-identity-regexp"), flag("certificate-oidc-issuer"))
		}
		return nil, nil
	case v.CertIdentity != "" && v.CertIdentityRegexp != "":
		return nil, usage("%s and %s exclude each other: pick one", flag("certificate-identity"), flag("certificate-identity-regexp"))
	case v.CertIssuer != "" && v.CertIssuerRegexp != "":
		return nil, usage("%s and %s exclude each other: pick one", flag("certificate-oidc-issuer"), flag("certificate-oidc-issuer-regexp"))
	case !hasIssuer:
		return nil, usage("%s is required with %s: the OIDC issuer of the signing CI (https://token.actions.githubusercontent.com for GitHub Actions, https://gitlab.com for GitLab.com)", flag("certificate-oidc-issuer"), flag("certificate-identity"))
	case !hasID:
		return nil, usage("%s is required with %s: the identity that must have signed (a GitHub workflow's URL at a ref, https://github.com/OWNER/REPO/.github/workflows/FILE@refs/heads/main, or a GitLab pipeline's)", flag("certificate-identity"), flag("certificate-oidc-issuer"))
	}
	for _, re := range []struct{ flag, v string }{{"certificate-identity-regexp", v.CertIdentityRegexp}, {"certificate-oidc-issuer-regexp", v.CertIssuerRegexp}} {
		if _, err := regexp.Compile(re.v); err != nil {
			return nil, usage("%s: not a Go regular expression: %w", flag(re.flag), err)
		}
	}
	tr, err := audit.LoadTrustedRoot(v.TrustedRoot)
	if err != nil {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: err}
	}
	return &audit.Identity{TrustedRoot: tr, SAN: v.CertIdentity, SANRegexp: v.CertIdentityRegexp, Issuer: v.CertIssuer, IssuerRegexp: v.CertIssuerRegexp}, nil
}

// VerifyArgs are the flags that verify a keyless signature by identity
// and issuer (and the trusted root, when one was used), quoted to work
// pasted: what follows `gpupass audit verify ZIP` or `gpupass model
// verify REF` in the command a signer prints.
func VerifyArgs(identity, issuer, trustedRoot string) string {
	q := termsafe.ShellQuote
	s := " --certificate-identity " + q(identity) + " --certificate-oidc-issuer " + q(issuer)
	if trustedRoot != "" {
		s += " --trusted-root " + q(trustedRoot)
	}
	return s
}
