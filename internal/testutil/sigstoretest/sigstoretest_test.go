package sigstoretest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestBuildScriptVersions holds scripts/sigstore-build.sh and Components
// together: the script builds what Start runs, version for version.
func TestBuildScriptVersions(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "scripts", "sigstore-build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, `"`) && strings.HasSuffix(l, `"`) {
			lines = append(lines, strings.Trim(l, `"`))
		}
	}
	if len(lines) != len(Components) {
		t.Fatalf("the script builds %d components, Components names %d:\n%s", len(lines), len(Components), strings.Join(lines, "\n"))
	}
	for i, c := range Components {
		if want := strings.Join([]string{c.Name, c.Version, c.Package, c.Binary}, " "); lines[i] != want {
			t.Errorf("component %d: the script has %q, Components %q", i, lines[i], want)
		}
	}
}

// TestFulcioConfigNamesTheIssuers: Fulcio trusts exactly the stack's two
// issuers, each with its CI provider's claim mapping.
func TestFulcioConfigNamesTheIssuers(t *testing.T) {
	t.Parallel()
	cfg := string(fulcioConfig("http://198.18.0.1:1/github", "http://198.18.0.1:1/gitlab"))
	for _, want := range []string{
		"  http://198.18.0.1:1/github:\n    issuer-url: http://198.18.0.1:1/github\n    client-id: sigstore\n    type: ci-provider\n    ci-provider: github-workflow",
		"  http://198.18.0.1:1/gitlab:\n    issuer-url: http://198.18.0.1:1/gitlab\n    client-id: sigstore\n    type: ci-provider\n    ci-provider: gitlab-pipeline",
		"\n  github-workflow:\n", "\n  gitlab-pipeline:\n", `build-signer-uri: "{{ .url }}/{{ .job_workflow_ref }}"`,
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("fulcio config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "ISSUER") {
		t.Errorf("a placeholder is left in the config:\n%s", cfg)
	}
}

// TestMissingBinaryFailsInCI: with an empty cache Start stops the test,
// a skip on a developer's machine and a failure with CI=true, naming the
// build script.
func TestMissingBinaryFailsInCI(t *testing.T) {
	if os.Getenv("SIGSTORETEST_CHILD") == "1" {
		Start(t)
		return
	}
	t.Parallel()
	for _, tc := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"true", true, "required component missing (CI=true): fulcio v1.8.8 not built in"},
		{"", false, "skipping, component missing: fulcio v1.8.8 not built in"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingBinaryFailsInCI$", "-test.v")
		cmd.Env = append(os.Environ(), "SIGSTORETEST_CHILD=1", "CI="+tc.ci, "GPUPASS_SIGSTORE_CACHE="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantFail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "scripts/sigstore-build.sh") {
			t.Errorf("CI=%q: err %v, want failure %v saying %q and naming the build script:\n%s", tc.ci, err, tc.wantFail, tc.want, out)
		}
	}
}
