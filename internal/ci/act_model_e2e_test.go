//go:build e2e

package ci_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestActionModelRefThroughAct (issue #37, the model-ref input): the root
// action's train step (wait true, one region, a run that writes and ships
// a checkpoint) and audit step, each given model-ref and no cosign-key,
// run through act on the host against a `gpupass up` stack and a loopback
// registry; each pushes the run's model signed keyless with the job's
// OIDC identity on the private Sigstore. The model-digest-ref outputs name
// the pushes, the step summaries (act echoes them) name who signed and the
// verify command, which, pasted, passes; the audited push's attestation
// names the audit zip.
func TestActionModelRefThroughAct(t *testing.T) {
	k := startKeylessCI(t, "act")
	sig := k.sig
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	reg := regtest.StartInProcessRegistry(t, true, nil)
	gh := sigstoretest.GitHubClaims{Repository: "acme/train", Ref: "refs/heads/main", SHA: strings.Repeat("0123abcd", 5)}
	reqURL, reqToken := sig.GitHubActions(t, gh)
	id, iss := gh.Identity(), sig.Issuer(gh)

	dir := actRepo(t, "act-model/model.yml")
	out := t.TempDir()
	log, runErr := k.runAct(t, dir, "push", out, reqURL, reqToken,
		"--var", "BROKER_URL="+cfg.BrokerURL,
		"--var", "BROKER_TOKEN="+cfg.Token,
		"--var", "REGISTRY="+reg)
	defer func() {
		if t.Failed() {
			t.Logf("act log:\n%s", upstack.Tail(log, 20000))
		}
	}()
	if runErr != nil {
		t.Fatalf("act: %v", runErr)
	}
	if strings.Contains(log, reqToken) {
		t.Errorf("the token endpoint's bearer reached the act log")
	}
	for _, step := range []struct{ name, tag string }{{"train", "train"}, {"audit", "audited"}} {
		b, err := os.ReadFile(filepath.Join(out, step.name+"-model"))
		digestRef := strings.TrimSpace(string(b))
		if err != nil || !strings.HasPrefix(digestRef, reg+"/team/model@sha256:") {
			t.Fatalf("the %s step's model-digest-ref output is %q (%v), want %s/team/model@sha256:…", step.name, digestRef, err, reg)
		}
		// The summary's verify command, as act echoes the summary.
		m := regexp.MustCompile(`gpupass model verify ` + regexp.QuoteMeta(digestRef) + ` [^\n` + "`" + `]*--plain-http`).FindString(log)
		if m == "" || !strings.Contains(m, "--certificate-identity "+id+" --certificate-oidc-issuer "+iss) {
			t.Fatalf("the %s step's summary has no keyless verify command for %s", step.name, digestRef)
		}
		if !strings.Contains(log, "| signed keyless by | `"+id+"` |") {
			t.Errorf("the %s step's summary does not say who signed", step.name)
		}
		vb, err := k.paste(m, out)
		t.Logf("the %s step's summary command %q, pasted:\n%s", step.name, m, vb)
		if err != nil || !strings.Contains(vb, "verified "+digestRef) || !strings.Contains(vb, "ckpt-00000001.pt") {
			t.Errorf("the %s step's verify command, pasted: %v", step.name, err)
		}
		if step.name == "audit" && !strings.Contains(vb, "audit     audit-report.zip, sha256:") {
			t.Errorf("the audit step's model names no audit zip")
		}
	}
}
