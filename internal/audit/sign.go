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

	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
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
	KeyRef     KeyRef
	Keyless    bool
	TlogUpload bool // upload the key signature to Rekor too (off: offline)
}

// Decision is how a report will be signed.
type Decision struct {
	Mode string
	// TokenSource names where the keyless OIDC token comes from:
	// TokenEnv or "github-actions".
	TokenSource string
	// Offline is true when signing talks to no service.
	Offline bool
}

// Fields of the signing errors (*fielderr.Error): the command layer names
// its flags or inputs for them.
const (
	FieldKey     = "signing key"
	FieldKeyless = "keyless signing"
	// FieldForce is the overwrite WriteKeyPair refuses without force.
	FieldForce = "key pair"
)

// Decide picks key or keyless signing. A key always wins and signs
// offline (unless TlogUpload). Without a key, a CI OIDC token (GitLab
// SIGSTORE_ID_TOKEN, GitHub's id-token endpoint) selects keyless signing
// through Fulcio and Rekor; without either there is nothing to sign with.
func Decide(cfg SignConfig, getenv func(string) string) (Decision, error) {
	if cfg.KeyRef != "" && cfg.Keyless {
		return Decision{}, &fielderr.Error{Field: FieldKey, Problem: "and {keyless signing} exclude each other: pick one"}
	}
	if cfg.KeyRef != "" {
		return Decision{Mode: ModeKey, Offline: !cfg.TlogUpload}, nil
	}
	src := ""
	switch {
	case getenv(TokenEnv) != "":
		src = TokenEnv
	case getenv(GitHubTokenURLEnv) != "" && getenv(GitHubTokenTokenEnv) != "":
		src = "github-actions"
	}
	if src != "" {
		return Decision{Mode: ModeKeyless, TokenSource: src}, nil
	}
	if cfg.Keyless {
		return Decision{}, &fielderr.Error{Field: FieldKeyless, Problem: "needs a CI OIDC token: in GitHub Actions grant `permissions: id-token: write`; in GitLab declare `id_tokens: SIGSTORE_ID_TOKEN: aud: sigstore`"}
	}
	return Decision{}, &fielderr.Error{Field: FieldKey, Problem: "is required: a cosign.key (make one with `gpupass audit keygen`), or run in CI with an OIDC token to sign keyless"}
}

// IDToken returns the OIDC token for keyless signing from the source
// Decide chose. For GitHub it asks the job's token endpoint for a token
// with the sigstore audience.
func IDToken(ctx context.Context, d Decision, getenv func(string) string, client *http.Client) (string, error) {
	switch d.TokenSource {
	case TokenEnv:
		return getenv(TokenEnv), nil
	case "github-actions":
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

// KeylessSigner signs with a short-lived key certified by Fulcio for the
// CI's OIDC identity, and records each signature in Rekor. It needs the
// network; tests exercise Decide, not this path.
type KeylessSigner struct {
	IDToken   string
	FulcioURL string
	RekorURL  string
}

// Mode implements Signer.
func (s *KeylessSigner) Mode() string { return ModeKeyless }

func (s *KeylessSigner) opts(ctx context.Context) sign.BundleOptions {
	return sign.BundleOptions{
		Context:                    ctx,
		CertificateProvider:        sign.NewFulcio(&sign.FulcioOptions{BaseURL: s.FulcioURL}),
		CertificateProviderOptions: &sign.CertificateProviderOptions{IDToken: s.IDToken},
		TransparencyLogs:           []sign.Transparency{sign.NewRekor(&sign.RekorOptions{BaseURL: s.RekorURL})},
	}
}

// SignBlob implements Signer.
func (s *KeylessSigner) SignBlob(ctx context.Context, data []byte) ([]byte, error) {
	kp, err := sign.NewEphemeralKeypair(nil)
	if err != nil {
		return nil, err
	}
	return bundleJSON(&sign.PlainData{Data: data}, kp, s.opts(ctx))
}

// SignDSSE implements Signer.
func (s *KeylessSigner) SignDSSE(ctx context.Context, payloadType string, payload []byte) ([]byte, error) {
	kp, err := sign.NewEphemeralKeypair(nil)
	if err != nil {
		return nil, err
	}
	return bundleJSON(&sign.DSSEData{Data: payload, PayloadType: payloadType}, kp, s.opts(ctx))
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
