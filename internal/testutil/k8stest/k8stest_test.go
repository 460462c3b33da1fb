package k8stest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

func TestParseEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, out string
		want      *Cluster
	}{
		{"k8s-up output", "GPUPASS_K8S_RUN=/r\nGPUPASS_K8S_NODE=vm\nGPUPASS_K8S_CONTAINERD=/r/c.sock\nGPUPASS_K8S_BIN=/b\nexport KUBECONFIG=/r/admin.kubeconfig\n",
			&Cluster{Kubeconfig: "/r/admin.kubeconfig", NodeName: "vm", Dir: "/r", ContainerdSocket: "/r/c.sock"}},
		{"no kubeconfig", "GPUPASS_K8S_RUN=/r\nGPUPASS_K8S_NODE=vm\nGPUPASS_K8S_CONTAINERD=/r/c.sock\n", nil},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseEnv(tc.out)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("parseEnv = %+v, want an error", got)
				}
				return
			}
			if err != nil || *got != *tc.want {
				t.Fatalf("parseEnv = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestClusterNodeAdvertisesGPUs: the node is Ready and shows what the
// NVIDIA device plugin and GPU Feature Discovery would: allocatable
// nvidia.com/gpu and the product and count labels.
func TestClusterNodeAdvertisesGPUs(t *testing.T) {
	c := Require(t)
	var node struct {
		Metadata struct{ Labels map[string]string }
		Status   struct {
			Allocatable map[string]string
			Conditions  []struct{ Type, Status string }
		}
	}
	if err := json.Unmarshal([]byte(c.Kubectl(t, "get", "node", c.NodeName, "-o", "json")), &node); err != nil {
		t.Fatal(err)
	}
	ready := false
	for _, cond := range node.Status.Conditions {
		ready = ready || cond.Type == "Ready" && cond.Status == "True"
	}
	if !ready {
		t.Errorf("node %s not Ready: %+v", c.NodeName, node.Status.Conditions)
	}
	if got := node.Status.Allocatable[GPUResource]; got != fmt.Sprint(GPUs) {
		t.Errorf("allocatable %s = %q, want %d", GPUResource, got, GPUs)
	}
	if got := node.Metadata.Labels["nvidia.com/gpu.product"]; got != GPUProduct {
		t.Errorf("label nvidia.com/gpu.product = %q, want %q", got, GPUProduct)
	}
	if got := node.Metadata.Labels["nvidia.com/gpu.count"]; got != fmt.Sprint(GPUs) {
		t.Errorf("label nvidia.com/gpu.count = %q, want %d", got, GPUs)
	}
}

// TestRunImageImportsTorchInAPod: the run image, built from this
// machine's Debian packages and imported with no registry, runs in a pod
// that asks for a GPU: python3 imports torch and numpy, /bin/sh and the
// agent binary are there.
func TestRunImageImportsTorchInAPod(t *testing.T) {
	c := Require(t)
	ns := c.Namespace(t)
	ref := c.RunImage(t, testutil.BuildBinary(t, "./cmd/gpupass-agent"))
	if !strings.HasPrefix(ref, RunImageName+"@sha256:") {
		t.Fatalf("run image %q is not pinned by digest", ref)
	}
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"torch"},"spec":{
		"restartPolicy":"Never","nodeName":%q,
		"containers":[{"name":"torch","image":%q,"imagePullPolicy":"IfNotPresent",
			"command":["/bin/sh","-c","python3 -c 'import torch, numpy; print(\"torch\", torch.__version__, torch.ones(3).sum().item())' && %s --help >/dev/null && echo agent-ok"],
			"resources":{"limits":{%q:"1"}}}]}}`, c.NodeName, ref, AgentPath, GPUResource)
	c.KubectlStdin(t, pod, "-n", ns, "apply", "-f", "-")
	phase := c.WaitPodDone(t, ns, "torch")
	logs := c.Kubectl(t, "-n", ns, "logs", "torch")
	if phase != "Succeeded" || !strings.Contains(logs, "torch 1.") || !strings.Contains(logs, "3.0") || !strings.Contains(logs, "agent-ok") {
		t.Fatalf("pod ended %s, log:\n%s\n%s", phase, logs, c.Kubectl(t, "-n", ns, "describe", "pod", "torch"))
	}
}

// TestClusterDaemonsHoldNoLock: no daemon of the cluster keeps a lock
// file of k8s-up.sh open. One that did (inherited from k8s-up) held the
// lock for the cluster's whole life, and every later k8s-up.sh, so every
// other test binary's Require, waited on it forever.
func TestClusterDaemonsHoldNoLock(t *testing.T) {
	checkNoLockHeld(t, Require(t))
}

func checkNoLockHeld(t *testing.T, c *Cluster) {
	pids, err := filepath.Glob(filepath.Join(c.Dir, "pids", "*"))
	if err != nil || len(pids) == 0 {
		t.Fatalf("no PID files in %s/pids: %v", c.Dir, err)
	}
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid := strings.TrimSpace(string(b))
		fds, err := os.ReadDir(filepath.Join("/proc", pid, "fd"))
		if err != nil {
			t.Errorf("%s (PID %s, from %s) is not running: %v", filepath.Base(f), pid, f, err)
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join("/proc", pid, "fd", fd.Name()))
			if err != nil {
				continue
			}
			if strings.HasSuffix(target, ".lock") && (strings.HasPrefix(target, c.Dir+"/") || strings.HasPrefix(target, c.Dir+".")) {
				t.Errorf("%s (PID %s) holds %s open as fd %s: it keeps k8s-up.sh's lock", filepath.Base(f), pid, target, fd.Name())
			}
		}
	}
}

// TestBuildRunning: Require waits for a k8s-build.sh that holds the cache's
// build lock (CI starts it in the background) instead of skipping.
func TestBuildRunning(t *testing.T) {
	t.Setenv("GPUPASS_K8S_CACHE", t.TempDir())
	if buildRunning() {
		t.Fatal("buildRunning with no lock file")
	}
	dir := filepath.Join(cacheRoot(), Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, ".build.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if buildRunning() {
		t.Fatal("buildRunning with the lock free")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !buildRunning() {
		t.Fatal("buildRunning = false while the build lock is held")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if buildRunning() {
		t.Fatal("buildRunning after the lock was released")
	}
}

// TestNamespaceTakesPods: a pod can be made in a namespace the moment
// Namespace returns (CI once met "serviceaccount \"default\" not found"
// on a pod made right after the namespace). The dry run asks the API
// server's admission, which looks the service account up.
func TestNamespaceTakesPods(t *testing.T) {
	c := Require(t)
	// Several at once, so that the controller has a queue.
	for i := 0; i < 8; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ns := c.Namespace(t)
			c.KubectlStdin(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}`,
				"create", "-n", ns, "--dry-run=server", "-f", "-")
		})
	}
}

// TestWaitServiceAccount: the wait returns once the account exists, made
// late here as a slow controller would, and names the namespace and the
// account when it never comes.
func TestWaitServiceAccount(t *testing.T) {
	c := Require(t)
	ns := c.Namespace(t)
	go func() {
		time.Sleep(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.KubectlCmd(ctx, "create", "serviceaccount", "late", "-n", ns).Run()
	}()
	start := time.Now()
	if err := c.waitServiceAccount(ns, "late", time.Minute); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("returned after %v, before the account was made", took)
	}
	err := c.waitServiceAccount(ns, "never", 500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), ns) || !strings.Contains(err.Error(), `"never"`) {
		t.Errorf("waiting for an account never made: %v, want an error naming %s and \"never\"", err, ns)
	}
}
