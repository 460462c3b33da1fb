package deploy

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	agentcmd "github.com/gpupass/gpupass/internal/command/agent"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
)

// object is the part of a rendered manifest these tests read.
type object struct {
	Kind     string
	Metadata struct{ Name string }
	Spec     struct {
		Template struct {
			Spec struct {
				HostNetwork bool `yaml:"hostNetwork"`
				Containers  []struct {
					Name  string
					Env   []struct{ Name, Value string }
					Mount []struct {
						Name      string
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				}
				Volumes []struct {
					Name     string
					HostPath *struct{ Path, Type string } `yaml:"hostPath"`
					EmptyDir *struct{}                    `yaml:"emptyDir"`
					PVC      *struct{ ClaimName string }  `yaml:"persistentVolumeClaim"`
				}
			}
		}
	}
}

// kustomize renders a kustomization directory with the cached kubectl
// (no cluster needed).
func kustomize(t *testing.T, dir string) []object {
	t.Helper()
	kubectl := filepath.Join(k8stest.BinDir(), "kubectl")
	if _, err := exec.LookPath(kubectl); err != nil {
		testutil.Missing(t, "kubectl not built in %s (scripts/k8s-build.sh)", k8stest.BinDir())
	}
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var objs []object
	d := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o object
		if err := d.Decode(&o); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		objs = append(objs, o)
	}
}

func agentDeployment(t *testing.T, objs []object) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "Deployment" && o.Metadata.Name == "gpupass-agent" {
			return o
		}
	}
	t.Fatal("no Deployment gpupass-agent")
	return object{}
}

func envOf(o object) map[string]string {
	env := map[string]string{}
	for _, e := range o.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
}

// TestKubernetesAgentEnvNamesFlags: every GPUPASS_* variable the agent's
// Deployment sets, in the base and in the local overlay, is one that
// gpupass-agent reads (GPUPASS_<FLAG>, or GPUPASS_<FLAG>_FILE of a
// secret): a misspelt one would be ignored without a word.
func TestKubernetesAgentEnvNamesFlags(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	agentcmd.NewCommand(io.Discard).Flags().VisitAll(func(f *pflag.Flag) {
		known[flagenv.Name(f.Name)] = true
		if flagenv.IsSecret(f.Name) {
			known[flagenv.Name(f.Name)+"_FILE"] = true
		}
	})
	for _, dir := range []string{"kubernetes", "kubernetes-local"} {
		t.Run(dir, func(t *testing.T) {
			for name := range envOf(agentDeployment(t, kustomize(t, dir))) {
				if strings.HasPrefix(name, flagenv.Prefix) && !known[name] {
					t.Errorf("%s: the agent's Deployment sets %s, which names no gpupass-agent flag", dir, name)
				}
			}
		})
	}
}

// TestKubernetesLocalOverlay: deploy/kubernetes-local is the agent alone,
// made for a cluster without kube-proxy, DNS or a storage provisioner:
// host network with the apiserver on loopback, the shared dir a hostPath
// mounted at the same path the agent is told (the runs' pods get hostPath
// mounts of that path), no claim left. TestE2EKubernetesAgentDeployment
// runs it.
func TestKubernetesLocalOverlay(t *testing.T) {
	t.Parallel()
	objs := kustomize(t, "kubernetes-local")
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.Kind+"/"+o.Metadata.Name)
	}
	slices.Sort(kinds)
	want := []string{"ClusterRole/gpupass-agent-nodes", "ClusterRoleBinding/gpupass-agent-nodes", "Deployment/gpupass-agent",
		"Role/gpupass-agent", "RoleBinding/gpupass-agent", "ServiceAccount/gpupass-agent"}
	if !slices.Equal(kinds, want) {
		t.Errorf("objects %v, want %v (the agent alone: no broker, PostgreSQL or claims)", kinds, want)
	}
	d := agentDeployment(t, objs)
	ps := d.Spec.Template.Spec
	if !ps.HostNetwork {
		t.Error("the agent's pod is not on the host's network: it cannot reach the apiserver on 127.0.0.1")
	}
	env := envOf(d)
	if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] == "" {
		t.Errorf("KUBERNETES_SERVICE_HOST=%q KUBERNETES_SERVICE_PORT=%q, want the apiserver on loopback", env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
	}
	if _, ok := env["GPUPASS_KUBE_SHARED_CLAIM"]; ok {
		t.Error("GPUPASS_KUBE_SHARED_CLAIM is set: there is no claim in this cluster")
	}
	shared := env["GPUPASS_KUBE_SHARED_DIR"]
	mounts := map[string]string{}
	for _, m := range ps.Containers[0].Mount {
		mounts[m.Name] = m.MountPath
	}
	for _, v := range ps.Volumes {
		switch {
		case v.PVC != nil:
			t.Errorf("volume %s is claim %s: no provisioner here", v.Name, v.PVC.ClaimName)
		case v.Name == "shared" && (v.HostPath == nil || v.HostPath.Path != shared || mounts["shared"] != shared):
			t.Errorf("the shared dir %q is not a hostPath mounted at the same path: %+v at %s", shared, v.HostPath, mounts["shared"])
		}
	}
}
