package slurm

import (
	"os"
	"path/filepath"
	"strings"
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

// TestInStackSharedDir: a stack's shared dir must be an absolute
// directory that is there: a mistyped one is refused, not made here,
// where no compute node sees it.
func TestInStackSharedDir(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "typo")
	for _, tt := range []struct{ dir, want string }{
		{"", `slurm shared dir: give an absolute directory`},
		{"scratch", `slurm shared dir "scratch": give an absolute directory`},
		{missing, `slurm shared dir "` + missing + `": not a directory here`},
	} {
		err := inStack(&Flags{SharedDir: tt.dir}, t.TempDir(), "r")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("inStack(%q) = %v, want an error with %q", tt.dir, err, tt.want)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("%s was made", missing)
	}
}
