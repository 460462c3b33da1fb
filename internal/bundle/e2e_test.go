//go:build e2e

package bundle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func TestE2ERealRegistryPipInstall(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	host := regtest.StartRegistry(t)
	gp := testutil.BuildBinary(t, "./cmd/gpupass")
	house := regtest.BuildWheels(t, py, map[string]string{"gp-alpha": "1.0.0", "gp-beta": "2.1"})
	pyVer, err := run(t, py, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])")
	must(t, err)
	specPath := filepath.Join(t.TempDir(), "gpupass.yaml")
	must(t, os.WriteFile(specPath, []byte(strings.NewReplacer("3.10.12", strings.TrimSpace(pyVer), "alpha==1.0", "gp-alpha==1.0", "beta-pkg==2.0", "gp_beta==2.1.0").Replace(wheeltest.SpecYAML)), 0o644))

	ref := host + "/ml/wheels:v1"
	out, err := run(t, gp, "-o", "json", "bundle", "push", "--plain-http", "--wheelhouse", house, "--spec", specPath, ref)
	must(t, err)
	var pushed bundle.PushResult
	must(t, json.Unmarshal([]byte(out), &pushed))
	if pushed.BlobsUploaded != 2 || pushed.LayerBytesSent == 0 {
		t.Fatalf("first push: %+v", pushed)
	}

	// An unchanged re-push sends no layer bytes.
	out, err = run(t, gp, "-o", "json", "bundle", "push", "--plain-http", "--wheelhouse", house, "--spec", specPath, ref)
	must(t, err)
	var again bundle.PushResult
	must(t, json.Unmarshal([]byte(out), &again))
	if again.LayerBytesSent != 0 || again.BlobsSkipped != 2 {
		t.Errorf("re-push sent %d bytes (%+v), want 0", again.LayerBytesSent, again)
	}

	// A sibling repository mounts the blobs instead of uploading them.
	out, err = run(t, gp, "-o", "json", "bundle", "push", "--plain-http", "--wheelhouse", house, "--mount-from", host+"/ml/wheels", host+"/ml-prod/wheels:v1")
	must(t, err)
	var mounted bundle.PushResult
	must(t, json.Unmarshal([]byte(out), &mounted))
	if mounted.LayerBytesSent != 0 {
		t.Errorf("mounting push sent %d bytes, want 0", mounted.LayerBytesSent)
	}

	// Pull by digest and install with pip, no index, through the library
	// helper the node agent uses.
	dst := filepath.Join(t.TempDir(), "wheelhouse")
	_, err = run(t, gp, "bundle", "pull", "--plain-http", pushed.Reference, "--to", dst)
	must(t, err)
	target := t.TempDir()
	var pipOut bytes.Buffer
	if err := bundle.Install(context.Background(), dst, []string{"gp-alpha==1.0.0", "gp-beta==2.1"}, bundle.InstallOptions{Python: py, Target: target, Stdout: &pipOut, Stderr: &pipOut}); err != nil {
		t.Fatalf("%v\n%s", err, pipOut.String())
	}
	got, err := run(t, py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gp_alpha, gp_beta; print(gp_alpha.hello(), '|', gp_beta.hello())", target)
	must(t, err)
	if strings.TrimSpace(got) != "gp-alpha 1.0.0 | gp-beta 2.1" {
		t.Errorf("installed packages say %q", got)
	}

	// A pull of a tag that does not exist fails and leaves nothing.
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := run(t, gp, "bundle", "pull", "--plain-http", host+"/ml/wheels:nope", "--to", missing); err == nil || !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("pull of a missing tag: %v", err)
	}
	assertNoPull(t, missing)
}

func TestE2EOrasInterop(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	oras := testutil.Tool(t, "oras")
	host := regtest.StartRegistry(t)
	gp := testutil.BuildBinary(t, "./cmd/gpupass")
	house := regtest.BuildWheels(t, py, map[string]string{"gp-gamma": "0.3"})
	entries, err := os.ReadDir(house)
	must(t, err)
	whl := entries[0].Name()
	orig, err := os.ReadFile(filepath.Join(house, whl))
	must(t, err)

	// oras pull fetches a gpupass bundle: the wheel and the lock.
	_, err = run(t, gp, "bundle", "push", "--plain-http", "--wheelhouse", house, host+"/interop/gp:v1")
	must(t, err)
	orasOut := t.TempDir()
	_, err = run(t, oras, "pull", "--plain-http", "-o", orasOut, host+"/interop/gp:v1")
	must(t, err)
	b, err := os.ReadFile(filepath.Join(orasOut, whl))
	if err != nil || !bytes.Equal(b, orig) {
		t.Errorf("oras pull of a gpupass bundle: %s differs or is missing (%v)", whl, err)
	}
	if _, err := os.Stat(filepath.Join(orasOut, bundle.LockFile)); err != nil {
		t.Errorf("oras pull: lock file missing: %v", err)
	}

	// oras attaches an SBOM to the bundle. This registry has no referrers
	// API, so oras keeps the list under the sha256-<hex> tag, and gpupass
	// bundle inspect finds it there.
	sbom := filepath.Join(t.TempDir(), "sbom.spdx.json")
	must(t, os.WriteFile(sbom, []byte(`{"spdxVersion":"SPDX-2.3"}`), 0o644))
	cmd := exec.Command(oras, "attach", "--plain-http", "--artifact-type", "application/spdx+json", host+"/interop/gp:v1", filepath.Base(sbom))
	cmd.Dir = filepath.Dir(sbom)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oras attach: %v\n%s", err, out)
	}
	out, err := run(t, gp, "bundle", "inspect", "--plain-http", "-o", "json", host+"/interop/gp:v1")
	must(t, err)
	var info bundle.Info
	must(t, json.Unmarshal([]byte(out), &info))
	resp, err := testutil.HTTPClient(t).Get("http://" + host + "/v2/interop/gp/referrers/" + info.Digest)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the test registry answers the referrers API (%s); this case is meant for one without it", resp.Status)
	}
	if len(info.Referrers) != 1 || info.Referrers[0].ArtifactType != "application/spdx+json" || info.ReferrersError != "" {
		t.Errorf("bundle inspect after oras attach: referrers %+v, error %q", info.Referrers, info.ReferrersError)
	}
	out, err = run(t, gp, "bundle", "inspect", "--plain-http", host+"/interop/gp:v1")
	must(t, err)
	if !strings.Contains(out, "application/spdx+json") {
		t.Errorf("bundle inspect does not show the attached SBOM:\n%s", out)
	}

	// gpupass pulls an artifact pushed by oras (no lock, oras's media types).
	cmd = exec.Command(oras, "push", "--plain-http", host+"/interop/oras:v1", whl)
	cmd.Dir = house
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oras push: %v\n%s", err, out)
	}
	dst := filepath.Join(t.TempDir(), "w")
	_, err = run(t, gp, "bundle", "pull", "--plain-http", host+"/interop/oras:v1", "--to", dst)
	must(t, err)
	b, err = os.ReadFile(filepath.Join(dst, whl))
	if err != nil || !bytes.Equal(b, orig) {
		t.Errorf("gpupass pull of an oras artifact: %s differs or is missing (%v)", whl, err)
	}
	target := t.TempDir()
	_, err = run(t, py, "-m", "pip", "install", "--no-index", "--find-links", dst, "--target", target, "--disable-pip-version-check", "-q", "gp-gamma==0.3")
	must(t, err)
}
