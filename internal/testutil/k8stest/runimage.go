package k8stest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/debimage"
	"github.com/gpupass/gpupass/internal/testutil"
)

// RunImageName is the repository name of the run image in the cluster's
// containerd (a name no registry serves: nothing is ever pulled).
const RunImageName = "gpupass.local/run"

// RunImagePackages are the Debian packages whose installed closure makes
// the run image: what examples/train imports, the same list as the demo's
// (scripts/lib.sh DEMO_APT_PACKAGES), and a POSIX shell with coreutils,
// which the executor's pod command (/bin/sh -c WRAPPER) needs; being
// Essential, they are no package's dependency.
var RunImagePackages = []string{"python3", "python3-torch", "python3-numpy", "dash", "coreutils"}

// AgentPath is where the run image holds the agent binary, for the
// executor's conformance check inside the image.
const AgentPath = "/usr/local/bin/gpupass-agent"

// BuildRunImage builds the run image (no cluster needed) and returns the
// OCI layout tarball and its manifest digest: Debian's python3,
// python3-torch, python3-numpy with their installed dependency closure
// (the dynamic loader and libc included), /etc/ld.so.cache, and agentBin
// at AgentPath ("" for none). Cached by content key (package versions,
// agent digest) under the k8s cache, so a second call is a hash of the
// agent binary; the first writes about 1 GB (tens of seconds).
func BuildRunImage(t testing.TB, agentBin string) debimage.Result {
	t.Helper()
	cache := imageCache(t)
	passwd := filepath.Join(cache, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/tmp:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := debimage.Spec{
		Name:     RunImageName + ":1",
		Packages: RunImagePackages,
		Files: map[string]string{
			"/etc/ld.so.cache": "/etc/ld.so.cache",
			"/etc/passwd":      passwd,
		},
		TmpDirs: []string{"/tmp", "/root"},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=/root",
		},
		Cmd: []string{"python3"},
	}
	if agentBin != "" {
		spec.Files[AgentPath] = agentBin
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
