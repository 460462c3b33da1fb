//go:build e2e

package ci_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
)

// TestGitLabComponentKeyless (issue #37, done when): the audit component,
// with no COSIGN_KEY variable in the project, signs keyless with the job's
// SIGSTORE_ID_TOKEN (the token its id_tokens declares; here one from
// sigstoretest's issuer, handed in as gitlab-ci-local's variable) on the
// private Sigstore, whose signing config and trusted root come in as the
// component's signing-config and trusted-root inputs. The job log names who
// signed and the command that verifies it, which, pasted, passes; stock
// `cosign verify-blob` accepts the identity and refuses another. The merge
// request's one report note (the fake notes API of CI_API_V4_URL) holds
// the compare verdict and who signed, set in place by the audit job,
// replaced by its rerun, kept by a compare report after it; the verify
// command in it, pasted, passes.
func TestGitLabComponentKeyless(t *testing.T) {
	k := startKeylessCI(t, "gitlab-ci-local")
	bin, sig := k.bin, k.sig
	lookPath(t, k.path, "rsync")
	gl := sigstoretest.GitLabClaims{ProjectPath: "acme/train", Ref: "main", SHA: strings.Repeat("feedc0de", 5)}
	token := sig.Token(t, gl)
	id, iss := gl.Identity(), sig.Issuer(gl)

	dir := gitRepo(t, "components/gitlab", "git@gitlab.invalid:gpupass/components.git")
	run, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "internal", "audit", "testdata", "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The compare report's MR note first, then the audit adds who signed
	// to it, twice (a rerun replaces it), then the report again (it keeps
	// it): each in a stage of its own, so that each edits what the one
	// before left.
	pipeline := `include:
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/compare-report@$CI_COMMIT_SHA
    inputs:
      job-name: compare
      stage: build
      runs: us=testdata/us.jsonl eu=testdata/eu.jsonl
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/audit@$CI_COMMIT_SHA
    inputs:
      stage: test
      run-file: run.json
      signing-config: $SIGSTORE_SIGNING_CONFIG
      trusted-root: $SIGSTORE_TRUSTED_ROOT
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/audit@$CI_COMMIT_SHA
    inputs:
      job-name: audit-again
      stage: deploy
      run-file: run.json
      audit-path: audit-again.zip
      signing-config: $SIGSTORE_SIGNING_CONFIG
      trusted-root: $SIGSTORE_TRUSTED_ROOT
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/compare-report@$CI_COMMIT_SHA
    inputs:
      job-name: compare-again
      stage: .post
      runs: us=testdata/us.jsonl eu=testdata/eu.jsonl
      tolerance: 6%
`
	const glToken = "glpat-keyless-secret-3e9a"
	srv := gitlabNotes(glToken)
	ts := httptest.NewServer(srv.handler())
	defer ts.Close()
	commitFiles(t, dir, "keyless audit", map[string][]byte{".gitlab-ci.yml": []byte(pipeline), "run.json": run})
	log, runErr := k.runGitLabCI(dir, token,
		"CI_API_V4_URL="+ts.URL+"/api/v4",
		"CI_MERGE_REQUEST_IID=3",
		"CI_MERGE_REQUEST_PROJECT_ID=42",
		"GPUPASS_GITLAB_TOKEN="+glToken)
	defer func() {
		if t.Failed() {
			t.Logf("pipeline log:\n%s", log)
		}
	}()
	if runErr != nil {
		t.Fatalf("gitlab-ci-local: %v", runErr)
	}
	jobLog, _ := os.ReadFile(filepath.Join(dir, ".gitlab-ci-local", "output", "gpupass-audit.log"))
	_, pasted, ok := strings.Cut(string(jobLog), "signed keyless as "+id+" (OIDC issuer "+iss+"); verify with:\n")
	for _, job := range []string{"compare", "audit-again", "compare-again"} {
		if !strings.Contains(log, "PASS  "+job) {
			t.Errorf("job %s did not pass", job)
		}
	}
	if !strings.Contains(log, "PASS  gpupass-audit") || !ok {
		t.Fatalf("the audit job did not sign keyless as %s from %s:\n%s", id, iss, jobLog)
	}
	pasted, _, _ = strings.Cut(strings.TrimSpace(pasted), "\n")
	t.Logf("the job log's verify command: %s", pasted)
	if strings.Contains(log, token) || strings.Contains(string(jobLog), token) || strings.Contains(log, glToken) {
		t.Errorf("the OIDC token reached the log")
	}

	// The merge request has one note: the compare report, with who signed
	// set in it once (the rerun wrote the zip elsewhere: its section
	// replaced the first), kept by the report after; its verify command,
	// pasted where the rerun's artifacts are, passes.
	thread := srv.thread()
	if len(thread) != 1 {
		t.Fatalf("%d notes on the merge request, want the one report note: %+v", len(thread), thread)
	}
	note := thread[0]
	for _, want := range []string{"gpupass compare: consistent", "6%", "Signed by `" + id + "` (`" + iss + "`)", "commit `" + gl.SHA + "`", "audit-again.zip"} {
		if !strings.Contains(note.Body, want) {
			t.Errorf("the report note lacks %q:\n%s", want, note.Body)
		}
	}
	if n := strings.Count(note.Body, "<!-- gpupass:section "); n != 1 {
		t.Errorf("the report note holds %d signed-by sections, want 1:\n%s", n, note.Body)
	}
	if len(note.History) != 3 || strings.Contains(note.History[0], "Signed by") || !strings.Contains(note.History[1], "Signed by") {
		t.Errorf("the note's history is not report, report with who signed (twice), then the report again: %q", note.History)
	}
	if strings.Contains(note.Body, glToken) || strings.Contains(note.Body, token) {
		t.Errorf("a token reached the report note")
	}
	_, fromNote, ok := strings.Cut(note.Body, "```sh\n")
	fromNote, _, _ = strings.Cut(fromNote, "\n```")
	if !ok || !strings.HasPrefix(fromNote, "gpupass audit verify ") {
		t.Fatalf("no verify command in the report note:\n%s", note.Body)
	}
	t.Logf("the report note's verify command: %s", fromNote)
	if b, err := k.paste(fromNote, filepath.Join(dir, ".gitlab-ci-local", "artifacts", "audit-again")); err != nil || !strings.Contains(b, "verified audit-again.zip") {
		t.Errorf("the report note's verify command, pasted: %v\n%s", err, b)
	}

	art := filepath.Join(dir, ".gitlab-ci-local", "artifacts", "gpupass-audit")
	if b, err := k.paste(pasted, art); err != nil || !strings.Contains(b, "verified audit-report.zip") {
		t.Errorf("the job log's verify command, pasted: %v\n%s", err, b)
	}
	zip := filepath.Join(art, "audit-report.zip")
	extract := filepath.Join(t.TempDir(), "x")
	if b, err := exec.Command(bin, "audit", "verify", zip, "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--trusted-root", sig.TrustedRoot, "--extract", extract).CombinedOutput(); err != nil {
		t.Fatalf("audit verify: %v\n%s", err, b)
	}
	if b, err := exec.Command(bin, "audit", "verify", zip, "--certificate-identity", id, "--certificate-oidc-issuer", sig.GitHubIssuer, "--trusted-root", sig.TrustedRoot).CombinedOutput(); err == nil {
		t.Errorf("audit verify accepted a wrong issuer:\n%s", b)
	}
	if o, err := k.cosignVerifyBlob(t, extract, id, iss); err != nil || !strings.Contains(o, "Verified OK") {
		t.Errorf("cosign verify-blob with the job's identity: %v\n%s", err, o)
	}
	if o, err := k.cosignVerifyBlob(t, extract, id, sig.GitHubIssuer); err == nil {
		t.Errorf("cosign verify-blob accepted a wrong issuer:\n%s", o)
	}
}
