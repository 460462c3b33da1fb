//go:build e2e

package kubernetes_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2EKubernetesUp: `gpupass up --executor kubernetes` with the
// cluster's KUBECONFIG and the run image brings up a broker and an agent
// standing for the cluster's GPU node; dry-run lists it, and train runs
// as a Job there to its end.
func TestE2EKubernetesUp(t *testing.T) {
	c := k8stest.Require(t)
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	image := c.RunImage(t, filepath.Join(upstack.BuildAll(t), "gpupass-agent"))
	ns := c.Namespace(t)
	stack := upstack.Start(t, upstack.Options{Regions: []string{"k8s-up"},
		Args: []string{"--executor", "kubernetes", "--kube-image", image, "--kube-namespace", ns},
		Env:  []string{"KUBECONFIG=" + c.Kubeconfig}})
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
