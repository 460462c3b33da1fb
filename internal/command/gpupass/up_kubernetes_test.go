package gpupass

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/app/localstack"
)

// TestUpKubeArgs: --executor kubernetes gives each region's agent the
// kube flags, the image, the shared dir (under the state dir by default)
// and the stack's dir, under which the agent places the region's
// (kubernetes' TestInStack); bad combinations are refused naming the flag.
func TestUpKubeArgs(t *testing.T) {
	t.Parallel()
	pinned := "gpupass.local/run@sha256:" + strings.Repeat("a", 64)
	shared, state := t.TempDir(), t.TempDir()
	for _, tt := range []struct {
		name     string
		executor string
		kube     UpKube
		per      int
		wantErr  string
		want     []string // in order, somewhere in the argv
		not      []string
	}{
		{name: "kubernetes", executor: "kubernetes", kube: UpKube{Kubeconfig: "/k/admin.kubeconfig", Namespace: "default", Image: pinned, SharedDir: shared}, per: 1,
			want: []string{"--executor", "kubernetes", "--stack-dir", "/state", "--simulate", "a100-80gb-4x", "--kube-shared-dir", shared, "--kube-image", pinned, "--kube-namespace", "default", "--kubeconfig", "/k/admin.kubeconfig"}},
		{name: "shared dir defaults under the state dir", executor: "kubernetes", kube: UpKube{Namespace: "default", Image: pinned}, per: 1,
			want: []string{"--kube-shared-dir", state + "/kube-shared"}, not: []string{"--kubeconfig"}},
		{name: "no image", executor: "kubernetes", kube: UpKube{Namespace: "default"}, per: 1, wantErr: "--kube-image is required"},
		{name: "image by tag", executor: "kubernetes", kube: UpKube{Image: "gpupass.local/run:1"}, per: 1, wantErr: `--kube-image "gpupass.local/run:1": pin it by digest`},
		{name: "relative shared dir", executor: "kubernetes", kube: UpKube{Image: pinned, SharedDir: "scratch"}, per: 1, wantErr: `--kube-shared-dir "scratch"`},
		{name: "two agents per region", executor: "kubernetes", kube: UpKube{Image: pinned}, per: 2, wantErr: "--agents-per-region 2"},
		{name: "kube flags without kubernetes", executor: "local", kube: UpKube{Image: pinned}, per: 1, wantErr: "need --executor kubernetes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := &UpOptions{Slurm: UpSlurm{Executor: tt.executor}, Kube: tt.kube, Profile: "a100-80gb-4x", Python: "/usr/bin/python3"}
			err := o.Slurm.validate(tt.per)
			if err == nil {
				err = o.Kube.validate(tt.executor, tt.per, state)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			args, err := localstack.AgentArgs(localstack.Options{Executor: tt.executor, ExecutorArgs: o.Kube.args(tt.executor), Profile: o.Profile, Python: o.Python},
				"http://127.0.0.1:1", "k8s", "agent-k8s-1", "/state")
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
				if slices.Contains(args, n) {
					t.Errorf("args %q have %s", args, n)
				}
			}
		})
	}
}
