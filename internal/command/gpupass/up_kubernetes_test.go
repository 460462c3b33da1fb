package gpupass

import (
	"slices"
	"strings"
	"testing"
)

// TestUpKubeArgs: --executor kubernetes gives each region's agent the
// kube flags the user set, as the agent's own, the stack's defaults of
// the others (namespace default, nodes read every 5s) and the stack's
// dir, under which the agent places the region's shared dir (by default
// in the stack's dir) and refuses a missing or unpinned image
// (kubernetes' TestInStack, and TestE2EUpExecutorErrors through the
// binaries); the stack's rules are up's, naming the flag.
func TestUpKubeArgs(t *testing.T) {
	t.Parallel()
	pinned := "gpupass.local/run@sha256:" + strings.Repeat("a", 64)
	shared := t.TempDir()
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
		want    []string // in order, somewhere in the argv
		not     []string
	}{
		{name: "kubernetes", args: []string{"--executor", "kubernetes", "--kubeconfig", "/k/admin.kubeconfig", "--kube-image", pinned, "--kube-shared-dir", shared},
			want: []string{"--executor", "kubernetes", "--stack-dir", "/state", "--simulate", "a100-80gb-4x", "--kube-image=" + pinned, "--kube-namespace=default", "--kube-refresh=5s", "--kube-shared-dir=" + shared, "--kubeconfig=/k/admin.kubeconfig"}},
		{name: "shared dir left to the agent's stack default", args: []string{"--executor", "kubernetes", "--kube-image", pinned},
			want: []string{"--kube-image=" + pinned}, not: []string{"--kubeconfig", "--kube-shared-dir"}},
		{name: "the user's namespace and refresh win", args: []string{"--executor", "kubernetes", "--kube-image", pinned, "--kube-namespace", "ml", "--kube-refresh", "1m"},
			want: []string{"--kube-namespace=ml", "--kube-refresh=1m0s"}, not: []string{"--kube-namespace=default", "--kube-refresh=5s"}},
		{name: "two agents per region", args: []string{"--executor", "kubernetes", "--kube-image", pinned, "--agents-per-region", "2"},
			wantErr: "--agents-per-region 2: with --executor kubernetes each region has one agent, which stands for every GPU node"},
		{name: "kube flags without kubernetes", args: []string{"--kube-image", pinned}, wantErr: "--kube-image needs --executor kubernetes"},
		{name: "kubeconfig with slurm", args: []string{"--executor", "slurm", "--slurm-shared-dir", shared, "--kubeconfig", "/k"}, wantErr: "--kubeconfig needs --executor kubernetes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args, err := upArgs(t, append([]string{"--profile", "a100-80gb-4x"}, tt.args...), nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("up %q = %v, want an error with %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			i := 0
			for _, a := range args {
				if i < len(tt.want) && a == tt.want[i] {
					i++
				}
			}
			if i != len(tt.want) {
				t.Errorf("args %q lack %q in order (matched %d)", args, tt.want, i)
			}
			for _, n := range tt.not {
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, n) }) {
					t.Errorf("args %q have %s", args, n)
				}
			}
		})
	}
}
