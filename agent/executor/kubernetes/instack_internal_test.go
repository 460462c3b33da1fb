package kubernetes

import (
	"path/filepath"
	"testing"
)

// TestInStack: each region's agent of a gpupass up stack works under a
// shared dir of its own, so the regions' runs never share a work dir.
func TestInStack(t *testing.T) {
	t.Parallel()
	shared := t.TempDir()
	for _, region := range []string{"us-west-2", "eu-central-1"} {
		s := &Flags{SharedDir: shared}
		if err := inStack(s, t.TempDir(), region); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(shared, "up-"+region); s.SharedDir != want {
			t.Errorf("region %s: shared dir %s, want %s", region, s.SharedDir, want)
		}
	}
}
