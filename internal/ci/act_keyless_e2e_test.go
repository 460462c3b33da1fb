//go:build e2e

package ci_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
)

// TestActionKeylessThroughAct (issue #37, done when): the root action's
// audit step, given no cosign-key, signs keyless with the job's OIDC
// identity: act passes a simulated ACTIONS_ID_TOKEN_REQUEST_URL/_TOKEN
// pointing at sigstoretest's issuer (what `permissions: id-token: write`
// gives a job), and the private Sigstore's signing config and trusted root
// come in as the signing-config and trusted-root inputs. The step summary
// names who signed (repository, workflow, ref, commit) and the command that
// verifies it, which, pasted, passes; the audit-verify step verifies the
// report by identity, and so does stock `cosign verify-blob` with the
// identity; a wrong identity is refused by both. The pull request's one
// report comment (the fake comments API of GITHUB_API_URL) holds the
// compare verdict and who signed, set in place by the audit step, kept by
// a compare report after it, never twice though the audit ran twice; the
// verify command in it, pasted, passes.
func TestActionKeylessThroughAct(t *testing.T) {
	k := startKeylessCI(t, "act")
	bin, sig := k.bin, k.sig
	gh := sigstoretest.GitHubClaims{Repository: "acme/train", Ref: "refs/pull/7/merge", SHA: strings.Repeat("0123abcd", 5)}
	reqURL, reqToken := sig.GitHubActions(t, gh)
	id, iss := gh.Identity(), sig.Issuer(gh)

	dir := actRepo(t, "act-keyless/keyless.yml")
	event := filepath.Join(t.TempDir(), "event.json")
	os.WriteFile(event, []byte(`{"pull_request":{"number":7,"head":{"sha":"`+gh.SHA+`"}},"repository":{"full_name":"acme/train","name":"train","owner":{"login":"acme"}}}`), 0o644)
	out := t.TempDir()
	const ghToken = "ghs-keyless-secret-77c1"
	srv := githubComments(ghToken)
	ts := httptest.NewServer(srv.handler())
	defer ts.Close()
	log, runErr := k.runAct(t, dir, "pull_request", out, reqURL, reqToken,
		"-e", event,
		"--env", "GITHUB_API_URL="+ts.URL+"/api/v3",
		"-s", "GITHUB_TOKEN="+ghToken,
		"--var", "SIGNER_IDENTITY="+id,
		"--var", "SIGNER_ISSUER="+iss)
	defer func() {
		if t.Failed() {
			t.Logf("act log:\n%s", log)
		}
	}()
	if runErr != nil {
		t.Fatalf("act: %v", runErr)
	}
	if sig.TokenRequests() == 0 {
		t.Errorf("the audit step never asked the job's token endpoint")
	}
	// The step summary (act echoes it as it reads it) says who signed
	// and how to verify it.
	for _, want := range []string{"Summary - ### gpupass audit", "signed with keyless", "| identity | `" + id + "` |",
		"| repository | `https://github.com/acme/train` |", "| ref | `refs/pull/7/merge` |", "| commit | `" + gh.SHA + "` |",
		"gpupass audit verify audit-report.zip --certificate-identity " + id + " --certificate-oidc-issuer " + iss + " --trusted-root " + sig.TrustedRoot} {
		if !strings.Contains(log, want) {
			t.Errorf("act log (the audit step's summary) lacks %q", want)
		}
	}
	if !strings.Contains(log, "verified audit-report.zip") {
		t.Errorf("the audit-verify step did not verify the report by identity")
	}
	if strings.Contains(log, reqToken) || strings.Contains(log, ghToken) {
		t.Errorf("the token endpoint's bearer or the GitHub token reached the act log")
	}

	// The pull request has one comment: the compare report, with who
	// signed set in it by the audit (once, though the step ran twice),
	// kept by the compare report after it; its verify command, pasted,
	// passes.
	thread := srv.thread()
	if len(thread) != 1 {
		t.Fatalf("%d comments on the pull request, want the one report comment: %+v", len(thread), thread)
	}
	c := thread[0]
	for _, want := range []string{"gpupass compare: consistent", "6%", "Signed by `" + id + "` (`" + iss + "`)", "repository `https://github.com/acme/train`", "ref `refs/pull/7/merge`", "commit `" + gh.SHA + "`"} {
		if !strings.Contains(c.Body, want) {
			t.Errorf("the report comment lacks %q:\n%s", want, c.Body)
		}
	}
	if n := strings.Count(c.Body, "<!-- gpupass:section "); n != 1 {
		t.Errorf("the report comment holds %d signed-by sections, want 1:\n%s", n, c.Body)
	}
	// created by compare, set by the first audit (the rerun changed only
	// the signing time, which the section does not show: no edit), then
	// edited by the second compare.
	if len(c.History) < 2 || strings.Contains(c.History[0], "Signed by") || !strings.Contains(c.History[len(c.History)-1], "Signed by") {
		t.Errorf("the comment's history is not report, then report with who signed: %q", c.History)
	}
	for _, s := range []string{ghToken, reqToken} {
		if strings.Contains(c.Body, s) {
			t.Errorf("a token reached the report comment")
		}
	}
	_, fromComment, ok := strings.Cut(c.Body, "```sh\n")
	fromComment, _, _ = strings.Cut(fromComment, "\n```")
	if !ok || !strings.HasPrefix(fromComment, "gpupass audit verify ") {
		t.Fatalf("no verify command in the report comment:\n%s", c.Body)
	}
	t.Logf("the report comment's verify command: %s", fromComment)
	if b, err := k.paste(fromComment, out); err != nil || !strings.Contains(b, "verified audit-report.zip") {
		t.Errorf("the report comment's verify command, pasted: %v\n%s", err, b)
	}

	zip := filepath.Join(out, "audit-report.zip")
	// The summary's command, pasted in the directory holding the zip.
	pasted := "gpupass audit verify audit-report.zip --certificate-identity " + id + " --certificate-oidc-issuer " + iss + " --trusted-root " + sig.TrustedRoot
	if b, err := k.paste(pasted, out); err != nil || !strings.Contains(b, "verified audit-report.zip") {
		t.Errorf("the summary's verify command, pasted: %v\n%s", err, b)
	}
	extract := filepath.Join(t.TempDir(), "x")
	if b, err := exec.Command(bin, "audit", "verify", zip, "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--trusted-root", sig.TrustedRoot, "--extract", extract).CombinedOutput(); err != nil {
		t.Fatalf("audit verify: %v\n%s", err, b)
	}
	if b, err := exec.Command(bin, "audit", "verify", zip, "--certificate-identity", id+"-other", "--certificate-oidc-issuer", iss, "--trusted-root", sig.TrustedRoot).CombinedOutput(); err == nil {
		t.Errorf("audit verify accepted a wrong identity:\n%s", b)
	}
	if o, err := k.cosignVerifyBlob(t, extract, id, iss); err != nil || !strings.Contains(o, "Verified OK") {
		t.Errorf("cosign verify-blob with the job's identity: %v\n%s", err, o)
	}
	if o, err := k.cosignVerifyBlob(t, extract, id+"-other", iss); err == nil {
		t.Errorf("cosign verify-blob accepted a wrong identity:\n%s", o)
	}
}
