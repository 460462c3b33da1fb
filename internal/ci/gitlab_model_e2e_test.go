//go:build e2e

package ci_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestGitLabComponentModelRef (issue #37, the model-ref input): the train
// component (one region, a run that writes and ships a checkpoint) and the
// audit component, each given model-ref and no COSIGN_KEY, run through
// gitlab-ci-local against a `gpupass up` stack and a loopback registry;
// each pushes the run's model signed keyless with the job's
// SIGSTORE_ID_TOKEN on the private Sigstore. GPUPASS_MODEL_DIGEST_REF is in
// each job's dotenv report, and the verify command each job log prints,
// pasted, passes; the audited push names the audit zip. The train job's
// model-ref is written with a CI/CD variable, which GitLab expands.
func TestGitLabComponentModelRef(t *testing.T) {
	k := startKeylessCI(t, "gitlab-ci-local")
	sig := k.sig
	lookPath(t, k.path, "rsync")
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	reg := regtest.StartInProcessRegistry(t, true, nil)
	gl := sigstoretest.GitLabClaims{ProjectPath: "acme/train", Ref: "main", SHA: strings.Repeat("feedc0de", 5)}
	token := sig.Token(t, gl)
	id, iss := gl.Identity(), sig.Issuer(gl)

	dir := gitRepo(t, "components/gitlab", "git@gitlab.invalid:gpupass/components.git")
	spec, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pipeline := `include:
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/train@$CI_COMMIT_SHA
    inputs:
      region: us-west-2
      workdir: wd
      command: sh write.sh
      signing-config: $SIGSTORE_SIGNING_CONFIG
      trusted-root: $SIGSTORE_TRUSTED_ROOT
      model-ref: $MODEL_REGISTRY/team/model:train
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/audit@$CI_COMMIT_SHA
    inputs:
      allocation: $GPUPASS_ALLOCATION_US_WEST_2
      signing-config: $SIGSTORE_SIGNING_CONFIG
      trusted-root: $SIGSTORE_TRUSTED_ROOT
      model-ref: ` + reg + `/team/model:audited
`
	commitFiles(t, dir, "model-ref", map[string][]byte{".gitlab-ci.yml": []byte(pipeline), "gpupass.yaml": spec,
		"wd/write.sh": []byte("echo 'step 1 loss 0.5'\nprintf weights > \"$GPUPASS_CHECKPOINT_DIR/ckpt-00000001.pt\"\n")})
	log, runErr := k.runGitLabCI(dir, token,
		"GPUPASS_BROKER_URL="+cfg.BrokerURL,
		"GPUPASS_BROKER_TOKEN="+cfg.Token,
		"GPUPASS_RESUME_ELSEWHERE=true",
		"GPUPASS_PLAIN_HTTP=true",
		// model-ref names a CI/CD variable in one job, as a user writes
		// $CI_REGISTRY_IMAGE/model:$CI_COMMIT_SHORT_SHA.
		"MODEL_REGISTRY="+reg)
	defer func() {
		if t.Failed() {
			t.Logf("pipeline log:\n%s", upstack.Tail(log, 20000))
		}
	}()
	if runErr != nil {
		t.Fatalf("gitlab-ci-local: %v", runErr)
	}
	for _, job := range []struct{ name, dotenv string }{{"gpupass-train-us-west-2", "gpupass-train-us-west-2.env"}, {"gpupass-audit", "gpupass.env"}} {
		env, err := os.ReadFile(filepath.Join(dir, ".gitlab-ci-local", "artifacts", job.name, ".gitlab-ci-reports", "dotenv", job.dotenv))
		m := regexp.MustCompile(`(?m)^GPUPASS_MODEL_DIGEST_REF=(\S+)$`).FindStringSubmatch(string(env))
		if err != nil || m == nil || !strings.HasPrefix(m[1], reg+"/team/model@sha256:") {
			t.Fatalf("the %s job's dotenv report has no GPUPASS_MODEL_DIGEST_REF of %s (%v):\n%s", job.name, reg, err, env)
		}
		jobLog, _ := os.ReadFile(filepath.Join(dir, ".gitlab-ci-local", "output", job.name+".log"))
		if !strings.Contains(string(jobLog), "signed keyless as "+id+" (OIDC issuer "+iss+")") {
			t.Errorf("the %s job log does not say who signed the model:\n%s", job.name, jobLog)
		}
		pasted := regexp.MustCompile(`gpupass model verify ` + regexp.QuoteMeta(m[1]) + ` .*--plain-http`).FindString(string(jobLog))
		if pasted == "" {
			t.Fatalf("the %s job log has no verify command for %s:\n%s", job.name, m[1], jobLog)
		}
		vb, err := k.paste(pasted, "")
		t.Logf("the %s job's verify command %q, pasted:\n%s", job.name, pasted, vb)
		if err != nil || !strings.Contains(vb, "verified "+m[1]) || !strings.Contains(vb, "signed by "+id) {
			t.Errorf("the %s job's verify command, pasted: %v", job.name, err)
		}
		if job.name == "gpupass-audit" && !strings.Contains(vb, "audit     audit-report.zip, sha256:") {
			t.Errorf("the audit job's model names no audit zip")
		}
	}
}
