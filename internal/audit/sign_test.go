package audit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	gh := map[string]string{GitHubTokenURLEnv: "http://127.0.0.1/token?x=1", GitHubTokenTokenEnv: "runtime-token"}
	gl := map[string]string{TokenEnv: "eyJ.gitlab"}
	tests := []struct {
		name    string
		cfg     SignConfig
		env     map[string]string
		want    Decision
		wantErr string
	}{
		{"key signs offline", SignConfig{KeyRef: "cosign.key"}, nil, Decision{Mode: ModeKey, Offline: true}, ""},
		{"key wins over a CI token", SignConfig{KeyRef: "cosign.key"}, gl, Decision{Mode: ModeKey, Offline: true}, ""},
		{"key with tlog upload is online", SignConfig{KeyRef: "env://K", TlogUpload: true}, nil, Decision{Mode: ModeKey}, ""},
		{"gitlab token selects keyless", SignConfig{}, gl, Decision{Mode: ModeKeyless, TokenSource: TokenEnv}, ""},
		{"github id-token selects keyless", SignConfig{}, gh, Decision{Mode: ModeKeyless, TokenSource: "github-actions"}, ""},
		{"explicit keyless on github", SignConfig{Keyless: true}, gh, Decision{Mode: ModeKeyless, TokenSource: "github-actions"}, ""},
		{"github without the request token", SignConfig{}, map[string]string{GitHubTokenURLEnv: "http://127.0.0.1/t"}, Decision{}, "signing key is required"},
		{"keyless without a token", SignConfig{Keyless: true}, nil, Decision{}, "id-token: write"},
		{"nothing to sign with", SignConfig{}, nil, Decision{}, "gpupass audit keygen"},
		{"key and keyless", SignConfig{KeyRef: "k", Keyless: true}, gl, Decision{}, "exclude each other"},
		{"key and an identity token", SignConfig{KeyRef: "k", IDToken: "eyJ"}, nil, Decision{}, "exclude each other"},
		{"an identity token wins over the CI's", SignConfig{IDToken: "eyJ.given"}, gh, Decision{Mode: ModeKeyless, TokenSource: TokenSourceFlag}, ""},
		{"github job without id-token: write", SignConfig{}, map[string]string{"GITHUB_ACTIONS": "true"}, Decision{}, "grant the job `permissions: id-token: write`"},
		{"gitlab job without id_tokens", SignConfig{}, map[string]string{"GITLAB_CI": "true"}, Decision{}, "signing key is required, or an OIDC identity to sign keyless: this GitLab job has none (SIGSTORE_ID_TOKEN is unset): declare `id_tokens: SIGSTORE_ID_TOKEN: aud: sigstore` in the job"},
		{"explicit keyless in a github job without id-token: write", SignConfig{Keyless: true}, map[string]string{"GITHUB_ACTIONS": "true"}, Decision{}, "keyless signing: needs an OIDC identity: this GitHub Actions job has none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decide(tc.cfg, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestGitHubIDToken talks to a loopback server that answers like the
// Actions token endpoint.
func TestGitHubIDToken(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer runtime-token" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("audience") != "sigstore" || r.URL.Query().Get("api-version") != "2.0" {
			http.Error(w, "bad query "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		w.Write([]byte(`{"value":"eyJ.github.token"}`))
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		name    string
		bearer  string
		want    string
		wantErr string
	}{
		{"ok", "runtime-token", "eyJ.github.token", ""},
		{"refused", "other", "", "HTTP 401"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{GitHubTokenURLEnv: srv.URL + "/token?api-version=2.0", GitHubTokenTokenEnv: tc.bearer}
			getenv := func(k string) string { return env[k] }
			d, err := Decide(SignConfig{}, getenv)
			if err != nil {
				t.Fatal(err)
			}
			got, err := IDToken(context.Background(), d, SignConfig{}, getenv, srv.Client())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), tc.bearer) {
					t.Errorf("error leaks the request token: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("token %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
