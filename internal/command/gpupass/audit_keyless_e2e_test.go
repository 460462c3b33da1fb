//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/auditrun"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #37, done when: a private Sigstore (sigstoretest), a run on
// `gpupass up`, and `gpupass audit` signing keyless with no key, from a
// GitHub Actions job (the ACTIONS_ID_TOKEN_REQUEST_URL endpoint) and from a
// GitLab job (SIGSTORE_ID_TOKEN). `gpupass audit verify` and the stock
// cosign CLI both accept each report with the job's identity and issuer,
// and refuse a wrong identity, a wrong issuer and a changed byte; verify
// prints who signed (repository, workflow, ref, commit).
func TestE2EAuditKeyless(t *testing.T) {
	t.Parallel()
	cosign := testutil.Tool(t, "cosign")
	sig := sigstoretest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Env: []string{"PATH=" + upstack.BuildAll(t) + ":" + os.Getenv("PATH")}})
	dir := t.TempDir()
	// gpx runs gpupass with extra environment: what the CI job has.
	gpx := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(slices.Clone(cmd.Env), env...)
		return testutil.Run(t, cmd)
	}

	stdout, stderr, code := gp(t, ctx, stack, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2",
		"--name", "keyless", "--follow", "--", "sh", "-c", `echo "step 1 loss 0.5"; echo "step 2 loss 0.4"`)
	if code != 0 {
		t.Fatalf("train: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil || len(runs.Msg.Runs) != 1 {
		t.Fatalf("runs: %v %v", runs, err)
	}
	alloc := runs.Msg.Runs[0].Id
	ev, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: alloc}))
	if err != nil {
		t.Fatal(err)
	}
	agentPub := filepath.Join(dir, "agent.pub")
	if err := os.WriteFile(agentPub, ev.Msg.AgentPublicKeyPem, 0o644); err != nil {
		t.Fatal(err)
	}

	gh := sigstoretest.GitHubClaims{Repository: "ml-team/llm", Ref: "refs/heads/main", SHA: strings.Repeat("c0ffee12", 5)}
	ghURL, ghBearer := sig.GitHubActions(t, gh)
	gl := sigstoretest.GitLabClaims{ProjectPath: "ml-team/llm", Ref: "main", SHA: strings.Repeat("deadbeef", 5)}
	jobs := []struct {
		name   string
		env    []string
		claims sigstoretest.Claims
		// what verify's signer layer names
		want []string
	}{
		{"github", []string{"GITHUB_ACTIONS=true", "ACTIONS_ID_TOKEN_REQUEST_URL=" + ghURL, "ACTIONS_ID_TOKEN_REQUEST_TOKEN=" + ghBearer}, gh,
			[]string{"repository https://github.com/ml-team/llm", "workflow https://github.com/ml-team/llm/.github/workflows/ci.yml@refs/heads/main", "ref refs/heads/main", "commit " + gh.SHA}},
		{"gitlab", []string{"GITLAB_CI=true", "SIGSTORE_ID_TOKEN=" + sig.Token(t, gl)}, gl,
			[]string{"repository https://gitlab.com/ml-team/llm", "workflow https://gitlab.com/ml-team/llm//.gitlab-ci.yml@refs/heads/main", "ref refs/heads/main", "commit " + gl.SHA}},
	}
	// A key pair, to show that a key does not verify a keyless report.
	otherPub := filepath.Join(dir, "other")
	if _, errOut, code := gp(t, ctx, stack, "audit", "keygen", "--out-prefix", otherPub); code != 0 {
		t.Fatalf("keygen: %s", errOut)
	}
	emptyRoot := filepath.Join(dir, "empty-root.json")
	if err := os.WriteFile(emptyRoot, []byte(audit.MinimalTrustedRoot), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, job := range jobs {
		zipPath := filepath.Join(dir, job.name+".zip")
		id, iss := job.claims.Identity(), sig.Issuer(job.claims)
		// No key: the job's identity signs, through the signing config.
		auditArgs := []string{"audit", alloc, "--attest", "--out", zipPath, "--signing-config", sig.SigningConfig, "--trusted-root", sig.TrustedRoot}
		t0 := time.Now()
		var took time.Duration
		if job.name == "github" {
			stdout, stderr, code := gpx(job.env, append(auditArgs, "-o", "json")...)
			took = time.Since(t0)
			var res auditrun.Result
			if code != 0 || json.Unmarshal([]byte(stdout), &res) != nil || res.Signing != "keyless" || res.SignerIdentity != id || res.SignerIssuer != iss {
				t.Fatalf("%s: audit: exit %d, want it signed keyless by %s from %s\nstdout:\n%s\nstderr:\n%s", job.name, code, id, iss, stdout, stderr)
			}
		} else {
			// Text: the verify command it prints works pasted.
			stdout, stderr, code := gpx(job.env, auditArgs...)
			took = time.Since(t0)
			_, pasted, ok := strings.Cut(stdout, "; verify with:\n  ")
			if code != 0 || !strings.Contains(stdout, "signed keyless as "+id+" (OIDC issuer "+iss+")") || !ok {
				t.Fatalf("%s: audit: exit %d, want it signed keyless by %s from %s and the verify command\nstdout:\n%s\nstderr:\n%s", job.name, code, id, iss, stdout, stderr)
			}
			cmd := exec.CommandContext(ctx, "sh", "-c", strings.TrimSpace(pasted))
			cmd.Env, cmd.Dir = stack.Env, stack.Root
			if out, errOut, code := testutil.Run(t, cmd); code != 0 || !strings.Contains(out, "verified "+zipPath) {
				t.Errorf("%s: the printed verify command, pasted: exit %d\n%s\n%s\n%s", job.name, code, pasted, out, errOut)
			}
		}
		verify := func(args ...string) (string, string, int) {
			if !slices.Contains(args, "--key") && !slices.Contains(args, "--trusted-root") {
				args = append(args, "--trusted-root", sig.TrustedRoot)
			}
			return gp(t, ctx, stack, append([]string{"audit", "verify", "--agent-key", agentPub}, args...)...)
		}
		t.Logf("%s: keyless audit (certificate, 2 log entries, 2 timestamps) in %v", job.name, took.Round(time.Millisecond))
		extract := filepath.Join(dir, job.name)
		stdout, stderr, code = verify(zipPath, "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--extract", extract)
		t.Logf("%s: gpupass audit verify:\n%s", job.name, stdout)
		if code != 0 {
			t.Fatalf("%s: verify: exit %d\nstdout:\n%s\nstderr:\n%s", job.name, code, stdout, stderr)
		}
		for _, want := range append([]string{"ok   signature        cosign bundle over manifest.json verified keyless: certificate for " + id + " from " + iss,
			"ok   signer           ", "ok   manifest", "ok   attestation", "verified " + zipPath}, job.want...) {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s: verify output lacks %q:\n%s", job.name, want, stdout)
			}
		}
		// The same identity, as a regular expression over the repository.
		if stdout, stderr, code := verify(zipPath, "--certificate-identity-regexp", `^https://(github|gitlab)\.com/ml-team/llm/`, "--certificate-oidc-issuer", iss); code != 0 {
			t.Errorf("%s: verify --certificate-identity-regexp: exit %d\n%s\n%s", job.name, code, stdout, stderr)
		}

		// Refused: another identity, another issuer, a changed byte, and
		// a key where the report was signed keyless.
		tampered := filepath.Join(dir, job.name+"-tampered.zip")
		if err := os.WriteFile(tampered, testutil.RewriteZip(t, zipPath, audit.FileManifest, func(b []byte) []byte {
			c := bytes.Clone(b)
			c[len(c)/2] ^= 0x01
			return c
		}), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"wrong identity", []string{zipPath, "--certificate-identity", id + "-other", "--certificate-oidc-issuer", iss}, "the certificate is for " + id + " from issuer " + iss + ", not the identity given"},
			{"wrong issuer", []string{zipPath, "--certificate-identity", id, "--certificate-oidc-issuer", sig.GitHubIssuer + "-other"}, "the certificate is for " + id + " from issuer " + iss + ", not the identity given"},
			{"changed byte", []string{tampered, "--certificate-identity", id, "--certificate-oidc-issuer", iss}, "does not verify"},
			{"a key for a keyless report", []string{zipPath, "--key", otherPub + ".pub"}, "signed keyless"},
			// Another Sigstore's trusted root (here one with no CA at all).
			{"another trusted root", []string{zipPath, "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--trusted-root", emptyRoot}, "is the trusted root that of the Sigstore instance that signed it?"},
		} {
			stdout, stderr, code := verify(append(tc.args, "-o", "json")...)
			var vr audit.Result
			if err := json.Unmarshal([]byte(stdout), &vr); err != nil {
				t.Fatalf("%s %s: verify -o json printed non-JSON: %v\n%s\n%s", job.name, tc.name, err, stdout, stderr)
			}
			t.Logf("%s %s: %s", job.name, tc.name, vr.Layers[1].Problems)
			if code != gpupass.ExitFindings || vr.OK || vr.FailedLayer != audit.LayerSignature || !strings.Contains(stdout, tc.want) {
				t.Errorf("%s %s: exit %d, failed layer %q, want 1 at %s saying %q\n%s", job.name, tc.name, code, vr.FailedLayer, audit.LayerSignature, tc.want, stdout)
			}
		}

		// The stock cosign CLI, on the files the report holds.
		cosignRun := func(args ...string) (string, error) {
			cmd := exec.CommandContext(ctx, cosign, args...)
			cmd.Dir = extract
			cmd.Env = append(os.Environ(), "TUF_ROOT="+filepath.Join(dir, "tuf"), "HOME="+dir, "SIGSTORE_NO_CACHE=true")
			b, err := cmd.CombinedOutput()
			return string(b), err
		}
		if err := os.WriteFile(filepath.Join(extract, "tampered.json"), []byte(strings.Replace(mustRead(t, filepath.Join(extract, audit.FileManifest)), alloc, alloc[:len(alloc)-1]+"x", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		blob := func(id, iss, file string) (string, error) {
			return cosignRun("verify-blob", "--bundle", audit.FileManifestBundle, "--trusted-root", sig.TrustedRoot, "--use-signed-timestamps",
				"--certificate-identity", id, "--certificate-oidc-issuer", iss, file)
		}
		if out, err := blob(id, iss, audit.FileManifest); err != nil || !strings.Contains(out, "Verified OK") {
			t.Errorf("%s: cosign verify-blob: %v\n%s", job.name, err, out)
		}
		for name, args := range map[string][3]string{
			"wrong identity": {id + "-other", iss, audit.FileManifest},
			"wrong issuer":   {id, sig.GitHubIssuer + "-other", audit.FileManifest},
			"changed byte":   {id, iss, "tampered.json"},
		} {
			if out, err := blob(args[0], args[1], args[2]); err == nil {
				t.Errorf("%s: cosign verify-blob accepted a %s:\n%s", job.name, name, out)
			}
		}
		if out, err := cosignRun("verify-blob-attestation", "--bundle", audit.FileAttestation, "--new-bundle-format", "--trusted-root", sig.TrustedRoot,
			"--use-signed-timestamps", "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--type", audit.PredicateType, audit.FileManifest); err != nil || !strings.Contains(out, "Verified OK") {
			t.Errorf("%s: cosign verify-blob-attestation: %v\n%s", job.name, err, out)
		}
	}
	// The CI step (-o github, what the Action runs) signs keyless too
	// when it is given no key, and hands on the zip.
	ghOut := filepath.Join(dir, "github-output")
	ciZip := filepath.Join(dir, "ci.zip")
	stdout, stderr, code = gpx(append(jobs[0].env, "GITHUB_OUTPUT="+ghOut, "GPUPASS_ALLOCATION="+alloc, "GPUPASS_OUT="+ciZip,
		"GPUPASS_SIGNING_CONFIG="+sig.SigningConfig), "-o", "github", "audit")
	if code != 0 || !strings.Contains(mustRead(t, ghOut), ciZip) {
		t.Fatalf("-o github audit with the job's identity: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if stdout, stderr, code := gp(t, ctx, stack, "audit", "verify", ciZip, "--trusted-root", sig.TrustedRoot,
		"--certificate-identity", gh.Identity(), "--certificate-oidc-issuer", sig.GitHubIssuer); code != 0 {
		t.Errorf("verify of the CI step's zip: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if n := sig.TokenRequests(); n != 2 {
		t.Errorf("the GitHub token endpoint answered %d times, want twice (the github job, the CI step)", n)
	}

	// A GitHub job without `permissions: id-token: write` has no token
	// endpoint: audit says what to add, and writes nothing.
	zipPath := filepath.Join(dir, "none.zip")
	stdout, stderr, code = gpx([]string{"GITHUB_ACTIONS=true"}, "audit", alloc, "--out", zipPath, "--signing-config", sig.SigningConfig)
	if code == 0 || !strings.Contains(stderr, "permissions: id-token: write") {
		t.Errorf("audit in a GitHub job with no identity: exit %d, want it to name id-token: write\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if _, err := os.Stat(zipPath); err == nil {
		t.Error("audit with nothing to sign with wrote a zip")
	}
	// A request token the endpoint refuses: the HTTP status and the
	// permission to check, never the token.
	const badBearer = "not-the-runtime-token"
	stdout, stderr, code = gpx([]string{"GITHUB_ACTIONS=true", "ACTIONS_ID_TOKEN_REQUEST_URL=" + ghURL, "ACTIONS_ID_TOKEN_REQUEST_TOKEN=" + badBearer},
		"audit", alloc, "--out", zipPath, "--signing-config", sig.SigningConfig)
	if code == 0 || !strings.Contains(stderr, "HTTP 401 (does the job have `permissions: id-token: write`?)") || strings.Contains(stdout+stderr, badBearer) {
		t.Errorf("audit with a refused request token: exit %d, want the 401 and the permission named, the token not\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
