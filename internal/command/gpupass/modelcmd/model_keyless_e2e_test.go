//go:build e2e

package modelcmd_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #37, keyless model provenance: a GitHub Actions job with no key
// (a simulated ACTIONS_ID_TOKEN_REQUEST_URL on the private Sigstore) runs
// `gpupass model push`, which signs the attestation keyless as `gpupass
// audit` does; the verify command it prints, pasted, passes and says who
// signed; stock `cosign verify-attestation --type <predicate>` with the
// identity, the issuer and the trusted root accepts it; and both refuse a
// wrong identity and a wrong issuer. On a registry with the referrers API
// and on one without it (the tag fallback).
func TestModelPushKeyless(t *testing.T) {
	cosign := testutil.Tool(t, "cosign")
	sig := sigstoretest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gh := sigstoretest.GitHubClaims{Repository: "ml-team/llm", Ref: "refs/heads/main", SHA: strings.Repeat("c0ffee12", 5)}
	ghURL, ghBearer := sig.GitHubActions(t, gh)
	id, iss := gh.Identity(), sig.Issuer(gh)
	job := []string{"GITHUB_ACTIONS=true", "GITLAB_CI=", "SIGSTORE_ID_TOKEN=", "ACTIONS_ID_TOKEN_REQUEST_URL=" + ghURL, "ACTIONS_ID_TOKEN_REQUEST_TOKEN=" + ghBearer, "GITHUB_SHA=" + gh.SHA}
	gp := func(env []string, args ...string) (stdout, all string, code int) {
		t.Helper()
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(append(cmd.Env, "GITHUB_ACTIONS=", "GITLAB_CI="), env...)
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout, stdout + stderr, code
	}

	if _, all, code := gp(nil, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2",
		"--name", "model-keyless", "--follow", "--", "sh", "-c", `echo "step 1 loss 0.5"; echo "step 2 loss 0.4"`); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, all)
	}
	runs, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil || len(runs.Msg.Runs) != 1 {
		t.Fatalf("runs: %v %v", runs, err)
	}
	run := runs.Msg.Runs[0]
	weights := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(weights, []byte("weights of a model trained on the declared environment"), 0o644); err != nil {
		t.Fatal(err)
	}

	withAPI := regtest.StartInProcessRegistry(t, true, nil)
	noAPI, _ := regtest.StartRegistryStorage(t)
	for _, reg := range []struct{ name, host string }{{"referrers API", withAPI}, {"tag fallback", noAPI}} {
		t.Run(reg.name, func(t *testing.T) {
			ref := reg.host + "/team/model:v1"
			// No --key: the job's identity signs, through the signing config.
			t0 := time.Now()
			text, all, code := gp(job, "model", "push", run.Id, ref, "--file", weights, "--plain-http",
				"--signing-config", sig.SigningConfig, "--trusted-root", sig.TrustedRoot)
			if code != 0 {
				t.Fatalf("model push: exit %d\n%s", code, all)
			}
			t.Logf("keyless model push in %v:\n%s", time.Since(t0).Round(time.Millisecond), text)
			if !strings.Contains(text, "signed keyless as "+id+" (OIDC issuer "+iss+")") {
				t.Errorf("model push does not say who signed (%s from %s):\n%s", id, iss, text)
			}
			var pasted string
			for _, l := range strings.Split(text, "\n") {
				if s := strings.TrimSpace(l); strings.HasPrefix(s, "gpupass model verify ") {
					pasted = s
				}
			}
			if !strings.Contains(pasted, "--certificate-identity") || strings.Contains(pasted, "--key") {
				t.Fatalf("push printed no keyless verify command:\n%s", text)
			}
			sh := exec.CommandContext(ctx, "sh", "-c", pasted)
			sh.Env = append(stack.Env, "PATH="+stack.Bin+":"+os.Getenv("PATH"))
			sh.Dir = stack.Root
			vout, verr, code := testutil.Run(t, sh)
			t.Logf("the pasted %q printed:\n%s", pasted, vout)
			if code != 0 || !strings.Contains(vout, "verified "+reg.host+"/team/model@sha256:") {
				t.Fatalf("the pasted verify: exit %d\n%s%s", code, vout, verr)
			}
			for _, want := range []string{"ok   signature    in-toto statement (DSSE) in ", "verified keyless: certificate for " + id + " from " + iss,
				"signed by " + id, "repository https://github.com/ml-team/llm", "workflow https://github.com/ml-team/llm/.github/workflows/ci.yml@refs/heads/main",
				"ref refs/heads/main", "commit " + gh.SHA, "ok   model", "run       " + run.Id} {
				if !strings.Contains(vout, want) {
					t.Errorf("verify output lacks %q", want)
				}
			}
			digestRef := pasted[len("gpupass model verify "):strings.Index(pasted, " --certificate-identity")]
			digestRef = strings.Trim(digestRef, "'")

			// Refused by gpupass: another identity, another issuer.
			for _, tc := range []struct{ name, id, iss string }{{"wrong identity", id + "-other", iss}, {"wrong issuer", id, sig.GitLabIssuer}} {
				jout, all, code := gp(nil, "model", "verify", digestRef, "--certificate-identity", tc.id, "--certificate-oidc-issuer", tc.iss,
					"--trusted-root", sig.TrustedRoot, "--plain-http", "-o", "json")
				var res model.Result
				if err := json.Unmarshal([]byte(jout), &res); err != nil {
					t.Fatalf("%s: model verify -o json printed non-JSON: %v\n%s", tc.name, err, all)
				}
				if code != 1 || res.OK || res.FailedLayer != model.LayerSignature || !strings.Contains(jout, "the certificate is for "+id+" from issuer "+iss) {
					t.Errorf("%s: gpupass model verify: exit %d, failed layer %q; want 1 at the signature layer naming who signed\n%s", tc.name, code, res.FailedLayer, all)
				} else {
					t.Logf("%s: gpupass model verify refuses: %s", tc.name, res.Layers[2].Problems[0].Message)
				}
			}

			// A key for a keyless attestation: refused, naming the flags.
			pub := filepath.Join(dir, "other.pub")
			if _, err := os.Stat(pub); err != nil {
				if _, all, code := gp(nil, "audit", "keygen", "--out-prefix", filepath.Join(dir, "other")); code != 0 {
					t.Fatalf("keygen: %s", all)
				}
			}
			if _, all, code := gp(nil, "model", "verify", digestRef, "--key", pub, "--plain-http"); code != 1 || !strings.Contains(all, "signed keyless") || !strings.Contains(all, "--certificate-identity") {
				t.Errorf("model verify --key of a keyless attestation: exit %d, want 1 naming --certificate-identity\n%s", code, all)
			}

			// Stock cosign: the same identity passes, the others not.
			cosignRun := func(id, iss string) (string, int) {
				cmd := exec.CommandContext(ctx, cosign, "verify-attestation", "--type", model.PredicateType,
					"--certificate-identity", id, "--certificate-oidc-issuer", iss, "--trusted-root", sig.TrustedRoot,
					"--new-bundle-format", "--use-signed-timestamps", "--allow-http-registry", digestRef)
				cmd.Env = append(os.Environ(), "TUF_ROOT="+filepath.Join(dir, "tuf"), "HOME="+dir, "SIGSTORE_NO_CACHE=true")
				out, errOut, code := testutil.Run(t, cmd)
				return out + errOut, code
			}
			if out, code := cosignRun(id, iss); code != 0 || !strings.Contains(out, "Verification for "+digestRef) {
				t.Errorf("cosign verify-attestation with the job's identity: exit %d\n%s", code, out)
			}
			for _, tc := range []struct{ name, id, iss string }{{"wrong identity", id + "-other", iss}, {"wrong issuer", id, sig.GitLabIssuer}} {
				out, code := cosignRun(tc.id, tc.iss)
				if code == 0 {
					t.Errorf("%s: cosign verify-attestation accepted it\n%s", tc.name, out)
				} else {
					t.Logf("%s: cosign verify-attestation refuses: %s", tc.name, lastLine(out))
				}
			}
		})
	}

	// A key still signs as before, and wins in a job with an identity.
	if _, all, code := gp(nil, "audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign")); code != 0 {
		t.Fatalf("keygen: %s", all)
	}
	out, all, code := gp(append(job, "COSIGN_PASSWORD="), "model", "push", run.Id, withAPI+"/team/keyed:v1", "--file", weights, "--plain-http", "--key", filepath.Join(dir, "cosign.key"), "-o", "json")
	var pushed struct {
		model.PushResult
		SignerIdentity string `json:"signer_identity"`
		Verify         string `json:"verify_command"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &pushed) != nil || pushed.SignerIdentity != "" || !strings.Contains(pushed.Verify, "--key ") {
		t.Fatalf("model push --key in a job with an identity: exit %d, want it signed with the key\n%s", code, all)
	}
	if vout, all, code := gp(nil, "model", "verify", pushed.Reference, "--key", filepath.Join(dir, "cosign.pub"), "--plain-http"); code != 0 || !strings.Contains(vout, "verified with the given key") {
		t.Errorf("model verify --key: exit %d\n%s", code, all)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
