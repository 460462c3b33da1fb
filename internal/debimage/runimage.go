package debimage

import (
	"fmt"
	"os"
	"path/filepath"
)

// RunImageName is the repository name of the default run image of the
// local Kubernetes cluster (scripts/k8s-up.sh --run-image, and the tests'
// k8stest.RunImage): a name no registry serves, so nothing is ever
// pulled; pods name it pinned, NAME@sha256:...
const RunImageName = "gpupass.local/run"

// RunImagePackages are the Debian packages whose installed closure makes
// the run image: what examples/train imports, the same list as the demo's
// (scripts/lib.sh DEMO_APT_PACKAGES), and a POSIX shell with coreutils,
// which the executor's pod command (/bin/sh -c WRAPPER) needs; being
// Essential, they are no package's dependency.
var RunImagePackages = []string{"python3", "python3-torch", "python3-numpy", "dash", "coreutils"}

// RunImageAgentPath is where the run image holds the agent binary, for
// the executor's conformance check inside the image.
const RunImageAgentPath = "/usr/local/bin/gpupass-agent"

// RunImageSpec is the default run image: RunImagePackages with their
// installed dependency closure (the dynamic loader and libc included),
// /etc/ld.so.cache, a passwd with root and nonroot (65532, the uid the
// executor's pods run as), and agentBin at RunImageAgentPath ("" for
// none). The passwd file is written into dir.
func RunImageSpec(dir, agentBin string) (Spec, error) {
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/tmp:/bin/sh\n"), 0o644); err != nil {
		return Spec{}, fmt.Errorf("writing the run image's passwd: %w", err)
	}
	spec := Spec{
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
		spec.Files[RunImageAgentPath] = agentBin
	}
	return spec, nil
}
