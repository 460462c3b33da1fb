package audit

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	"github.com/sigstore/sigstore-go/pkg/fulcio/certificate"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/sign"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// Signer signs audit content as sigstore bundles (the format `cosign
// verify-blob --bundle` reads).
type Signer interface {
	// SignBlob returns a bundle with a message signature over data.
	SignBlob(ctx context.Context, data []byte) ([]byte, error)
	// SignDSSE returns a bundle with a DSSE envelope around payload.
	SignDSSE(ctx context.Context, payloadType string, payload []byte) ([]byte, error)
	// Mode is "key" or "keyless".
	Mode() string
}

// Signing modes.
const (
	ModeKey     = "key"
	ModeKeyless = "keyless"
)

// Token sources for keyless signing.
const (
	// TokenEnv is the variable GitLab's `id_tokens:` puts the OIDC token
	// in (and the one cosign reads everywhere).
	TokenEnv = "SIGSTORE_ID_TOKEN"
	// GitHub Actions exposes a token endpoint to jobs granted
	// `permissions: id-token: write`.
	GitHubTokenURLEnv   = "ACTIONS_ID_TOKEN_REQUEST_URL"
	GitHubTokenTokenEnv = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"
)

// SignConfig is what the user asked for.
type SignConfig struct {
	KeyRef  KeyRef
	Keyless bool
	// IDToken is an OIDC token given outright (cosign's
	// --identity-token): it wins over the CI's.
	IDToken    string
	TlogUpload bool // upload the key signature to Rekor too (off: offline)
}

// Decision is how a report will be signed.
type Decision struct {
	Mode string
	// TokenSource names where the keyless OIDC token comes from:
	// TokenSourceFlag, TokenEnv or TokenSourceGitHub.
	TokenSource string
	// Offline is true when signing talks to no service.
	Offline bool
}

// Fields of the signing errors (*fielderr.Error): the command layer names
// its flags or inputs for them.
const (
	FieldKey     = "signing key"
	FieldKeyless = "keyless signing"
	// FieldSigningConfig is the signing config (cosign's
	// --signing-config): where to sign keyless.
	FieldSigningConfig = "signing config"
	// FieldTrustedRoot is the trusted root (--trusted-root).
	FieldTrustedRoot = "trusted root"
	// FieldIdentityToken is an OIDC token given outright.
	FieldIdentityToken = "identity token"
	// FieldForce is the overwrite WriteKeyPair refuses without force.
	FieldForce = "key pair"
)

// Token sources a Decision names besides TokenEnv.
const (
	TokenSourceFlag   = "identity-token"
	TokenSourceGitHub = "github-actions"
)

// Decide picks key or keyless signing. A key always wins and signs
// offline (unless TlogUpload). Without a key, an OIDC identity (a token
// given outright, GitLab's SIGSTORE_ID_TOKEN, GitHub's id-token endpoint)
// selects keyless signing; without either there is nothing to sign with,
// and the error says what the CI job lacks.
func Decide(cfg SignConfig, getenv func(string) string) (Decision, error) {
	if cfg.KeyRef != "" && (cfg.Keyless || cfg.IDToken != "") {
		return Decision{}, &fielderr.Error{Field: FieldKey, Problem: "and {keyless signing} exclude each other: pick one"}
	}
	if cfg.KeyRef != "" {
		return Decision{Mode: ModeKey, Offline: !cfg.TlogUpload}, nil
	}
	src := ""
	switch {
	case cfg.IDToken != "":
		src = TokenSourceFlag
	case getenv(TokenEnv) != "":
		src = TokenEnv
	case getenv(GitHubTokenURLEnv) != "" && getenv(GitHubTokenTokenEnv) != "":
		src = TokenSourceGitHub
	}
	if src != "" {
		return Decision{Mode: ModeKeyless, TokenSource: src}, nil
	}
	field := FieldKey
	if cfg.Keyless {
		field = FieldKeyless
	}
	if hint := MissingIdentity(getenv); hint != "" {
		if cfg.Keyless {
			return Decision{}, &fielderr.Error{Field: field, Problem: "needs an OIDC identity: " + hint}
		}
		return Decision{}, &fielderr.Error{Field: field, Problem: "is required, or an OIDC identity to sign keyless: " + hint}
	}
	if cfg.Keyless {
		return Decision{}, &fielderr.Error{Field: field, Problem: "needs an OIDC token: in GitHub Actions grant `permissions: id-token: write`; in GitLab declare `id_tokens: " + TokenEnv + ": aud: sigstore`; elsewhere pass {identity token}"}
	}
	return Decision{}, &fielderr.Error{Field: FieldKey, Problem: "is required: a cosign.key (make one with `gpupass audit keygen`), or an OIDC identity to sign keyless (a CI job's token, or {identity token})"}
}

// MissingIdentity says, in a CI job that has no OIDC token, what the job
// must declare to sign keyless; "" outside GitHub Actions and GitLab CI.
func MissingIdentity(getenv func(string) string) string {
	switch {
	case getenv("GITHUB_ACTIONS") == "true":
		return "this GitHub Actions job has none (" + GitHubTokenURLEnv + " is unset): grant the job `permissions: id-token: write`"
	case getenv("GITLAB_CI") == "true":
		return "this GitLab job has none (" + TokenEnv + " is unset): declare `id_tokens: " + TokenEnv + ": aud: sigstore` in the job"
	}
	return ""
}

// IDToken returns the OIDC token for keyless signing from the source
// Decide chose. For GitHub it asks the job's token endpoint for a token
// with the sigstore audience.
func IDToken(ctx context.Context, d Decision, cfg SignConfig, getenv func(string) string, client *http.Client) (string, error) {
	switch d.TokenSource {
	case TokenSourceFlag:
		return cfg.IDToken, nil
	case TokenEnv:
		return getenv(TokenEnv), nil
	case TokenSourceGitHub:
		return fetchGitHubToken(ctx, client, getenv(GitHubTokenURLEnv), getenv(GitHubTokenTokenEnv))
	}
	return "", fmt.Errorf("no OIDC token source")
}

func fetchGitHubToken(ctx context.Context, client *http.Client, reqURL, bearer string) (string, error) {
	u, err := url.Parse(reqURL)
	if err != nil {
		return "", fmt.Errorf("parsing %s: %w", GitHubTokenURLEnv, err)
	}
	q := u.Query()
	q.Set("audience", "sigstore")
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("requesting GitHub OIDC token: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("requesting GitHub OIDC token: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("reading GitHub OIDC token: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		// The body is not echoed: it may carry token material.
		return "", fmt.Errorf("requesting GitHub OIDC token: HTTP %d (does the job have `permissions: id-token: write`?)", resp.StatusCode)
	}
	var tok struct {
		Value string `json:"value"`
	}
	if err := json.Unmarshal(body, &tok); err != nil || tok.Value == "" {
		return "", errors.New("requesting GitHub OIDC token: response has no token value")
	}
	return tok.Value, nil
}

// KeySigner signs with a cosign key. Signatures are deterministic (RFC
// 6979), so the same run audits to the same bytes.
type KeySigner struct {
	kp   *keyKeypair
	tlog []sign.Transparency
}

// NewKeySigner signs with key; rekorURL, when set, also records each
// signature in that transparency log (otherwise signing is offline).
func NewKeySigner(key *ecdsa.PrivateKey, rekorURL string) (*KeySigner, error) {
	kp, err := newKeyKeypair(key)
	if err != nil {
		return nil, err
	}
	s := &KeySigner{kp: kp}
	if rekorURL != "" {
		s.tlog = []sign.Transparency{sign.NewRekor(&sign.RekorOptions{BaseURL: rekorURL})}
	}
	return s, nil
}

// Mode implements Signer.
func (s *KeySigner) Mode() string { return ModeKey }

// SignBlob implements Signer.
func (s *KeySigner) SignBlob(ctx context.Context, data []byte) ([]byte, error) {
	return bundleJSON(&sign.PlainData{Data: data}, s.kp, sign.BundleOptions{Context: ctx, TransparencyLogs: s.tlog})
}

// SignDSSE implements Signer.
func (s *KeySigner) SignDSSE(ctx context.Context, payloadType string, payload []byte) ([]byte, error) {
	return bundleJSON(&sign.DSSEData{Data: payload, PayloadType: payloadType}, s.kp, sign.BundleOptions{Context: ctx, TransparencyLogs: s.tlog})
}

// KeylessSigner signs with a short-lived key that the signing config's
// Fulcio certifies for the CI job's OIDC identity, records each signature
// in its transparency log and has its timestamp authority sign the time:
// what `cosign sign-blob --signing-config` does. Rekor v2 gives no
// integrated time, so the signed timestamp is what proves the certificate
// was valid when the report was signed.
type KeylessSigner struct {
	kp   sign.Keypair
	opts sign.BundleOptions
	// signed is who the certificate names, once one is issued.
	signed SignedBy
}

// NewKeylessSigner signs with idToken through the services sc names.
// trusted, when set, checks each bundle after signing (cosign sign-blob
// --trusted-root). One ephemeral key signs every bundle of the signer, so
// a report's manifest and attestation carry the same certificate.
func NewKeylessSigner(idToken string, sc *root.SigningConfig, trusted root.TrustedMaterial) (*KeylessSigner, error) {
	now := time.Now()
	fulcio, err := root.SelectService(sc.FulcioCertificateAuthorityURLs(), sign.FulcioAPIVersions, now)
	if err != nil {
		return nil, &fielderr.Error{Field: FieldSigningConfig, Problem: fmt.Sprintf("names no usable Fulcio: %v", err)}
	}
	tsas, err := root.SelectServices(sc.TimestampAuthorityURLs(), sc.TimestampAuthorityURLsConfig(), sign.TimestampAuthorityAPIVersions, now)
	if err != nil || len(tsas) == 0 {
		// Without a signed timestamp a Rekor v2 entry proves no time,
		// and the short-lived certificate nothing after it expires.
		return nil, &fielderr.Error{Field: FieldSigningConfig, Problem: "names no timestamp authority (tsaUrls): keyless audit reports carry a signed timestamp; add one with `cosign signing-config create --tsa url=…,api-version=1,start-time=…,operator=… --tsa-config ANY`"}
	}
	logs, err := root.SelectServices(sc.RekorLogURLs(), sc.RekorLogURLsConfig(), sign.RekorAPIVersions, now)
	if err != nil || len(logs) == 0 {
		return nil, &fielderr.Error{Field: FieldSigningConfig, Problem: "names no transparency log (rekorTlogUrls): a keyless signature must be logged for a verifier to accept it"}
	}
	kp, err := sign.NewEphemeralKeypair(nil)
	if err != nil {
		return nil, err
	}
	s := &KeylessSigner{kp: kp}
	s.opts = sign.BundleOptions{
		CertificateProvider:        sign.NewFulcio(&sign.FulcioOptions{BaseURL: fulcio.URL, Timeout: 30 * time.Second, Retries: 1}),
		CertificateProviderOptions: &sign.CertificateProviderOptions{IDToken: idToken},
		TrustedRoot:                trusted,
	}
	for _, t := range tsas {
		s.opts.TimestampAuthorities = append(s.opts.TimestampAuthorities, sign.NewTimestampAuthority(&sign.TimestampAuthorityOptions{URL: t.URL, Timeout: 30 * time.Second, Retries: 1}))
	}
	for _, l := range logs {
		s.opts.TransparencyLogs = append(s.opts.TransparencyLogs, sign.NewRekor(&sign.RekorOptions{BaseURL: l.URL, Timeout: 90 * time.Second, Retries: 1, Version: l.MajorAPIVersion}))
	}
	return s, nil
}

// Mode implements Signer.
func (s *KeylessSigner) Mode() string { return ModeKeyless }

func (s *KeylessSigner) bundle(ctx context.Context, content sign.Content) ([]byte, error) {
	o := s.opts
	o.Context = ctx
	b, err := sign.Bundle(content, s.kp, o)
	if err != nil {
		return nil, fmt.Errorf("signing keyless: %w", err)
	}
	if raw := b.GetVerificationMaterial().GetCertificate().GetRawBytes(); raw != nil {
		if c, err := x509.ParseCertificate(raw); err == nil {
			if sum, err := certificate.SummarizeCertificate(c); err == nil {
				e := sum.Extensions
				s.signed = SignedBy{Identity: sum.SubjectAlternativeName, Issuer: e.Issuer, Repository: e.SourceRepositoryURI,
					Workflow: e.BuildConfigURI, Ref: e.SourceRepositoryRef, Commit: e.SourceRepositoryDigest, Trigger: e.BuildTrigger, Run: e.RunInvocationURI}
			}
		}
	}
	return marshalBundle(b)
}

// Identity is the certificate's identity and OIDC issuer, what a
// verifier passes as --certificate-identity and
// --certificate-oidc-issuer; empty before the first signature.
func (s *KeylessSigner) Identity() (identity, issuer string) {
	return s.signed.Identity, s.signed.Issuer
}

// SignedBy is who the certificate names (repository, workflow, ref,
// commit, as the CI's token filled them in); zero before the first
// signature. SignedAt is left zero: it is what a verifier checks.
func (s *KeylessSigner) SignedBy() SignedBy { return s.signed }

// SignBlob implements Signer.
func (s *KeylessSigner) SignBlob(ctx context.Context, data []byte) ([]byte, error) {
	return s.bundle(ctx, &sign.PlainData{Data: data})
}

// SignDSSE implements Signer.
func (s *KeylessSigner) SignDSSE(ctx context.Context, payloadType string, payload []byte) ([]byte, error) {
	return s.bundle(ctx, &sign.DSSEData{Data: payload, PayloadType: payloadType})
}

func bundleJSON(content sign.Content, kp sign.Keypair, opts sign.BundleOptions) ([]byte, error) {
	b, err := sign.Bundle(content, kp, opts)
	if err != nil {
		return nil, err
	}
	return marshalBundle(b)
}

// marshalBundle encodes a bundle as compact JSON. protojson deliberately
// varies its whitespace between runs; compacting removes that so the
// bytes are stable.
func marshalBundle(b *protobundle.Bundle) ([]byte, error) {
	raw, err := protojson.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encoding bundle: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("encoding bundle: %w", err)
	}
	return buf.Bytes(), nil
}

// keyKeypair adapts a cosign ECDSA P-256 key to sigstore-go's Keypair,
// signing deterministically.
type keyKeypair struct {
	key  *ecdsa.PrivateKey
	hint []byte
}

func newKeyKeypair(key *ecdsa.PrivateKey) (*keyKeypair, error) {
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding public key: %w", err)
	}
	// The same hint sigstore-go and cosign use: base64 SHA-256 of the
	// PKIX public key.
	h := sha256.Sum256(der)
	return &keyKeypair{key: key, hint: []byte(base64.StdEncoding.EncodeToString(h[:]))}, nil
}

func (k *keyKeypair) GetHashAlgorithm() protocommon.HashAlgorithm {
	return protocommon.HashAlgorithm_SHA2_256
}

func (k *keyKeypair) GetSigningAlgorithm() protocommon.PublicKeyDetails {
	return protocommon.PublicKeyDetails_PKIX_ECDSA_P256_SHA_256
}

func (k *keyKeypair) GetHint() []byte                { return k.hint }
func (k *keyKeypair) GetKeyAlgorithm() string        { return "ECDSA" }
func (k *keyKeypair) GetPublicKey() crypto.PublicKey { return k.key.Public() }

func (k *keyKeypair) GetPublicKeyPem() (string, error) {
	b, err := cryptoutils.MarshalPublicKeyToPEM(k.key.Public())
	return string(b), err
}

func (k *keyKeypair) SignData(_ context.Context, data []byte) ([]byte, []byte, error) {
	digest := sha256.Sum256(data)
	// A nil random source makes crypto/ecdsa sign per RFC 6979.
	sig, err := k.key.Sign(nil, digest[:], crypto.SHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("signing: %w", err)
	}
	return sig, digest[:], nil
}
