//go:build e2e

package kubernetes_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2EKubernetesUp: `scripts/k8s-up.sh --run-image` builds the
// default run image, loads it into the cluster and prints it pinned with
// the `gpupass up --executor kubernetes` line that uses it (issue #32
// item 7); that line, run as printed (plus the test's own namespace,
// port and state dir), brings up a broker and an agent standing for the
// cluster's GPU node; nodes names the node, dry-run lists it, and train
// runs as a Job there to its end.
func TestE2EKubernetesUp(t *testing.T) {
	c := k8stest.Require(t)
	py := upstack.RequireTorch(t)
	image, env, args := k8sUpRunImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if !strings.HasPrefix(image, k8stest.RunImageName+"@sha256:") || env != "KUBECONFIG="+c.Kubeconfig {
		t.Fatalf("k8s-up.sh --run-image printed image %q and %q, want %s@sha256:… and KUBECONFIG=%s", image, env, k8stest.RunImageName, c.Kubeconfig)
	}
	ns := c.Namespace(t)
	stack := upstack.Start(t, upstack.Options{Regions: []string{"k8s-up"},
		Args: append(args, "--kube-namespace", ns), Env: []string{env}})
	if !regexp.MustCompile(`agent +k8s-up .* a100-80gb x4 .* certified`).MatchString(stack.Out.String()) {
		t.Errorf("up does not show the kubernetes node certified:\n%s", stack.Out.String())
	}
	gp := func(args ...string) string {
		t.Helper()
		out, err := stack.Command(ctx, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("gpupass %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := gp("validate", "--spec", "examples/train/gpupass.yaml", "--dry-run", "--region", "k8s-up"); !regexp.MustCompile(`kubernetes:\S+ +k8s-up +a100-80gb x4 .*online, simulated`).MatchString(out) {
		t.Errorf("dry-run does not list the kubernetes node:\n%s", out)
	}
	// The agent's HOST is the Kubernetes node it stands for (issue #32 item 7).
	if out := gp("nodes"); !regexp.MustCompile(`(?m)^agt-[0-9a-f]+ +` + regexp.QuoteMeta(c.NodeName) + ` +kubernetes:`).MatchString(out) {
		t.Errorf("gpupass nodes does not show HOST %s for the cluster's node:\n%s", c.NodeName, out)
	}
	out := gp("train", "--spec", "examples/train/gpupass.yaml", "--region", "k8s-up", "--workdir", "examples/train",
		"--name", "k8s-up", "--follow", "--", py, "train.py", "--steps", "5")
	for _, want := range []string{"kubernetes job gpupass-alloc-", "step 5 loss", "succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("train --follow output lacks %q:\n%s", want, upstack.Tail(out, 4000))
		}
	}
}

// TestE2EKubernetesUpAgentFlags: every flag of the agent's Kubernetes
// executor is one of gpupass up's, taken from the executor (gpupass links
// none) and handed to the stack's agent: the up line k8s-up.sh prints,
// with --kube-cluster (up had no such flag before, issue #33), enrolls
// the node under the provider kubernetes:NAME that flag names.
func TestE2EKubernetesUpAgentFlags(t *testing.T) {
	c := k8stest.Require(t)
	_, env, args := k8sUpRunImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"k8s-flags"},
		Args: append(args, "--kube-namespace", c.Namespace(t), "--kube-cluster", "flags-test"), Env: []string{env}})
	var out string
	upstack.WaitFor(t, ctx, "the node under provider kubernetes:flags-test in gpupass nodes", func() bool {
		b, _ := stack.Command(ctx, "nodes").CombinedOutput()
		out = string(b)
		return regexp.MustCompile(`(?m)^agt-[0-9a-f]+ +` + regexp.QuoteMeta(c.NodeName) + ` +kubernetes:flags-test +k8s-flags `).MatchString(out)
	})
	if t.Failed() {
		t.Logf("gpupass nodes:\n%s", out)
	}
}

// k8sUpRunImage runs `scripts/k8s-up.sh --run-image` as a user would and
// returns the run image it printed on stdout (GPUPASS_K8S_RUN_IMAGE), and
// the line it printed to paste, `KUBECONFIG=… gpupass up ARGS`, as its
// assignment and ARGS. The line must use that image.
func k8sUpRunImage(t *testing.T) (image, env string, args []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testutil.RepoRoot(t), "scripts", "k8s-up.sh"), "--run-image")
	stdout, stderr, code := testutil.Run(t, cmd)
	if code != 0 {
		t.Fatalf("scripts/k8s-up.sh --run-image: exit %d\n%s\n%s", code, stdout, upstack.Tail(stderr, 4000))
	}
	for _, l := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(l, "GPUPASS_K8S_RUN_IMAGE="); ok {
			image = v
		}
	}
	for _, l := range strings.Split(stderr, "\n") {
		f := strings.Fields(strings.TrimPrefix(l, "k8s-up:"))
		if len(f) > 3 && strings.HasPrefix(f[0], "KUBECONFIG=") && f[1] == "gpupass" && f[2] == "up" {
			env, args = f[0], f[3:]
		}
	}
	if image == "" || env == "" || !strings.Contains(strings.Join(args, " "), "--kube-image "+image) {
		t.Fatalf("scripts/k8s-up.sh --run-image printed no run image and up line that uses it:\n%s\n%s", stdout, stderr)
	}
	return image, env, args
}
