package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// WantFile checks that path holds exactly content with permission bits
// perm (following symlinks, as a reader of the file would).
func WantFile(t testing.TB, path, content string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content {
		t.Errorf("%s holds %q, want %q", filepath.Base(path), b, content)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != perm {
		t.Errorf("%s has mode %v, want %v", filepath.Base(path), fi.Mode().Perm(), perm)
	}
}
