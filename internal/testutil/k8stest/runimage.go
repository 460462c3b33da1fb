package k8stest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/debimage"
	"github.com/gpupass/gpupass/internal/testutil"
)

// RunImageName is the repository name of the run image in the cluster's
// containerd (debimage.RunImageName).
const RunImageName = debimage.RunImageName

// RunImagePackages are the Debian packages of the run image
// (debimage.RunImagePackages).
var RunImagePackages = debimage.RunImagePackages

// AgentPath is where the run image holds the agent binary
// (debimage.RunImageAgentPath).
const AgentPath = debimage.RunImageAgentPath

// BuildRunImage builds the run image (no cluster needed) and returns the
// OCI layout tarball and its manifest digest: debimage.RunImageSpec, as
// scripts/k8s-up.sh --run-image builds it. Cached by content key (package
// versions, agent digest) under the k8s cache, so a second call is a hash
// of the agent binary; the first writes about 1 GB (tens of seconds).
func BuildRunImage(t testing.TB, agentBin string) debimage.Result {
	t.Helper()
	spec, err := debimage.RunImageSpec(imageCache(t), agentBin)
	if err != nil {
		t.Fatal(err)
	}
	return BuildImage(t, spec, "scripts/setup.d/10-python.sh")
}

// BuildImage builds an image from this machine's Debian packages
// (debimage.Build) into the k8s cache, where it is kept by content key. A
// package that is not installed skips the test (fails with CI=true),
// naming setup, the scripts/setup.d script that installs it.
func BuildImage(t testing.TB, spec debimage.Spec, setup string) debimage.Result {
	t.Helper()
	for _, p := range spec.Packages {
		if _, err := debimage.Closure([]string{p}); err != nil {
			testutil.Missing(t, "%v (%s)", err, setup)
		}
	}
	r, err := debimage.Build(imageCache(t), spec)
	if err != nil {
		t.Fatalf("building image %s: %v", spec.Name, err)
	}
	return r
}

func imageCache(t testing.TB) string {
	t.Helper()
	cache := filepath.Join(cacheRoot(), "images")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	return cache
}

// RunImage builds the run image (BuildRunImage), imports it into the
// cluster and returns it pinned by digest: gpupass.local/run@sha256:...
// Pods must use imagePullPolicy IfNotPresent or Never.
func (c *Cluster) RunImage(t testing.TB, agentBin string) string {
	t.Helper()
	r := BuildRunImage(t, agentBin)
	ref := c.LoadImage(t, r.Path)
	if want := RunImageName + "@" + r.Digest; ref != want {
		t.Fatalf("imported run image as %s, want %s", ref, want)
	}
	return ref
}
