package testutil

import (
	"os"
	"path/filepath"
	"strings"
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

// WantFiles checks that each file, a path under dir, holds each of its
// substrings (a step's outputs, summary and reports).
func WantFiles(t testing.TB, dir string, want map[string][]string) {
	t.Helper()
	for file, subs := range want {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		WantAll(t, file, string(b), subs)
	}
}

// WantAll checks that got, named what in a failure, holds each of want.
func WantAll(t testing.TB, what, got string, want []string) {
	t.Helper()
	for _, s := range want {
		if !strings.Contains(got, s) {
			t.Errorf("%s lacks %q:\n%s", what, s, got)
		}
	}
}
