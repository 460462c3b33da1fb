package sigstoretest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Audience is the audience Fulcio's config names for every issuer, and
// the one a CI job asks its token for.
const Audience = "sigstore"

// issuer is an OIDC provider with two issuers, /github and /gitlab, each
// with its discovery document and JWKS: GitHub's tokens are RS256, GitLab's
// ES256, so Fulcio checks both kinds. /github/token also answers as a
// GitHub Actions job's ACTIONS_ID_TOKEN_REQUEST_URL.
type issuer struct {
	url  string
	rsa  *rsa.PrivateKey
	ec   *ecdsa.PrivateKey
	mu   sync.Mutex
	jobs map[string]GitHubClaims // bearer -> the job's claims
	// requests counts the token endpoint's answers (tests check that the
	// CLI asked it).
	requests int
}

func startIssuer(t testing.TB, host string) *issuer {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	is := &issuer{url: "http://" + ln.Addr().String(), rsa: rk, ec: ek, jobs: map[string]GitHubClaims{}}
	srv := &http.Server{Handler: is.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return is
}

func (is *issuer) handler() http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"github", "gitlab"} {
		iss := is.url + "/" + p
		mux.HandleFunc("GET /"+p+"/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, map[string]any{
				"issuer":                                iss,
				"jwks_uri":                              iss + "/jwks",
				"response_types_supported":              []string{"id_token"},
				"subject_types_supported":               []string{"public"},
				"id_token_signing_alg_values_supported": []string{"RS256", "ES256"},
				"claims_supported":                      []string{"sub", "aud", "exp", "iat", "iss"},
			})
		})
		mux.HandleFunc("GET /"+p+"/jwks", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, map[string]any{"keys": []any{is.rsaJWK(), is.ecJWK()}})
		})
	}
	// What GitHub's runner serves to a job with id-token: write: a token
	// for the audience asked, to the holder of the request token.
	mux.HandleFunc("GET /github/token", func(w http.ResponseWriter, r *http.Request) {
		bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		is.mu.Lock()
		c, known := is.jobs[bearer]
		is.requests++
		is.mu.Unlock()
		if !ok || !known {
			http.Error(w, `{"message":"Unable to get ACTIONS_ID_TOKEN_REQUEST_URL env variable"}`, http.StatusUnauthorized)
			return
		}
		aud := r.URL.Query().Get("audience")
		if aud == "" {
			aud = "https://github.com/" + c.owner()
		}
		writeJSON(w, map[string]any{"count": 1, "value": is.sign(c.claims(is.url+"/github", aud), "RS256")})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func (is *issuer) rsaJWK() map[string]any {
	return map[string]any{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "rsa-1",
		"n": b64(is.rsa.N.Bytes()), "e": b64(big.NewInt(int64(is.rsa.E)).Bytes())}
}

func (is *issuer) ecJWK() map[string]any {
	pad := func(n *big.Int) string { b := make([]byte, 32); n.FillBytes(b); return b64(b) }
	return map[string]any{"kty": "EC", "alg": "ES256", "use": "sig", "kid": "ec-1", "crv": "P-256",
		"x": pad(is.ec.X), "y": pad(is.ec.Y)}
}

// sign returns a compact JWS of claims.
func (is *issuer) sign(claims map[string]any, alg string) string {
	kid := map[string]string{"RS256": "rsa-1", "ES256": "ec-1"}[alg]
	h, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT", "kid": kid})
	p, _ := json.Marshal(claims)
	signing := b64(h) + "." + b64(p)
	d := sha256.Sum256([]byte(signing))
	var sig []byte
	var err error
	switch alg {
	case "RS256":
		sig, err = rsa.SignPKCS1v15(rand.Reader, is.rsa, crypto.SHA256, d[:])
	case "ES256":
		var r, s *big.Int
		if r, s, err = ecdsa.Sign(rand.Reader, is.ec, d[:]); err == nil {
			sig = make([]byte, 64)
			r.FillBytes(sig[:32])
			s.FillBytes(sig[32:])
		}
	}
	if err != nil {
		panic(err) // crypto/rand failing: nothing a test can do
	}
	return signing + "." + b64(sig)
}

// Claims are a CI job's identity, as its OIDC token states it.
type Claims interface {
	// Identity is the certificate identity Fulcio gives the job
	// (--certificate-identity).
	Identity() string
	claims(iss, aud string) map[string]any
	alg() string
	provider() string
}

// Token returns an OIDC token for the job c, signed by the stack's issuer
// for the sigstore audience: what GitLab puts in SIGSTORE_ID_TOKEN.
func (s *Stack) Token(t testing.TB, c Claims) string {
	t.Helper()
	return s.oidc.sign(c.claims(s.oidc.url+"/"+c.provider(), Audience), c.alg())
}

// Issuer is the --certificate-oidc-issuer of c's certificates.
func (s *Stack) Issuer(c Claims) string { return s.oidc.url + "/" + c.provider() }

// GitHubActions returns what a GitHub Actions job granted `permissions:
// id-token: write` has in its environment, ACTIONS_ID_TOKEN_REQUEST_URL and
// ACTIONS_ID_TOKEN_REQUEST_TOKEN, for a job with claims c: the endpoint
// answers that bearer, and only it, with c's token.
func (s *Stack) GitHubActions(t testing.TB, c GitHubClaims) (requestURL, requestToken string) {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	tok := b64(b)
	s.oidc.mu.Lock()
	s.oidc.jobs[tok] = c
	s.oidc.mu.Unlock()
	// The runner's URL carries a query of its own: clients append
	// &audience=, they do not replace it.
	return s.oidc.url + "/github/token?api-version=2.0", tok
}

// TokenRequests is how many times the GitHub token endpoint answered.
func (s *Stack) TokenRequests() int {
	s.oidc.mu.Lock()
	defer s.oidc.mu.Unlock()
	return s.oidc.requests
}

// GitHubClaims are a GitHub Actions job's token claims; empty fields get
// a push to main of octo-org/octo-repo by .github/workflows/ci.yml.
type GitHubClaims struct {
	Repository     string // owner/name
	Ref            string // refs/heads/main
	SHA            string
	Workflow       string // the workflow's name
	WorkflowRef    string // owner/name/.github/workflows/ci.yml@refs/heads/main
	JobWorkflowRef string // the reusable workflow that runs the job; WorkflowRef when empty
	EventName      string // push, pull_request…
	RunID          string
}

func (c GitHubClaims) withDefaults() GitHubClaims {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.Repository, "octo-org/octo-repo")
	def(&c.Ref, "refs/heads/main")
	def(&c.SHA, strings.Repeat("a1b2c3d4", 5))
	def(&c.Workflow, "CI")
	def(&c.WorkflowRef, c.Repository+"/.github/workflows/ci.yml@"+c.Ref)
	def(&c.JobWorkflowRef, c.WorkflowRef)
	def(&c.EventName, "push")
	def(&c.RunID, "4242")
	return c
}

func (c GitHubClaims) owner() string {
	owner, _, _ := strings.Cut(c.withDefaults().Repository, "/")
	return owner
}

// Identity implements Claims: Fulcio's SAN for GitHub is the job
// workflow's URL.
func (c GitHubClaims) Identity() string {
	return "https://github.com/" + c.withDefaults().JobWorkflowRef
}

func (GitHubClaims) alg() string      { return "RS256" }
func (GitHubClaims) provider() string { return "github" }

func (c GitHubClaims) claims(iss, aud string) map[string]any {
	c = c.withDefaults()
	now := time.Now()
	return map[string]any{
		"iss": iss, "aud": aud, "sub": "repo:" + c.Repository + ":ref:" + c.Ref,
		"iat": now.Unix(), "nbf": now.Add(-time.Minute).Unix(), "exp": now.Add(10 * time.Minute).Unix(),
		"jti":        fmt.Sprintf("%x", now.UnixNano()),
		"repository": c.Repository, "repository_id": "1296269", "repository_owner": c.owner(), "repository_owner_id": "6543",
		"repository_visibility": "public", "ref": c.Ref, "ref_type": "branch", "sha": c.SHA,
		"workflow": c.Workflow, "workflow_ref": c.WorkflowRef, "workflow_sha": c.SHA,
		"job_workflow_ref": c.JobWorkflowRef, "job_workflow_sha": c.SHA, "event_name": c.EventName,
		"run_id": c.RunID, "run_number": "7", "run_attempt": "1", "actor": "octocat", "actor_id": "1",
		"runner_environment": "github-hosted", "base_ref": "", "head_ref": "", "environment": "",
	}
}

// GitLabClaims are a GitLab CI job's id_tokens claims; empty fields get a
// push pipeline on main of group/project.
type GitLabClaims struct {
	ProjectPath    string // group/project
	Ref            string // main (GitLab's ref has no refs/heads/)
	SHA            string
	PipelineSource string // push, merge_request_event…
	CIConfigRefURI string // gitlab.com/group/project//.gitlab-ci.yml@refs/heads/main
	JobID          string
}

func (c GitLabClaims) withDefaults() GitLabClaims {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.ProjectPath, "group/project")
	def(&c.Ref, "main")
	def(&c.SHA, strings.Repeat("e5f6a7b8", 5))
	def(&c.PipelineSource, "push")
	def(&c.CIConfigRefURI, "gitlab.com/"+c.ProjectPath+"//.gitlab-ci.yml@refs/heads/"+c.Ref)
	def(&c.JobID, "302")
	return c
}

// Identity implements Claims: Fulcio's SAN for GitLab is the pipeline
// definition's URL.
func (c GitLabClaims) Identity() string { return "https://" + c.withDefaults().CIConfigRefURI }

func (GitLabClaims) alg() string      { return "ES256" }
func (GitLabClaims) provider() string { return "gitlab" }

func (c GitLabClaims) claims(iss, aud string) map[string]any {
	c = c.withDefaults()
	now := time.Now()
	ns, _, _ := strings.Cut(c.ProjectPath, "/")
	return map[string]any{
		"iss": iss, "aud": aud, "sub": "project_path:" + c.ProjectPath + ":ref_type:branch:ref:" + c.Ref,
		"iat": now.Unix(), "nbf": now.Add(-time.Minute).Unix(), "exp": now.Add(10 * time.Minute).Unix(),
		"jti":          fmt.Sprintf("%x", now.UnixNano()),
		"namespace_id": "72", "namespace_path": ns, "project_id": "20", "project_path": c.ProjectPath,
		"user_id": "1", "user_login": "root", "pipeline_id": "574", "pipeline_source": c.PipelineSource,
		"job_id": c.JobID, "ref": c.Ref, "ref_type": "branch", "ref_path": "refs/heads/" + c.Ref, "ref_protected": "true",
		"sha": c.SHA, "ci_config_ref_uri": c.CIConfigRefURI, "ci_config_sha": c.SHA,
		"runner_id": 1, "runner_environment": "gitlab-hosted", "project_visibility": "public", "environment": "",
	}
}
