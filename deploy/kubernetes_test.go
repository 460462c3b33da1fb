package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		{"create", "jobs.batch", ns, true},
		{"delete", "jobs.batch", ns, true},
		{"watch", "jobs.batch", ns, true},
		{"list", "pods", ns, true},
		{"get", "pods/log", ns, true},
		{"list", "nodes", "", true},
		{"watch", "nodes", "", true},
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
