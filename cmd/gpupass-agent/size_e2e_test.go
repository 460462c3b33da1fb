//go:build e2e

package main_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// nodeAgentMaxBytes bounds the stripped gpupass-agent for a GPU node
// (-tags nokube, as scripts/release/build.sh builds it): the field
// report's agent is a ~12 MB static binary, and client-go alone, which
// only the agent beside a Kubernetes cluster needs, would double it.
const nodeAgentMaxBytes = 15 << 20

// TestNodeAgentSize builds the agent for a GPU node as the release does
// (stripped, -tags nokube) and holds it to 15 MiB; it must say it lacks
// the Kubernetes executor, and the default build must still have it.
func TestNodeAgentSize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	build := func(name string, tags ...string) string {
		out := filepath.Join(dir, name)
		args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", out}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		cmd := exec.Command("go", append(args, "./cmd/gpupass-agent")...)
		cmd.Dir = testutil.RepoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", args, err, b)
		}
		return out
	}
	node := build("gpupass-agent-node", "nokube")
	full := build("gpupass-agent")
	size := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	t.Logf("stripped gpupass-agent: GPU node (-tags nokube) %.2f MiB, with the Kubernetes executor %.2f MiB",
		float64(size(node))/(1<<20), float64(size(full))/(1<<20))
	if n := size(node); n > nodeAgentMaxBytes {
		t.Errorf("the GPU node's gpupass-agent is %d bytes (%.2f MiB), over %d MiB", n, float64(n)/(1<<20), nodeAgentMaxBytes>>20)
	}
	for _, c := range []struct {
		bin, want string
	}{
		{node, "this gpupass-agent is the GPU node build (-tags nokube)"},
		{full, "--kube-image is required with the kubernetes executor"},
	} {
		var stderr bytes.Buffer
		cmd := exec.Command(c.bin, "--broker-url", "http://127.0.0.1:1", "--broker-token", "x", "--region", "r",
			"--state-dir", filepath.Join(dir, "state"), "--executor", "kubernetes")
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%s --executor kubernetes: %v, stderr %q; want %q", filepath.Base(c.bin), err, stderr.String(), c.want)
		}
	}
}
