package slurm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInStack: each region's agent of a gpupass up stack gets a shared
// dir of its own (made here: validate wants it to exist), and all of
// them one ledger in the stack's dir, or each would cancel the others'
// jobs as strays.
func TestInStack(t *testing.T) {
	t.Parallel()
	shared, stack := t.TempDir(), t.TempDir()
	for _, region := range []string{"us-west-2", "eu-central-1"} {
		s := &Flags{SharedDir: shared}
		if err := inStack(s, stack, region); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(shared, "up-"+region); s.SharedDir != want {
			t.Errorf("region %s: shared dir %s, want %s", region, s.SharedDir, want)
		}
		if st, err := os.Stat(s.SharedDir); err != nil || !st.IsDir() {
			t.Errorf("region %s: shared dir not made: %v", region, err)
		}
		if want := filepath.Join(stack, "slurm-ledger"); s.LedgerDir != want {
			t.Errorf("region %s: ledger %s, want the stack's %s", region, s.LedgerDir, want)
		}
	}
}
