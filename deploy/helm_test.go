package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
)

// The chart's own labels; the kustomize manifests have only name and
// part-of.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}

// render runs a command that prints manifests and decodes every object,
// keyed by kind/namespace/name.
func render(t *testing.T, name string, args ...string) map[string]any {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.Bytes())
	}
	objs := map[string]any{}
	d := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		if err := d.Decode(&o); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		objs[fmt.Sprintf("%v/%v/%v", o["kind"], md["namespace"], md["name"])] = normalize(o)
	}
}

// normalize drops Helm's labels and turns every list of named entries
// (env, volumes, mounts, ports, containers) into a map by name: kustomize's
// patches reorder them, and their order means nothing to Kubernetes (but
// for env entries that refer to others, which both keep in order).
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range v {
			if lm, ok := e.(map[string]any); ok && k == "labels" {
				for _, l := range helmLabels {
					delete(lm, l)
				}
			}
			m[k] = normalize(e)
		}
		return m
	case []any:
		byName := map[string]any{}
		for _, e := range v {
			em, ok := e.(map[string]any)
			name, named := em["name"].(string)
			if !ok || !named {
				byName = nil
				break
			}
			byName[name] = normalize(em)
		}
		if byName != nil && len(byName) == len(v) {
			return byName
		}
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = normalize(e)
		}
		return l
	}
	return v
}

func helm(t *testing.T) string {
	t.Helper()
	return testutil.Tool(t, "helm")
}

func kubectl(t *testing.T) string {
	t.Helper()
	k := filepath.Join(k8stest.BinDir(), "kubectl")
	if _, err := exec.LookPath(k); err != nil {
		testutil.Missing(t, "kubectl not built in %s (scripts/k8s-build.sh)", k8stest.BinDir())
	}
	return k
}

// TestHelmChartIsTheKustomizeManifests: the chart renders the same objects
// as deploy/kubernetes with its default values, and as
// deploy/kubernetes-local (the agent alone, on the host's network, in the
// one-node test cluster) with values-local.yaml: two ways to install, one
// set of objects, so neither drifts from the other. The local one is what
// TestE2EKubernetesAgentDeployment runs in the real cluster.
func TestHelmChartIsTheKustomizeManifests(t *testing.T) {
	t.Parallel()
	helmBin, kubectlBin := helm(t), kubectl(t)
	chart := filepath.Join("helm", "gpupass")
	if out, err := exec.Command(helmBin, "lint", "--strict", chart).CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	for _, tc := range []struct{ kustomize, values string }{
		{"kubernetes", ""},
		{"kubernetes-local", filepath.Join(chart, "values-local.yaml")},
	} {
		t.Run(tc.kustomize, func(t *testing.T) {
			t.Parallel()
			args := []string{"template", "gpupass", chart, "--namespace", "gpupass"}
			if tc.values != "" {
				args = append(args, "--values", tc.values)
			}
			fromHelm := render(t, helmBin, args...)
			fromKustomize := render(t, kubectlBin, "kustomize", tc.kustomize)
			var hk, kk []string
			for k := range fromHelm {
				hk = append(hk, k)
			}
			for k := range fromKustomize {
				kk = append(kk, k)
			}
			slices.Sort(hk)
			slices.Sort(kk)
			if !slices.Equal(hk, kk) {
				t.Fatalf("helm renders %v\nkustomize renders %v", hk, kk)
			}
			for _, k := range kk {
				if !reflect.DeepEqual(fromHelm[k], fromKustomize[k]) {
					h, _ := yaml.Marshal(fromHelm[k])
					c, _ := yaml.Marshal(fromKustomize[k])
					t.Errorf("%s differs:\nhelm:\n%s\nkustomize:\n%s", k, h, c)
				}
			}
		})
	}
}

// TestHelmChartOtherNamespace: in a namespace of its own the agent's
// cluster-wide RBAC carries the namespace in its name and binds that
// namespace's service account, so two releases never share (or, on
// uninstall, delete) one binding; an image given by digest is pinned.
func TestHelmChartOtherNamespace(t *testing.T) {
	t.Parallel()
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	objs := render(t, helm(t), "template", "gpupass", filepath.Join("helm", "gpupass"), "--namespace", "team-a",
		"--set", "images.agent.digest="+digest)
	crb, ok := objs["ClusterRoleBinding/<nil>/gpupass-agent-nodes-team-a"].(map[string]any)
	if !ok {
		t.Fatalf("no ClusterRoleBinding gpupass-agent-nodes-team-a in %v", slices.Sorted(maps.Keys(objs)))
	}
	sa := crb["subjects"].(map[string]any)["gpupass-agent"].(map[string]any)
	if sa["namespace"] != "team-a" {
		t.Errorf("the binding's subject is in namespace %v, want team-a", sa["namespace"])
	}
	dep := objs["Deployment/team-a/gpupass-agent"].(map[string]any)
	c := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].(map[string]any)["agent"].(map[string]any)
	if want := "ghcr.io/gpupass/gpupass-agent@" + digest; c["image"] != want {
		t.Errorf("agent image %v, want %s", c["image"], want)
	}
}

// TestHelmChartInstallsOnTheCluster: the real apiserver accepts every
// object the chart renders, both ways (server-side dry run: schema,
// defaulting and admission, nothing stored), in a namespace of its own.
func TestHelmChartInstallsOnTheCluster(t *testing.T) {
	c := k8stest.Require(t)
	helmBin := helm(t)
	ns := c.Namespace(t)
	chart := filepath.Join("helm", "gpupass")
	for _, values := range []string{"", filepath.Join(chart, "values-local.yaml")} {
		args := []string{"template", "gpupass", chart, "--namespace", ns}
		if values != "" {
			args = append(args, "--values", values)
		}
		out, err := exec.Command(helmBin, args...).Output()
		if err != nil {
			t.Fatalf("helm %v: %v", args, err)
		}
		res := c.KubectlStdin(t, string(out), "apply", "--dry-run=server", "-f", "-")
		if want, n := strings.Count(string(out), "\nkind: "), strings.Count(res, "(server dry run)"); n != want {
			t.Fatalf("the apiserver accepted %d of the %d objects (values %q):\n%s", n, want, values, res)
		}
	}
}
