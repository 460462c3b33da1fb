//go:build !nokube

package agent

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubeFlagErrors: the --kube-* flags are checked before anything
// reaches the cluster or the broker, naming the flag and the fix; an
// image given by tag is refused.
func TestKubeFlagErrors(t *testing.T) {
	t.Parallel()
	base := []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "x", "--region", "r", "--executor", "kubernetes"}
	pinned := "localhost/run@sha256:" + strings.Repeat("a", 64)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no image", nil, "--kube-image is required with the kubernetes executor"},
		{"image by tag", []string{"--kube-image", "localhost/run:1"}, `--kube-image: image "localhost/run:1" is not pinned by digest`},
		{"no shared dir", []string{"--kube-image", pinned}, `--kube-shared-dir: give an absolute directory`},
		{"relative shared dir", []string{"--kube-image", pinned, "--kube-shared-dir", "shared"}, `--kube-shared-dir "shared": give an absolute directory`},
		{"refresh too short", []string{"--kube-image", pinned, "--kube-shared-dir", "/tmp", "--kube-refresh", "10ms"}, `--kube-refresh "10ms": must be at least 1s`},
		{"run-as not numbers", []string{"--kube-image", pinned, "--kube-shared-dir", "/tmp", "--kube-run-as", "nonroot"}, `--kube-run-as "nonroot": give UID:GID (numbers`},
		{"kubeconfig missing", []string{"--kube-image", pinned, "--kube-shared-dir", "/tmp", "--kubeconfig", "/nonexistent/kubeconfig"}, `--kubeconfig "/nonexistent/kubeconfig": `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errw bytes.Buffer
			code := Main(context.Background(), append(append(base, tt.args...), "--state-dir", filepath.Join(t.TempDir(), "s")), &out, &errw)
			if code == 0 || !strings.Contains(errw.String(), tt.want) {
				t.Errorf("exit %d stderr %q, want an error with %q", code, errw.String(), tt.want)
			}
		})
	}
}
