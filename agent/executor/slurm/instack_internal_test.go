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
		b := Backend().(*backend)
		b.flags.SharedDir = shared
		if err := b.InStack(stack, region); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(shared, "up-"+region); b.flags.SharedDir != want {
			t.Errorf("region %s: shared dir %s, want %s", region, b.flags.SharedDir, want)
		}
		if st, err := os.Stat(b.flags.SharedDir); err != nil || !st.IsDir() {
			t.Errorf("region %s: shared dir not made: %v", region, err)
		}
		if want := filepath.Join(stack, "slurm-ledger"); b.flags.LedgerDir != want {
			t.Errorf("region %s: ledger %s, want the stack's %s", region, b.flags.LedgerDir, want)
		}
	}
}
