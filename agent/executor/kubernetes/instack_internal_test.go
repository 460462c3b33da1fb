package kubernetes

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestInStack: each region's agent of a gpupass up stack works under a
// shared dir of its own, so the regions' runs never share a work dir; by
// default under the stack's dir. A stack's agent without an image, or
// with a relative shared dir, is refused naming the setting (gpupass up
// shows the agent's error).
func TestInStack(t *testing.T) {
	t.Parallel()
	pinned := "gpupass.local/run@sha256:" + strings.Repeat("a", 64)
	shared, stack := t.TempDir(), t.TempDir()
	for _, region := range []string{"us-west-2", "eu-central-1"} {
		s := &Flags{SharedDir: shared, Image: pinned}
		if err := inStack(s, t.TempDir(), region); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(shared, "up-"+region); s.SharedDir != want {
			t.Errorf("region %s: shared dir %s, want %s", region, s.SharedDir, want)
		}
		s = &Flags{Image: pinned}
		if err := inStack(s, stack, region); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(stack, "kube-shared", "up-"+region); s.SharedDir != want {
			t.Errorf("region %s: default shared dir %s, want %s", region, s.SharedDir, want)
		}
	}
	for _, tt := range []struct {
		flags Flags
		want  string
	}{
		{Flags{}, "kubernetes run image is required with the kubernetes executor"},
		{Flags{}, "scripts/k8s-up.sh --run-image"},
		{Flags{Image: pinned, SharedDir: "scratch"}, `kubernetes shared dir "scratch": give an absolute directory`},
	} {
		if err := inStack(&tt.flags, stack, "r"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("inStack(%+v) = %v, want an error with %q", tt.flags, err, tt.want)
		}
	}
}
