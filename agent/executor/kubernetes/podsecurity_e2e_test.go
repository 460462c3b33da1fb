//go:build e2e

package kubernetes

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupass/gpupass/internal/testutil/k8stest"
)

// TestE2EPodSecurityRestricted asks the real cluster's Pod Security
// admission (server-side dry run, in a namespace that enforces the
// "restricted" level) about the pods the agent makes: with a shared claim
// and a non-root user they are admitted, as SECURITY.md tells sites to
// enforce; a hostPath shared dir is refused for its volume alone.
func TestE2EPodSecurityRestricted(t *testing.T) {
	c := k8stest.Require(t)
	ns := c.Namespace(t)
	c.Kubectl(t, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
	cfg, _, err := Config(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		claim  string
		runAs  *RunAs
		refuse []string // what admission names; nil: admitted
	}{
		{"a claim, the agent's uid", "gpupass-shared", &RunAs{UID: 65532, GID: 65532}, nil},
		{"a hostPath, the agent's uid", "", &RunAs{UID: 65532, GID: 65532}, []string{`violates PodSecurity "restricted:latest"`, `restricted volume type "hostPath"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &Client{API: api, Namespace: ns, Image: "gpupass.local/run@sha256:" + strings.Repeat("0", 64),
				Volume: SharedDir{Path: "/shared", Claim: tc.claim}, RunAs: tc.runAs}
			spec, err := cl.podSpec(c.NodeName, 1, time.Second, []string{"/shared/alloc-x"}, []string{"/bin/sh", "-c", "true"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = api.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpupass-psa"}, Spec: spec},
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if tc.refuse == nil {
				if err != nil {
					t.Fatalf("the pod is refused in a restricted namespace: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("admitted, want refused")
			}
			for _, w := range tc.refuse {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refused with %q, want it to name %q", err, w)
				}
			}
			// The volume, and nothing else the agent sets.
			for _, not := range []string{"allowPrivilegeEscalation", "capabilities", "seccompProfile", "runAsNonRoot"} {
				if strings.Contains(err.Error(), not) {
					t.Errorf("refused with %q, which names %s", err, not)
				}
			}
		})
	}
}
