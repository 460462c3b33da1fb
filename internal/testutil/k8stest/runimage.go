package k8stest

import "testing"

// RunImageName is the repository name of the run image in the cluster's
// containerd (a name no registry serves: nothing is ever pulled).
const RunImageName = "gpupass.local/run"

// RunImage builds (once per content key: the Debian packages' versions and
// the agent binary's digest; cached under the k8s cache) the run image:
// Debian's python3, python3-torch, python3-numpy with their dependency
// closure and the dynamic loader, plus agentBin as /usr/local/bin/gpupass-agent,
// imports it into the cluster and returns it pinned by digest
// (gpupass.local/run@sha256:...). agentBin may be "" for an image without
// the agent.
func (c *Cluster) RunImage(t testing.TB, agentBin string) string {
	t.Helper()
	t.Fatal("k8stest.RunImage: not implemented yet")
	return ""
}
