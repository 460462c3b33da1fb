//go:build e2e

package modelcmd_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #37, the model-ref input of the train and audit steps, run as the
// Action and the GitLab components run them (-o github|gitlab, configured
// by GPUPASS_* variables): a GitHub job with no key runs `train
// --model-ref` on a `gpupass up` stack, which, once the run (which
// checkpoints) ended, pushes its model signed keyless; the step output
// model-digest-ref names it, and the verify command of the job summary,
// pasted, passes. A GitLab job runs `audit --model-ref` signed keyless with
// SIGSTORE_ID_TOKEN: GPUPASS_MODEL_DIGEST_REF lands in the dotenv file and
// the attestation names the audit zip just written. A push that fails
// fails the step, and the registry password is never printed.
func TestModelRefSteps(t *testing.T) {
	sig := sigstoretest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	dir := t.TempDir()
	reg := regtest.StartInProcessRegistry(t, true, nil)
	gh := sigstoretest.GitHubClaims{Repository: "ml-team/llm", Ref: "refs/heads/main", SHA: strings.Repeat("c0ffee12", 5)}
	ghURL, ghBearer := sig.GitHubActions(t, gh)
	output, summary := filepath.Join(dir, "github_output"), filepath.Join(dir, "step_summary")
	// What the Action's step sets: its inputs as GPUPASS_* variables.
	step := []string{"GPUPASS_BROKER_URL=" + cfg.BrokerURL, "GPUPASS_BROKER_TOKEN=" + cfg.Token, "GPUPASS_PLAIN_HTTP=true", "GPUPASS_SIGNING_CONFIG=" + sig.SigningConfig, "GPUPASS_TRUSTED_ROOT=" + sig.TrustedRoot}
	github := append([]string{"GITHUB_ACTIONS=true", "GITLAB_CI=", "SIGSTORE_ID_TOKEN=", "ACTIONS_ID_TOKEN_REQUEST_URL=" + ghURL, "ACTIONS_ID_TOKEN_REQUEST_TOKEN=" + ghBearer,
		"GITHUB_SHA=" + gh.SHA, "GITHUB_OUTPUT=" + output, "GITHUB_STEP_SUMMARY=" + summary}, step...)
	gp := func(env []string, args ...string) (stdout, all string, code int) {
		t.Helper()
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(append(cmd.Env, "GITHUB_ACTIONS=", "GITLAB_CI="), env...)
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout, stdout + stderr, code
	}
	paste := func(t *testing.T, command string) string {
		t.Helper()
		sh := exec.CommandContext(ctx, "sh", "-c", command)
		sh.Env = append(stack.Env, "PATH="+stack.Bin+":"+os.Getenv("PATH"))
		sh.Dir = stack.Root
		out, errOut, code := testutil.Run(t, sh)
		if code != 0 {
			t.Fatalf("the pasted %q: exit %d\n%s%s", command, code, out, errOut)
		}
		return out
	}

	// The train step: wait true, model-ref set; the run writes a checkpoint.
	ref := reg + "/team/model:train"
	_, all, code := gp(append(github, "GPUPASS_MODEL_REF="+ref, "GPUPASS_FOLLOW=true", "GPUPASS_RESUME_ELSEWHERE=true"),
		"-o", "github", "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", "model-ref",
		"--", "sh", "-c", `echo "step 1 loss 0.5"; printf 'weights' > "$GPUPASS_CHECKPOINT_DIR/ckpt-00000001.pt"; echo "step 2 loss 0.4"`)
	if code != 0 {
		t.Fatalf("train step with model-ref: exit %d\n%s", code, all)
	}
	nestedGroups(t, all)
	outs, _ := os.ReadFile(output)
	m := regexp.MustCompile(`(?m)^model-digest-ref<<(\S+)\n(.*)\n`).FindStringSubmatch(string(outs))
	if m == nil || !strings.HasPrefix(m[2], reg+"/team/model@sha256:") {
		t.Fatalf("GITHUB_OUTPUT has no model-digest-ref of %s:\n%s\n%s", reg, outs, all)
	}
	digestRef := m[2]
	sum, _ := os.ReadFile(summary)
	cmdLine := regexp.MustCompile("(?m)^gpupass model verify .*$").FindString(string(sum))
	t.Logf("train step's summary:\n%s", sum)
	for _, want := range []string{"### gpupass model push", digestRef, "signed keyless by | `" + gh.Identity() + "`", "--certificate-identity"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("the summary lacks %q", want)
		}
	}
	if !strings.Contains(cmdLine, digestRef) {
		t.Fatalf("the summary's verify command %q does not name %s", cmdLine, digestRef)
	}
	vout := paste(t, cmdLine)
	if !strings.Contains(vout, "verified "+digestRef) || !strings.Contains(vout, "ckpt-00000001.pt") {
		t.Errorf("the pasted verify command:\n%s", vout)
	}

	// The audit step on GitLab, keyless with SIGSTORE_ID_TOKEN.
	runID := regexp.MustCompile(`run       (alloc-\S+)`).FindStringSubmatch(vout)
	if runID == nil {
		t.Fatalf("verify names no run:\n%s", vout)
	}
	gl := sigstoretest.GitLabClaims{}
	dotenv := filepath.Join(dir, "gpupass.env")
	gitlab := append([]string{"GITLAB_CI=true", "GITHUB_ACTIONS=", "SIGSTORE_ID_TOKEN=" + sig.Token(t, gl), "GPUPASS_DOTENV=" + dotenv, "CI_COMMIT_SHA=" + gh.SHA}, step...)
	zip := filepath.Join(dir, "audit-report.zip")
	aref := reg + "/team/model:audit"
	out, all, code := gp(append(gitlab, "GPUPASS_ALLOCATION="+runID[1], "GPUPASS_OUT="+zip, "GPUPASS_MODEL_REF="+aref), "-o", "gitlab", "audit")
	if code != 0 {
		t.Fatalf("audit step with model-ref: exit %d\n%s", code, all)
	}
	env, _ := os.ReadFile(dotenv)
	dm := regexp.MustCompile(`(?m)^GPUPASS_MODEL_DIGEST_REF=(\S+)$`).FindStringSubmatch(string(env))
	if dm == nil || !strings.HasPrefix(dm[1], reg+"/team/model@sha256:") || !strings.Contains(string(env), "GPUPASS_AUDIT_PATH="+zip) {
		t.Fatalf("dotenv lacks GPUPASS_MODEL_DIGEST_REF (and the audit path):\n%s\n%s", env, all)
	}
	cmdLine = regexp.MustCompile("(?m)^  (gpupass model verify .*)$").FindStringSubmatch(out)[1]
	vout = paste(t, cmdLine)
	if !strings.Contains(vout, "verified "+dm[1]) || !strings.Contains(vout, "audit     audit-report.zip, sha256:") || !strings.Contains(vout, "signed by "+gl.Identity()) {
		t.Errorf("the pasted verify command of the audit step:\n%s", vout)
	}

	// A push that fails fails the step, and names no password.
	_, all, code = gp(append(github, "GPUPASS_ALLOCATION="+runID[1], "GPUPASS_OUT="+filepath.Join(dir, "again.zip"), "GPUPASS_MODEL_REF=127.0.0.1:1/team/model:x",
		"GPUPASS_REGISTRY_USERNAME=u", "GPUPASS_REGISTRY_PASSWORD=hunter2-registry-secret"), "-o", "github", "audit")
	if code == 0 || !strings.Contains(all, "127.0.0.1:1") {
		t.Errorf("audit step whose push fails: exit %d, want it failed naming the registry\n%s", code, all)
	}
	nestedGroups(t, all)
	// Only the runner's mask command may carry it.
	for _, l := range strings.Split(all, "\n") {
		if strings.Contains(l, "hunter2-registry-secret") && l != "::add-mask::hunter2-registry-secret" {
			t.Errorf("the registry password was printed: %s", l)
		}
	}
	// A detached train step cannot push: refused before submitting.
	if _, all, code := gp(append(github, "GPUPASS_MODEL_REF="+ref, "GPUPASS_FOLLOW=false"), "-o", "github", "train", "--spec", "examples/train/gpupass.yaml",
		"--region", "us-west-2", "--", "true"); code != 2 || !strings.Contains(all, "the model-ref input") || !strings.Contains(all, "wait input") {
		t.Errorf("detached train step with model-ref: exit %d, want 2 naming the inputs\n%s", code, all)
	}
}

// nestedGroups fails when a log group opens inside another: GitHub's
// runner does not nest them, so the push's group must follow the step's.
func nestedGroups(t *testing.T, log string) {
	t.Helper()
	open := ""
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.HasPrefix(l, "::group::"):
			if open != "" {
				t.Errorf("log group %q opens inside %q", l, open)
			}
			open = l
		case l == "::endgroup::":
			open = ""
		}
	}
}
