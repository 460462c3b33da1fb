//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestUpTrainOfflineInstallsTheBundle is the offline node's path, with the
// real binaries: `gpupass bundle push` of real wheels to a real registry,
// then `gpupass train` of a no-internet-access spec whose runtime.bundle is
// the pushed digest. The agent pulls it, unpacks its wheels into the run's venv,
// the job imports it, and the run's log names the digest and each package.
// The same spec with a tag instead of the digest is refused at submit.
func TestUpTrainOfflineInstallsTheBundle(t *testing.T) {
	py := regtest.SystemPython(t)
	upstack.RequireTorch(t)
	host := regtest.StartRegistry(t)
	house := regtest.BuildWheels(t, py, map[string]string{"gp-alpha": "1.0.0"})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}, Env: []string{"GPUPASS_REGISTRY_PLAIN_HTTP=true"}})
	gp := func(args ...string) *exec.Cmd { return stack.Command(ctx, args...) }

	out, err := gp("-o", "json", "bundle", "push", "--plain-http", "--wheelhouse", house, host+"/offline/wheels:v1").Output()
	if err != nil {
		t.Fatalf("bundle push: %v\n%s", err, out)
	}
	var pushed struct{ Reference, Digest string }
	if err := json.Unmarshal(out, &pushed); err != nil || pushed.Digest == "" {
		t.Fatalf("bundle push output %q: %v", out, err)
	}

	example, err := os.ReadFile(filepath.Join(stack.Root, "examples/train/gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	offlineSpec := func(ref string) string {
		s := strings.Replace(string(example), "    - numpy==1.24.2\n", "    - numpy==1.24.2\n    - gp-alpha==1.0.0\n  bundle: "+ref+"\n", 1)
		s = strings.Replace(s, "no-internet-access: false", "no-internet-access: true", 1)
		if s == string(example) || !strings.Contains(s, "no-internet-access: true") {
			t.Fatal("examples/train/gpupass.yaml changed shape; update this test")
		}
		p := filepath.Join(t.TempDir(), "gpupass.yaml")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	job := []string{py, "-c", "import gp_alpha; print('job imported', gp_alpha.hello())"}

	train := func(specPath string) (string, error) {
		args := append([]string{"train", "--spec", specPath, "--region", "us-west-2", "--follow", "--"}, job...)
		b, err := gp(args...).CombinedOutput()
		return string(b), err
	}
	got, err := train(offlineSpec(pushed.Reference))
	if err != nil {
		t.Fatalf("train of the offline spec: %v\n%s", err, upstack.Tail(got, 6000))
	}
	for _, want := range []string{
		"runtime.bundle",
		"bundle " + pushed.Reference + " pulled and verified: 1 wheels",
		"installed gp-alpha 1.0.0 from gp_alpha-1.0.0-py3-none-any.whl (bundle " + pushed.Digest + ")",
		"package numpy==1.24.2 already provided by the node's Python",
		"job imported gp-alpha 1.0.0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("train output lacks %q:\n%s", want, upstack.Tail(got, 6000))
		}
	}

	got, err = train(offlineSpec(host + "/offline/wheels:v1"))
	if err == nil {
		t.Fatalf("train of a spec pinning the bundle by tag succeeded:\n%s", upstack.Tail(got, 4000))
	}
	// The broker validates the spec on submit and refuses it already;
	// the node's own refusal is tested in agent (TestBundleInstall...).
	if !strings.Contains(got, "bundle.digest-required") || strings.Contains(got, "job imported gp-alpha") {
		t.Errorf("the tag-pinned spec was not refused with bundle.digest-required:\n%s", upstack.Tail(got, 4000))
	}
}
