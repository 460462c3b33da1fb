package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/debimage"
	"github.com/gpupass/gpupass/internal/ociimage"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
)

// overlay writes a kustomization that puts deploy/kubernetes into ns and
// suffixes every name with it (the cluster-scoped ClusterRole and its
// binding included), so that tests never meet each other's objects; extra
// is appended (images:, patches:).
func overlay(t *testing.T, ns, extra string) string {
	t.Helper()
	base, err := filepath.Abs("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes no absolute path as a resource.
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nnameSuffix: -%s\nresources:\n  - %s\n%s", ns, ns, rel, extra)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestKubernetesManifestsServerDryRun: the apiserver of a real cluster
// accepts every object of deploy/kubernetes (schemas, field names,
// admission), as `kubectl apply -k` would apply them.
func TestKubernetesManifestsServerDryRun(t *testing.T) {
	c := k8stest.Require(t)
	ns := c.Namespace(t)
	out := c.Kubectl(t, "apply", "-k", overlay(t, ns, ""), "--dry-run=server")
	for _, obj := range []string{
		"statefulset.apps/gpupass-postgres", "deployment.apps/gpupass-broker", "service/gpupass-broker",
		"deployment.apps/gpupass-agent", "serviceaccount/gpupass-agent", "role.rbac.authorization.k8s.io/gpupass-agent",
		"clusterrole.rbac.authorization.k8s.io/gpupass-agent-nodes",
	} {
		if !strings.Contains(out, obj+"-"+ns+" created (server dry run)") {
			t.Errorf("dry run did not create %s:\n%s", obj, out)
		}
	}
}

// TestKubernetesAgentRBACIsLeastPrivilege applies the agent's RBAC for
// real and asks the apiserver what its service account may do: Jobs,
// Pods and pod logs in its namespace, Nodes read-only, nothing else.
func TestKubernetesAgentRBACIsLeastPrivilege(t *testing.T) {
	c := k8stest.Require(t)
	ns := c.Namespace(t)
	other := c.Namespace(t)
	c.Kubectl(t, "apply", "-k", overlay(t, ns, ""), "--selector", "app.kubernetes.io/name=gpupass-agent", "--prune=false")
	t.Cleanup(func() {
		c.Kubectl(t, "delete", "clusterrole,clusterrolebinding", "gpupass-agent-nodes-"+ns, "--ignore-not-found")
	})
	sa := "system:serviceaccount:" + ns + ":gpupass-agent-" + ns
	for _, tc := range []struct {
		verb, resource, ns string
		want               bool
	}{
		// What the Kubernetes executor calls (agent/executor/kubernetes).
		{"create", "jobs.batch", ns, true},
		{"get", "jobs.batch", ns, true},
		{"list", "jobs.batch", ns, true},
		{"delete", "jobs.batch", ns, true},
		{"deletecollection", "jobs.batch", ns, true},
		{"watch", "jobs.batch", ns, true},
		{"get", "pods", ns, true},
		{"list", "pods", ns, true},
		{"get", "pods/log", ns, true},
		{"get", "nodes", "", true},
		{"list", "nodes", "", true},
		{"watch", "nodes", "", true},
		// Nothing else.
		{"update", "jobs.batch", ns, false},
		{"patch", "nodes", "", false},
		{"update", "nodes/status", "", false},
		{"create", "pods", ns, false},
		{"delete", "pods", ns, false},
		{"create", "pods/exec", ns, false},
		{"get", "secrets", ns, false},
		{"create", "jobs.batch", other, false},
		{"list", "pods", other, false},
		{"create", "rolebindings.rbac.authorization.k8s.io", ns, false},
	} {
		args := []string{"auth", "can-i", tc.verb, tc.resource, "--as", sa}
		if tc.ns != "" {
			args = append(args, "-n", tc.ns)
		}
		ctx := t.Context()
		out, _ := c.KubectlCmd(ctx, args...).Output()
		if got := strings.TrimSpace(string(out)) == "yes"; got != tc.want {
			where := tc.ns
			if where == "" {
				where = "cluster"
			}
			t.Errorf("agent may %s %s in %s: %v, want %v", tc.verb, tc.resource, where, got, tc.want)
		}
	}
}

// staticBinary builds a gpupass command as the release does (no cgo, so
// it runs in an image with no libc).
func staticBinary(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// postgresImage is the PostgreSQL of this machine's Debian packages as an
// image with the official image's environment contract
// (testdata/postgres-entrypoint.sh): the manifests name
// docker.io/library/postgres, which no registry here serves.
func postgresImage(t *testing.T, c *k8stest.Cluster) string {
	t.Helper()
	dir := t.TempDir()
	etc := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n",
		"group":  "root:x:0:\npostgres:x:999:\n",
	}
	files := map[string]string{}
	for name, body := range etc {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		files["/etc/"+name] = p
	}
	entry, err := filepath.Abs(filepath.Join("testdata", "postgres-entrypoint.sh"))
	if err != nil {
		t.Fatal(err)
	}
	files["/usr/local/bin/docker-entrypoint.sh"] = entry
	r := k8stest.BuildImage(t, debimage.Spec{
		Name:     "gpupass.local/postgres:15",
		Packages: []string{"postgresql-15", "dash", "coreutils"},
		Files:    files,
		TmpDirs:  []string{"/tmp"},
		Env: []string{
			"PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
		},
		Entrypoint: []string{"/usr/local/bin/docker-entrypoint.sh"},
		Cmd:        []string{"postgres"},
	}, "scripts/setup.d/20-postgres.sh")
	return c.LoadImage(t, r.Path)
}

// brokerImage is the release's image of gpupass-broker (internal/ociimage
// on the empty base, as scripts/release/image builds it).
func brokerImage(t *testing.T, c *k8stest.Cluster, path string) string {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	base, err := ociimage.Empty(p)
	if err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.Build(base, ociimage.Spec{Name: "gpupass-broker", Binary: bin, Platform: p})
	if err != nil {
		t.Fatal(err)
	}
	return c.LoadOCIImage(t, img, "gpupass.local/gpupass-broker:test")
}

// TestKubernetesBrokerOnPostgres applies deploy/kubernetes's broker and
// PostgreSQL for real, as `kubectl apply -k` with an overlay that pins
// the images by digest: PostgreSQL's StatefulSet gets its volume and
// becomes ready (its own pg_isready probe), the broker's Deployment
// becomes ready on it, and from this machine a token created in that
// PostgreSQL is accepted by that broker's API and a made-up one is not:
// the broker in the pod serves from the database in the other pod.
//
// The test cluster has no kube-proxy and no DNS, so the broker reaches
// PostgreSQL at its pod IP (the secret gpupass-broker-db holds the URL
// either way), and the test reaches both at their pod IPs.
func TestKubernetesBrokerOnPostgres(t *testing.T) {
	c := k8stest.Require(t)
	ns := c.Namespace(t)
	start := time.Now()
	brokerBin := staticBinary(t, "./cmd/gpupass-broker")
	pg, broker := postgresImage(t, c), brokerImage(t, c, brokerBin)
	t.Logf("images: %s", time.Since(start))
	repoDigest := func(ref string) (string, string) {
		repo, dg, _ := strings.Cut(ref, "@")
		return repo, dg
	}
	pgRepo, pgDigest := repoDigest(pg)
	brRepo, brDigest := repoDigest(broker)
	extra := fmt.Sprintf("images:\n  - {name: docker.io/library/postgres, newName: %s, digest: %s}\n  - {name: ghcr.io/gpupass/gpupass-broker, newName: %s, digest: %s}\n",
		pgRepo, pgDigest, brRepo, brDigest)

	// The StatefulSet's claim, bound to a directory here (there is no
	// storage provisioner). The postgres user owns it: fsGroup does not
	// reach a hostPath volume.
	data := t.TempDir()
	if err := os.Chown(data, 999, 999); err != nil {
		t.Fatal(err)
	}
	pgName := "gpupass-postgres-" + ns
	claim := "data-" + pgName + "-0"
	c.KubectlStdin(t, fmt.Sprintf(`{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":%q},"spec":{
		"capacity":{"storage":"10Gi"},"accessModes":["ReadWriteOnce"],"persistentVolumeReclaimPolicy":"Retain",
		"storageClassName":"","hostPath":{"path":%q,"type":"Directory"},
		"claimRef":{"namespace":%q,"name":%q}}}`, claim, data, ns, claim), "apply", "-f", "-")
	t.Cleanup(func() { c.Kubectl(t, "delete", "pv", claim, "--wait=false", "--ignore-not-found") })

	var pw [12]byte
	_, _ = rand.Read(pw[:])
	password := hex.EncodeToString(pw[:])
	c.Kubectl(t, "-n", ns, "create", "secret", "generic", "gpupass-postgres", "--from-literal=password="+password)
	c.Kubectl(t, "apply", "-k", overlay(t, ns, extra), "-l", "app.kubernetes.io/name in (gpupass-postgres,gpupass-broker)")

	pod := pgName + "-0"
	waitReady(t, c, ns, "pod/"+pod)
	t.Logf("postgres ready: %s", time.Since(start))
	pgIP := strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.podIP}"))
	dbURL := fmt.Sprintf("postgres://gpupass:%s@%s:5432/gpupass?sslmode=disable", password, pgIP)
	c.Kubectl(t, "-n", ns, "create", "secret", "generic", "gpupass-broker-db", "--from-literal=url="+dbURL)
	waitReady(t, c, ns, "deployment/gpupass-broker-"+ns)
	t.Logf("broker ready: %s", time.Since(start))

	// A token made in the pod's PostgreSQL from here (with the binary the
	// image holds), then used on the broker in the other pod.
	tok, err := exec.Command(brokerBin, "--db", dbURL, "token", "create", "--role", "read", "--regions", "*").Output()
	if err != nil {
		t.Fatalf("gpupass-broker token create in the cluster's PostgreSQL: %v\n%s", err, exitStderr(err))
	}
	brIP := strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "pod", "-l", "app.kubernetes.io/name=gpupass-broker",
		"-o", "jsonpath={.items[0].status.podIP}"))
	listNodes := func(token string) error {
		// The pod's address is the test cluster's pod network, not
		// loopback: plain HTTP there only with consent, as the agent
		// manifest gives it (GPUPASS_INSECURE_HTTP).
		cl, err := client.Dial("http://"+brIP+":7070", client.Options{Token: token, InsecureHTTP: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.Node.ListNodes(t.Context(), connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
		return err
	}
	if err := listNodes(strings.TrimSpace(string(tok))); err != nil {
		t.Fatalf("ListNodes on the broker in the cluster with a token from its PostgreSQL: %v\nbroker log:\n%s", err,
			c.Kubectl(t, "-n", ns, "logs", "deployment/gpupass-broker-"+ns))
	}
	// A token the database does not hold is refused.
	if err := listNodes("gp_not-a-token"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("ListNodes with a made-up token: %v, want %v", err, connect.CodeUnauthenticated)
	}
}

// waitReady waits for a pod to be Ready or a Deployment to be available,
// and shows why not when it fails.
func waitReady(t *testing.T, c *k8stest.Cluster, ns, obj string) {
	t.Helper()
	cond := "condition=Ready"
	if strings.HasPrefix(obj, "deployment/") {
		cond = "condition=Available"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	// A StatefulSet's pod appears some time after the apply: wait for it
	// to exist first (wait --for=condition fails on a missing object).
	out, err := c.KubectlCmd(ctx, "-n", ns, "wait", "--for=create", "--timeout=5m", obj).CombinedOutput()
	if err == nil {
		out, err = c.KubectlCmd(ctx, "-n", ns, "wait", "--for="+cond, "--timeout=5m", obj).CombinedOutput()
	}
	if err != nil {
		describe, _ := c.KubectlCmd(context.Background(), "-n", ns, "describe", "pods").CombinedOutput()
		logs, _ := c.KubectlCmd(context.Background(), "-n", ns, "logs", "--all-containers", "--prefix", "-l", "app.kubernetes.io/part-of=gpupass").CombinedOutput()
		t.Fatalf("%s not ready: %v\n%s\n%s\n%s", obj, err, out, describe, logs)
	}
}

func exitStderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
