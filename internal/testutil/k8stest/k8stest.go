// Package k8stest gives tests a real one-node Kubernetes cluster on this
// machine: the one scripts/k8s-up.sh starts (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd and a kubelet, all on
// loopback), with simulated GPUs: the node advertises nvidia.com/gpu
// capacity and the GPU Feature Discovery labels, as the NVIDIA device
// plugin and GFD would.
//
// The cluster takes about a minute to start and ~650 MB of RAM, so it is
// shared: Require starts it when it is not running and otherwise reuses it,
// from every test binary at once (k8s-up.sh serialises on a lock), and it
// is left running for the next test run; scripts/k8s-down.sh stops it.
// Each test isolates itself in a namespace of its own (Namespace).
//
// With CI=true a missing component (the Debian packages, the cached
// Kubernetes build, root) fails the test (testutil.Missing); elsewhere it
// skips. scripts/setup.d/70-kubernetes.sh installs and builds all of it.
package k8stest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// The simulated GPUs of the node, as k8s-up.sh advertises them.
const (
	// GPUResource is the extended resource the node advertises.
	GPUResource = "nvidia.com/gpu"
	// GPUProduct is the node's nvidia.com/gpu.product label.
	GPUProduct = "NVIDIA-A100-SXM4-80GB"
	// GPUs is the node's nvidia.com/gpu capacity and nvidia.com/gpu.count label.
	GPUs = 4
)

// Cluster is the running test cluster.
type Cluster struct {
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// NodeName is the one node's name (the machine's hostname).
	NodeName string
	// Dir is the cluster's run directory: certificates, state, logs
	// (Dir/log/<component>.log) and recorded PIDs.
	Dir string
	// BinDir holds the cached kubectl, kubelet and control-plane binaries.
	BinDir string
	// ContainerdSocket is the cluster's own containerd (not the machine's).
	ContainerdSocket string
}

var (
	mu     sync.Mutex
	cached *Cluster
)

// Require returns the test cluster, starting it if it is not running
// (about a minute) or reusing it. It skips the test when a component is
// missing (fails with CI=true) and fails it when the cluster cannot start.
func Require(t testing.TB) *Cluster {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if cached != nil && cached.healthy() == nil {
		return cached
	}
	testutil.Prereqs{Root: "the Kubernetes test cluster needs root (containerd, kubelet, mounts)",
		Tools:   []string{"etcd", "containerd", "runc", "ctr", "iptables", "conntrack"},
		Install: "scripts/setup.d/70-kubernetes.sh installs etcd-server containerd runc containernetworking-plugins iptables conntrack busybox-static"}.Require(t)
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		testutil.Missing(t, "CNI plugins not installed in /usr/lib/cni (scripts/setup.d/70-kubernetes.sh installs containernetworking-plugins)")
	}
	bin := BinDir()
	root := testutil.RepoRoot(t)
	if missingBinary(bin) != "" && os.Getenv("GPUPASS_K8S_BIN") == "" && (buildRunning() || os.Getenv("CI") == "true") {
		// CI starts the build in the background during setup
		// (scripts/setup.d/05-kubernetes-build.sh) and lets the other tests
		// run meanwhile: wait for it here (k8s-build.sh waits on its lock,
		// then finds the binaries), or build now when none is running.
		t.Logf("waiting for the Kubernetes build (scripts/k8s-build.sh; log in %s)", filepath.Join(cacheRoot(), Version, "build.log"))
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
		b, err := exec.CommandContext(ctx, filepath.Join(root, "scripts", "k8s-build.sh")).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("scripts/k8s-build.sh: %v\n%s", err, tail(string(b), 4000))
		}
	}
	if b := missingBinary(bin); b != "" {
		testutil.Missing(t, "%s not built in %s (scripts/k8s-build.sh builds it once, ~13 min; scripts/setup.d/70-kubernetes.sh runs it)", b, bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "k8s-up.sh"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/k8s-up.sh: %v\n%s\n%s", err, out.String(), tail(errb.String(), 4000))
	}
	c, err := parseEnv(out.String())
	if err != nil {
		t.Fatalf("scripts/k8s-up.sh: %v\n%s", err, out.String())
	}
	c.BinDir = bin
	cached = c
	return c
}

// missingBinary names the first Kubernetes binary not in bin, or "".
func missingBinary(bin string) string {
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return b
		}
	}
	return ""
}

// buildRunning reports whether a scripts/k8s-build.sh holds the build
// lock of this version's cache now.
func buildRunning() bool {
	f, err := os.Open(filepath.Join(cacheRoot(), Version, ".build.lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// Version is the Kubernetes version the tests build and run.
const Version = "v1.36.3"

// BinDir is where scripts/k8s-build.sh caches the binaries:
// ${GPUPASS_K8S_CACHE:-$HOME/.cache/gpupass/k8s}/<Version>/bin, or
// $GPUPASS_K8S_BIN (binaries built elsewhere; k8s-up.sh takes it too).
func BinDir() string {
	if b := os.Getenv("GPUPASS_K8S_BIN"); b != "" {
		return b
	}
	return filepath.Join(cacheRoot(), Version, "bin")
}

// cacheRoot is ${GPUPASS_K8S_CACHE:-$HOME/.cache/gpupass/k8s}.
func cacheRoot() string {
	if root := os.Getenv("GPUPASS_K8S_CACHE"); root != "" {
		return root
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "gpupass", "k8s")
}

// parseEnv reads k8s-up.sh's stdout: KEY=VALUE lines, the last one
// `export KUBECONFIG=...`.
func parseEnv(out string) (*Cluster, error) {
	c := &Cluster{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "), "=")
		if !ok {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		switch k {
		case "KUBECONFIG":
			c.Kubeconfig = v
		case "GPUPASS_K8S_NODE":
			c.NodeName = v
		case "GPUPASS_K8S_RUN":
			c.Dir = v
		case "GPUPASS_K8S_CONTAINERD":
			c.ContainerdSocket = v
		}
	}
	if c.Kubeconfig == "" || c.NodeName == "" || c.Dir == "" || c.ContainerdSocket == "" {
		return nil, fmt.Errorf("output lacks KUBECONFIG, GPUPASS_K8S_NODE, GPUPASS_K8S_RUN or GPUPASS_K8S_CONTAINERD")
	}
	return c, nil
}

// healthy asks the apiserver for /readyz: a cluster stopped by
// k8s-down.sh since the last Require is started again.
func (c *Cluster) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := c.KubectlCmd(ctx, "get", "--raw", "/readyz").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, b)
	}
	return nil
}

// Env is the process environment with KUBECONFIG set to the cluster's
// admin kubeconfig and the cached binaries' directory first on PATH.
func (c *Cluster) Env() []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") && !strings.HasPrefix(e, "PATH=") {
			env = append(env, e)
		}
	}
	return append(env, "KUBECONFIG="+c.Kubeconfig, "PATH="+c.BinDir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// KubectlCmd is a kubectl command against the cluster.
func (c *Cluster) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), args...)
	cmd.Env = c.Env()
	return cmd
}

// Kubectl runs kubectl against the cluster and returns its stdout; a
// failure (or two minutes) fails the test.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	return c.KubectlStdin(t, "", args...)
}

// KubectlStdin is Kubectl with stdin (a manifest for `apply -f -`).
func (c *Cluster) KubectlStdin(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.KubectlCmd(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// Namespace creates a namespace of the test's own (gpupass-test-<random>)
// and deletes it, without waiting, when the test ends. It returns once the
// namespace's "default" service account exists: the service-account
// controller makes it a moment after the namespace, and until then the API
// server refuses every pod there ("error looking up service account
// NS/default"), as the Kubernetes e2e framework's
// WaitForDefaultServiceAccountInNamespace knows.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "gpupass-test-" + hex.EncodeToString(b[:])
	c.Kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.KubectlCmd(ctx, "delete", "namespace", ns, "--wait=false").Run()
	})
	if err := c.waitServiceAccount(ns, "default", DefaultServiceAccountWait); err != nil {
		t.Fatal(err)
	}
	return ns
}

// DefaultServiceAccountWait is how long Namespace waits for the
// namespace's default service account (the e2e framework waits 2 min).
const DefaultServiceAccountWait = 2 * time.Minute

func (c *Cluster) waitServiceAccount(ns, name string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := c.KubectlCmd(ctx, "get", "serviceaccount", name, "-n", ns, "-o", "name").CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: no service account %q after %v (is kube-controller-manager running?): %s", ns, name, limit, strings.TrimSpace(string(out)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// LoadImage imports an image tarball (docker-save or OCI layout, e.g. from
// go-containerregistry's tarball.Write) into the cluster's containerd, in
// the k8s.io namespace the kubelet uses, and returns the reference
// pinned by digest (NAME@sha256:...) to put in a pod spec. Pods must use
// imagePullPolicy IfNotPresent (or Never): there is no registry to pull
// from. Importing the same image again is cheap. The older images of its
// repository that no container uses and nobody imported for ImageKeep are
// removed, so that a long-lived cluster does not fill its disk.
func (c *Cluster) LoadImage(t testing.TB, tarPath string) string {
	t.Helper()
	ref, err := c.loadImage(tarPath, ImageKeep)
	if err != nil {
		t.Fatalf("loading image %s into the test cluster: %v", tarPath, err)
	}
	return ref
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

func (c *Cluster) ctr(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", c.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
}

// loadImage imports with --digests, so that containerd also names the
// image NAME@sha256:<manifest digest>: the reference a pinned pod spec
// uses, resolved by the CRI plugin without a registry. The name comes
// from the OCI layout's index (io.containerd.image.name). Then it prunes
// the repository's images last imported more than keep ago
// (pruneImages).
func (c *Cluster) loadImage(tarPath string, keep time.Duration) (string, error) {
	name, dgst, err := layoutName(tarPath)
	if err != nil {
		return "", err
	}
	repo := name
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Importing the 1.3 GB run image takes minutes on a busy machine;
	// containerd keeps it for the cluster's lifetime, so import once.
	pinned := repo + "@" + dgst
	ref, err := c.importImage(ctx, repo, pinned, tarPath)
	if err != nil {
		return "", err
	}
	if _, err := c.pruneImages(ctx, ref, keep); err != nil {
		return "", fmt.Errorf("removing old images of %s: %w", repo, err)
	}
	return ref, nil
}

func (c *Cluster) importImage(ctx context.Context, repo, pinned, tarPath string) (string, error) {
	if have, err := c.ctr(ctx, "images", "ls", "-q").Output(); err == nil && slices.Contains(strings.Fields(string(have)), pinned) {
		return pinned, nil
	}
	b, err := c.ctr(ctx, "images", "import", "--digests", "--base-name", repo, tarPath).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ctr images import: %v: %s", err, b)
	}
	// "unpacking NAME@sha256:HEX (sha256:HEX)...done"
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "unpacking" && strings.HasPrefix(f[1], repo+"@sha256:") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("ctr images import named no %s@sha256:... image: %s", repo, b)
}

// layoutName reads the image name and manifest digest from an OCI layout
// tarball's index.json.
func layoutName(tarPath string) (name, digest string, err error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", "", fmt.Errorf("%s: no index.json: not an OCI image layout tarball (%v)", tarPath, err)
		}
		if h.Name != "index.json" && h.Name != "./index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Digest      string            `json:"digest"`
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&idx); err != nil {
			return "", "", fmt.Errorf("%s: index.json: %w", tarPath, err)
		}
		for _, m := range idx.Manifests {
			if n := m.Annotations["io.containerd.image.name"]; n != "" {
				return n, m.Digest, nil
			}
		}
		return "", "", fmt.Errorf("%s: index.json names no image (annotation io.containerd.image.name)", tarPath)
	}
}

// WaitPodDone waits (up to five minutes: the first pod of a new image
// waits for its unpacking) until the pod has Succeeded or Failed and
// returns that phase.
func (c *Cluster) WaitPodDone(t testing.TB, ns, pod string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b, err := c.KubectlCmd(ctx, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.phase}").Output()
		cancel()
		if phase := string(b); err == nil && (phase == "Succeeded" || phase == "Failed") {
			return phase
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not done after 5 minutes:\n%s", ns, pod, c.Kubectl(t, "-n", ns, "describe", "pod", pod))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
