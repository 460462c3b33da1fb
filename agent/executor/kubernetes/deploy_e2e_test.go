//go:build e2e

package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// localSharedDir is the shared dir of deploy/kubernetes-local: a hostPath
// the agent's pod and the runs' pods see at the same path.
const localSharedDir = "/var/tmp/gpupass-k8s-shared"

// agentUID is the user the agent's Deployment runs as (deploy/kubernetes/agent.yaml).
const agentUID = 65532

// TestE2EKubernetesAgentDeployment deploys the agent the way a user
// would, `kubectl apply -k` of deploy/kubernetes-local (the base's
// ServiceAccount, least-privilege RBAC and Deployment, for the local
// cluster), in an overlay that pins the image by digest, and shows that
// the agent runs inside the cluster: its pod starts, talks to the
// apiserver with in-cluster config (its service account's token and the
// cluster's CA, published by the controller-manager as kube-root-ca.crt;
// no kubeconfig is in the pod), enrolls with the broker (on the host's
// loopback), its GPU node appears in dry-run, and a train runs through it
// as a Job that asks for the spec's one GPU, to succeeded.
//
// The agent's image is the run image: it holds the agent binary (the
// conformance Job runs it) and is already in the cluster for the runs.
func TestE2EKubernetesAgentDeployment(t *testing.T) {
	c := k8stest.Require(t)
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	image := c.RunImage(t, filepath.Join(stack.Bin, "gpupass-agent"))
	ns := c.Namespace(t)
	cluster := "deploy-" + strings.TrimPrefix(ns, "gpupass-test-")

	// The agent's token, in the Secret the Deployment mounts (made
	// outside kustomize, so its nameSuffix leaves the name), from a
	// file: never in argv.
	var tok struct{ Agent string }
	b, err := os.ReadFile(filepath.Join(stack.State, "tokens.json"))
	if err == nil {
		err = json.Unmarshal(b, &tok)
	}
	if err != nil || tok.Agent == "" {
		t.Fatalf("reading the stack's agent token: %v", err)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(tok.Agent), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "-n", ns, "create", "secret", "generic", "gpupass-agent-token", "--from-file=token="+tokFile)

	// The shared hostPath, writable by the agent's user; this test's
	// files are under gpupass/CLUSTER there.
	if err := os.MkdirAll(localSharedDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(localSharedDir, agentUID, agentUID); err != nil {
		t.Fatal(err)
	}

	server, err := url.Parse(strings.TrimSpace(c.Kubectl(t, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")))
	if err != nil || server.Port() == "" {
		t.Fatalf("the cluster's apiserver URL: %v (%v)", server, err)
	}
	repo, digest, _ := strings.Cut(image, "@")
	// What a user's overlay (or values file) sets: namespace, image by
	// digest, broker, cluster name and region; here also the simulated
	// node's test settings. The run image has no entrypoint of the
	// agent's and root's HOME (read-only here).
	testEnv := func(region string) [][2]string {
		return [][2]string{
			{"GPUPASS_ZONE", region + "-a"}, {"GPUPASS_PYTHON", py}, {"GPUPASS_READ_PROBE_MB", "8"},
			{"GPUPASS_PRICE_PER_HOUR", "2.5"}, {"GPUPASS_STORAGE_CLASS", "standard"}, {"GPUPASS_BANDWIDTH_GBPS", "25"},
			{"GPUPASS_KUBE_REFRESH", "1s"}, {"GPUPASS_SUITE_INTERVAL", "2s"}, {"HOME", "/tmp"},
		}
	}
	// Each way a user installs the agent, one after the other on the one
	// node (each removes its agent and Jobs before the next), each as a
	// cluster and region of its own: the first agent's node is still
	// listed, offline, when the second's enrolls.
	installs := []struct {
		name string
		// install deploys the agent for cluster in region and returns
		// its Deployment and service account and how to remove it.
		install func(t *testing.T, cluster, region string) (deploy, sa string, remove func(context.Context))
	}{
		{"kubectl apply -k", func(t *testing.T, cluster, region string) (string, string, func(context.Context)) {
			dir := t.TempDir()
			rel, err := filepath.Rel(dir, filepath.Join(testutil.RepoRoot(t), "deploy", "kubernetes-local"))
			if err != nil {
				t.Fatal(err)
			}
			var env strings.Builder
			for _, e := range append([][2]string{{"KUBERNETES_SERVICE_PORT", server.Port()}, {"GPUPASS_BROKER_URL", cfg.BrokerURL},
				{"GPUPASS_KUBE_IMAGE", image}, {"GPUPASS_KUBE_CLUSTER", cluster}, {"GPUPASS_REGION", region}}, testEnv(region)...) {
				fmt.Fprintf(&env, "                  - {name: %s, value: %q}\n", e[0], e[1])
			}
			kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
nameSuffix: -%[1]s
resources:
  - %[2]s
images:
  - {name: ghcr.io/gpupass/gpupass-agent, newName: %[3]s, digest: %[4]s}
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: gpupass-agent}
      spec:
        template:
          spec:
            containers:
              - name: agent
                command: [%[5]s]
                env:
%[6]s`, ns, rel, repo, digest, k8stest.AgentPath, env.String())
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
				t.Fatal(err)
			}
			c.Kubectl(t, "apply", "-k", dir)
			return "deployment/gpupass-agent-" + ns, "gpupass-agent-" + ns, func(ctx context.Context) {
				_ = c.KubectlCmd(ctx, "delete", "-k", dir, "--ignore-not-found", "--wait=true").Run()
			}
		}},
		{"helm install", func(t *testing.T, cluster, region string) (string, string, func(context.Context)) {
			helm := testutil.Tool(t, "helm")
			chart := filepath.Join(testutil.RepoRoot(t), "deploy", "helm", "gpupass")
			extra := []map[string]string{{"name": "GPUPASS_QUERY_ADDR", "value": "127.0.0.1:0"}, {"name": "GPUPASS_SIMULATE", "value": "a100-80gb-4x"}}
			for _, e := range testEnv(region) {
				extra = append(extra, map[string]string{"name": e[0], "value": e[1]})
			}
			values, err := json.Marshal(map[string]any{
				"images": map[string]any{"agent": map[string]string{"repository": repo, "digest": digest}},
				"agent": map[string]any{
					"command": []string{k8stest.AgentPath}, "brokerURL": cfg.BrokerURL, "runImage": image,
					"cluster": cluster, "region": region, "apiServer": map[string]string{"port": server.Port()},
					"extraEnv": extra,
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			vf := filepath.Join(t.TempDir(), "values.json") // JSON is YAML
			if err := os.WriteFile(vf, values, 0o644); err != nil {
				t.Fatal(err)
			}
			helmCmd := func(ctx context.Context, args ...string) *exec.Cmd {
				return exec.CommandContext(ctx, helm, append([]string{"--kubeconfig", c.Kubeconfig, "--namespace", ns}, args...)...)
			}
			if out, err := helmCmd(ctx, "install", "gpupass", chart, "--values", filepath.Join(chart, "values-local.yaml"), "--values", vf).CombinedOutput(); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			return "deployment/gpupass-agent", "gpupass-agent", func(ctx context.Context) {
				_ = helmCmd(ctx, "uninstall", "gpupass", "--wait").Run()
			}
		}},
	}
	env := deployEnv{c: c, stack: stack, ns: ns, image: image, apiPort: server.Port(), py: py}
	for i, inst := range installs {
		t.Run(inst.name, func(t *testing.T) {
			cluster := fmt.Sprintf("%s-%d", cluster, i)
			region := fmt.Sprintf("k8s-in%d", i)
			t.Cleanup(func() { os.RemoveAll(filepath.Join(localSharedDir, "gpupass", cluster)) })
			deploy, sa, remove := inst.install(t, cluster, region)
			t.Cleanup(func() {
				// The agent first (it would make Jobs again), then its
				// Jobs, so that no pod of this test holds the node's GPUs
				// for the next.
				dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer dcancel()
				remove(dctx)
				_ = c.KubectlCmd(dctx, "-n", ns, "delete", "jobs", "--all", "--cascade=foreground", "--wait=true").Run()
			})
			checkDeployedAgent(t, ctx, env, deployedAgent{deploy: deploy, sa: sa, cluster: cluster, region: region})
		})
	}
}

// deployEnv is what every install of the agent in the test shares.
type deployEnv struct {
	c       *k8stest.Cluster
	stack   *upstack.Stack // the broker and the gpupass CLI
	ns      string         // the test's namespace
	image   string         // the run image by digest, also the agent's
	apiPort string         // the apiserver's port on loopback
	py      string         // the image's Python
}

// deployedAgent is one install of the agent's Deployment.
type deployedAgent struct {
	deploy, sa      string // "deployment/NAME" and its service account
	cluster, region string // what its node enrolls as
}

// checkDeployedAgent: the agent's Deployment runs with in-cluster config,
// its node is in dry-run, and a train runs through it.
func checkDeployedAgent(t *testing.T, ctx context.Context, e deployEnv, a deployedAgent) {
	c, stack, ns, image, apiPort, py := e.c, e.stack, e.ns, e.image, e.apiPort, e.py
	deploy, sa, cluster, region := a.deploy, a.sa, a.cluster, a.region
	diagnose := func() string {
		describe, _ := c.KubectlCmd(context.Background(), "-n", ns, "describe", "pods").CombinedOutput()
		logs, _ := c.KubectlCmd(context.Background(), "-n", ns, "logs", deploy, "--tail", "80").CombinedOutput()
		return fmt.Sprintf("pods:\n%s\nagent log:\n%s", upstack.Tail(string(describe), 4000), logs)
	}
	defer func() {
		if t.Failed() {
			t.Log(diagnose())
		}
	}()

	t.Run("the agent's pod runs with in-cluster config", func(t *testing.T) {
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
		defer wcancel()
		if out, err := c.KubectlCmd(wctx, "-n", ns, "wait", "--for=condition=Available", "--timeout=3m", deploy).CombinedOutput(); err != nil {
			t.Fatalf("%s not available: %v\n%s", deploy, err, out)
		}
		var pod struct {
			Spec struct {
				ServiceAccountName string
				HostNetwork        bool
				Containers         []struct {
					Image string
					Env   []struct{ Name string }
				}
				Volumes []struct {
					Name      string
					Projected *struct {
						Sources []json.RawMessage
					}
				}
			}
		}
		name := strings.TrimSpace(c.Kubectl(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/name=gpupass-agent", "-o", "jsonpath={.items[0].metadata.name}"))
		if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", ns, "get", "pod", name, "-o", "json")), &pod); err != nil {
			t.Fatal(err)
		}
		if pod.Spec.ServiceAccountName != sa {
			t.Errorf("the agent's pod runs as service account %q, want %q", pod.Spec.ServiceAccountName, sa)
		}
		if got := pod.Spec.Containers[0].Image; got != image {
			t.Errorf("the agent's image is %q, want %q (pinned by digest)", got, image)
		}
		for _, e := range pod.Spec.Containers[0].Env {
			if e.Name == "KUBECONFIG" {
				t.Errorf("the agent's pod has KUBECONFIG set: it must use its service account")
			}
		}
		// The service account's token volume (the admission plugin adds
		// it): the token, and the CA the controller-manager publishes.
		token := false
		for _, v := range pod.Spec.Volumes {
			if v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-") {
				for _, src := range v.Projected.Sources {
					token = token || strings.Contains(string(src), `"serviceAccountToken"`)
				}
			}
		}
		if !token {
			t.Errorf("the agent's pod has no service account token volume (kube-api-access-*)")
		}
		if ca := c.Kubectl(t, "-n", ns, "get", "configmap", "kube-root-ca.crt", "-o", "jsonpath={.data.ca\\.crt}"); !strings.Contains(ca, "BEGIN CERTIFICATE") {
			t.Errorf("no cluster CA in configmap kube-root-ca.crt (controller-manager --root-ca-file): %q", ca)
		}
		var log string
		upstack.WaitFor(t, wctx, "the agent's log to say how it reaches the apiserver", func() bool {
			log = c.Kubectl(t, "-n", ns, "logs", deploy)
			return strings.Contains(log, "kubernetes api:")
		})
		want := regexp.MustCompile(`kubernetes api: in-cluster config" server=https://127\.0\.0\.1:` + apiPort + ` token_file=/var/run/secrets/kubernetes.io/serviceaccount/token`)
		if !want.MatchString(log) {
			t.Errorf("the agent does not use in-cluster config with its service account token; log:\n%s", upstack.Tail(log, 3000))
		}
	})

	gp := func(args ...string) (string, error) {
		out, err := stack.Command(ctx, args...).CombinedOutput()
		return string(out), err
	}
	t.Run("its GPU node is in dry-run", func(t *testing.T) {
		var out string
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer wcancel()
		defer func() {
			if t.Failed() {
				t.Logf("last dry-run:\n%s", out)
			}
		}()
		listed := regexp.MustCompile(`kubernetes:` + cluster + ` +` + region + ` +a100-80gb x4 .*online, simulated`)
		upstack.WaitFor(t, wctx, "the in-cluster agent's node in dry-run", func() bool {
			out, _ = gp("validate", "--spec", "examples/train/gpupass.yaml", "--dry-run", "--region", region)
			return listed.MatchString(out)
		})
	})

	t.Run("train runs through it as a Job asking for the spec's GPUs", func(t *testing.T) {
		out, err := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", region, "--workdir", "examples/train",
			"--name", "k8s-deploy", "--follow", "--", py, "train.py", "--steps", "5")
		if err != nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(out, 4000))
		}
		for _, want := range []string{"kubernetes job gpupass-alloc-", "step 5 loss", "succeeded"} {
			if !strings.Contains(out, want) {
				t.Errorf("train --follow output lacks %q:\n%s", want, upstack.Tail(out, 4000))
			}
		}
		id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(out)
		got := c.Kubectl(t, "-n", ns, "get", "jobs", "-l", "gpupass.dev/alloc="+id,
			"-o", `jsonpath={.items[*].spec.template.spec.containers[0].resources.requests.nvidia\.com/gpu}`)
		if got != "1" {
			t.Errorf("the run's Job asks for %q %s, want 1 (the spec's resources.count)", got, k8stest.GPUResource)
		}
		// The pod ran as the agent (--kube-run-as's default for an agent
		// that is not root), so the agent can delete what the run wrote
		// when it prunes or clears work dirs; the image's user is root.
		checkOwnedByAgent(t, filepath.Join(localSharedDir, "gpupass", cluster), id)
	})
}

// checkOwnedByAgent: everything in the work dir of run id, under root,
// the pod's own files included, belongs to the agent's uid.
func checkOwnedByAgent(t *testing.T, root, id string) {
	t.Helper()
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == id {
			dirs = append(dirs, p)
			return filepath.SkipDir
		}
		return nil
	})
	if len(dirs) != 1 {
		t.Fatalf("found %d work dirs of %s under %s, want 1", len(dirs), id, root)
	}
	// The pod's own output files must be among what is checked, or the
	// walk proves nothing about what the pod wrote.
	podFiles := 0
	err := filepath.WalkDir(dirs[0], func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != agentUID {
			t.Errorf("%s belongs to uid %d, want %d (the agent's): the agent could not delete it", p, st.Uid, agentUID)
		}
		if m, _ := filepath.Match("attempt-*.out", d.Name()); m {
			podFiles++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if podFiles == 0 {
		t.Errorf("no attempt-*.out in %s: the pod's output files were not found, so nothing it wrote was checked", dirs[0])
	}
}
